"""Writing data into the lake: line protocol, writes and persist, Parquet files, the one Arrow IOx dedup,
registering results as catalog tables, scenarios and the TSBS generator. Depends on catalog/ and the base modules."""

from __future__ import annotations
