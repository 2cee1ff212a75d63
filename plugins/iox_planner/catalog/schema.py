"""The catalog's tables, every one of them, as SQLAlchemy Core definitions: the Python side of `catalog_sql/`.

A test compares these definitions with the schema the migrations build, so a table defined anywhere else would go
unchecked. Changing a table means a new migration file and the matching change here."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from iox_planner.model import ChunkKind

metadata = sa.MetaData()

databases = sa.Table(
    "iox_database", metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True)),
    # Migration 0008: nanoseconds, NULL for none (catalog/retention.py).
    sa.Column("retention_ns", sa.BigInteger),
)
tables = sa.Table(
    "iox_table", metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("database_id", sa.BigInteger, nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True)),
    sa.Column("registered_by", sa.Text),  # migration 0007: the materialized query whose runs register it
    # Migration 0008: set when the table is dropped; only live tables (NULL) hold their name.
    sa.Column("dropped_at", sa.DateTime(timezone=True)),
)
columns = sa.Table(
    "iox_column", metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("table_id", sa.BigInteger, nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("column_type", sa.Text, nullable=False),
)
partitions = sa.Table(
    "iox_partition", metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("table_id", sa.BigInteger, nullable=False),
    sa.Column("partition_key", sa.Text, nullable=False),
    sa.Column("sort_key", pg.ARRAY(sa.Text)),
    sa.Column("created_at", sa.DateTime(timezone=True)),
)


def _chunk_table(name: str, *, parquet: bool) -> sa.Table:
    cols: list[sa.Column[Any]] = [
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("object_id", pg.UUID(as_uuid=False), nullable=False),
        sa.Column("label", sa.Text),
        sa.Column("table_id", sa.BigInteger, nullable=False),
        sa.Column("partition_id", sa.BigInteger, nullable=False),
        sa.Column("store", sa.Text, nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("min_time", sa.BigInteger, nullable=False),
        sa.Column("max_time", sa.BigInteger, nullable=False),
        sa.Column("row_count", sa.BigInteger, nullable=False),
        sa.Column("file_size", sa.BigInteger, nullable=False),
        sa.Column("column_names", pg.ARRAY(sa.Text), nullable=False),
        sa.Column("tag_ranges", pg.JSONB, nullable=False),
        sa.Column("chunk_order", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True)),
        sa.Column("to_delete", sa.DateTime(timezone=True)),
    ]
    if parquet:
        cols.append(sa.Column("sort_key", pg.ARRAY(sa.Text), nullable=False))
        # Migration 0005: 0 persisted (or loaded), 1 hot-compacted, 2 cold-compacted (see maintenance/compact/).
        cols.append(sa.Column("compaction_level", sa.SmallInteger, nullable=False, server_default="0"))
    return sa.Table(name, metadata, *cols)


parquet_files = _chunk_table("iox_parquet_file", parquet=True)
ingester_chunks = _chunk_table("iox_ingester_chunk", parquet=False)
query_runs = sa.Table(
    "iox_query_run", metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("database_name", sa.Text, nullable=False),
    sa.Column("definition", sa.Text),
    sa.Column("dag_id", sa.Text),
    sa.Column("run_id", sa.Text),
    sa.Column("interval_start", sa.BigInteger),
    sa.Column("interval_end", sa.BigInteger),
    sa.Column("params", pg.JSONB, nullable=False),
    sa.Column("plan", pg.JSONB),
    sa.Column("output", sa.Text),
    sa.Column("row_count", sa.BigInteger),
    sa.Column("status", sa.Text, nullable=False),
    sa.Column("error", sa.Text),
    sa.Column("started_at", sa.DateTime(timezone=True)),
    sa.Column("finished_at", sa.DateTime(timezone=True)),
    sa.Column("duration_s", sa.Float),
    sa.Column("changes_watermark", sa.Text),  # migration 0008: what a changes read handed on
)
migrations_table = sa.Table(
    "iox_schema_migration", metadata,
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("checksum", sa.Text, nullable=False),
    sa.Column("applied_at", sa.DateTime(timezone=True)),
)
# Run locks of scheduled and triggered runs (migration 0002; see catalog/runs.py).
run_locks = sa.Table(
    "iox_run_lock", metadata,
    sa.Column("definition", sa.Text, primary_key=True),
    sa.Column("interval_start", sa.BigInteger, primary_key=True),
    sa.Column("interval_end", sa.BigInteger, primary_key=True),
    sa.Column("holder", sa.Text, nullable=False),
    sa.Column("query_run_id", sa.BigInteger),
    sa.Column("acquired_at", sa.DateTime(timezone=True)),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
)

database_orders = sa.Table(
    "iox_database_order", metadata,
    sa.Column("database_id", sa.BigInteger, primary_key=True),
    sa.Column("last_order", sa.BigInteger, nullable=False),
)
output_publications = sa.Table(
    "iox_output_publication", metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("fingerprint", sa.Text, nullable=False),
    sa.Column("run", sa.Text, nullable=False),
    sa.Column("published_at", sa.DateTime(timezone=True)),
)
# Freshness of materialized intervals (catalog_sql/*_materialized_reads.sql; see catalog/freshness.py).
write_events = sa.Table(
    "iox_write_event", metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("database_id", sa.BigInteger, nullable=False),
    sa.Column("table_name", sa.Text, nullable=False),
    sa.Column("partition_key", sa.Text, nullable=False),
    sa.Column("write_order", sa.BigInteger, nullable=False),
    sa.Column("min_time", sa.BigInteger, nullable=False),
    sa.Column("max_time", sa.BigInteger, nullable=False),
    sa.Column("chunks", sa.Integer, nullable=False),
    sa.Column("row_count", sa.BigInteger, nullable=False),
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("written_at", sa.DateTime(timezone=True)),
)
write_hours = sa.Table(
    "iox_write_hour", metadata,
    sa.Column("database_id", sa.BigInteger, primary_key=True),
    sa.Column("table_name", sa.Text, primary_key=True),
    sa.Column("hour_start", sa.BigInteger, primary_key=True),
    sa.Column("max_order", sa.BigInteger, nullable=False),
)
database_drops = sa.Table(
    "iox_database_drop", metadata,
    sa.Column("database_id", sa.BigInteger, primary_key=True),
    sa.Column("database_name", sa.Text, nullable=False),
    sa.Column("dropped_at", sa.DateTime(timezone=True)),
)
materialized_reads = sa.Table(
    "iox_materialized_read", metadata,
    sa.Column("definition", sa.Text, primary_key=True),
    sa.Column("interval_start", sa.BigInteger, primary_key=True),
    sa.Column("interval_end", sa.BigInteger, primary_key=True),
    sa.Column("database_id", sa.BigInteger, primary_key=True),
    sa.Column("database_name", sa.Text, nullable=False),
    sa.Column("table_name", sa.Text, primary_key=True),
    sa.Column("watermark", sa.BigInteger, nullable=False),
    sa.Column("query_run_id", sa.BigInteger),
    sa.Column("recorded_at", sa.DateTime(timezone=True)),
)
# The life of data (migration 0008): dropped tables, changes reads' gaps, the catalog's identity.
table_drops = sa.Table(
    "iox_table_drop", metadata,
    sa.Column("table_id", sa.BigInteger, primary_key=True),
    sa.Column("database_id", sa.BigInteger, nullable=False),
    sa.Column("table_name", sa.Text, nullable=False),
    sa.Column("drop_order", sa.BigInteger, nullable=False),
    sa.Column("dropped_at", sa.DateTime(timezone=True)),
)
changes_gaps = sa.Table(
    "iox_changes_gap", metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("database_id", sa.BigInteger, nullable=False),
    sa.Column("from_order", sa.BigInteger, nullable=False),
    sa.Column("to_order", sa.BigInteger, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("recorded_at", sa.DateTime(timezone=True)),
)
catalog_identity = sa.Table(
    "iox_catalog_identity", metadata,
    sa.Column("singleton", sa.Boolean, primary_key=True),
    sa.Column("catalog_id", pg.UUID(as_uuid=False), nullable=False),
)
CHUNK_TABLES = {ChunkKind.PARQUET: parquet_files, ChunkKind.INGESTER: ingester_chunks}
