"""Keeping the lake in shape once data is in: persist (ingester chunks into sorted Parquet files), compaction
(`compact/`: overlapping files into non-overlapping levels) and every sweep of what dead commands leave
(`sweeps.py`). Depends on ingest/, storage, catalog/ and the base modules."""

from __future__ import annotations
