"""The Airflow assets iox-batch's maintenance DAGs share: a persist's request to compact the partitions it left
overlapping (`iox_persist` emits it, `iox_compact` runs on it as well as on its schedule)."""

from __future__ import annotations

from airflow.sdk import Asset

COMPACT_REQUEST = Asset(name="iox_compact_request", uri="iox://maintenance/compact-request", group="iox-batch")
"""An event's extra is `{"targets": {DB: [PARTITION_ID, ...]}}` (`compact.batches.request_extra`)."""
