"""Small readers for tests: what the catalog and the warehouse hold, read directly (not through the code under
test's own summaries)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import sqlalchemy as sa

from iox_planner.catalog import Catalog


def live_chunks(catalog: Catalog, db: str) -> list[dict[str, Any]]:
    """Every live chunk of a database, straight from the catalog tables."""
    out = []
    with catalog.engine.connect() as conn:
        for kind, table in (("parquet", "iox_parquet_file"), ("ingester", "iox_ingester_chunk")):
            rows = conn.execute(sa.text(
                f"SELECT c.*, t.name AS table_name, p.partition_key FROM {table} c "
                "JOIN iox_table t ON t.id = c.table_id JOIN iox_database d ON d.id = t.database_id "
                "JOIN iox_partition p ON p.id = c.partition_id "
                "WHERE d.name = :db AND c.to_delete IS NULL ORDER BY c.chunk_order, c.id"
            ).bindparams(db=db)).mappings()
            out.extend({**r, "kind": kind} for r in rows)
    out.sort(key=lambda r: (r["chunk_order"], r["kind"]))
    return out


def read_rows(path: Path, drop: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    table = pq.read_table(path)
    return [{k: v for k, v in row.items() if k not in drop} for row in table.to_pylist()]


def warehouse_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def catalog_counts(catalog: Catalog) -> dict[str, int]:
    with catalog.engine.connect() as conn:
        return {t: int(conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one())
                for t in ("iox_database", "iox_table", "iox_column", "iox_partition", "iox_parquet_file",
                          "iox_ingester_chunk")}


def env_without(*keys: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in keys}


def run_cli(*args: str, stdin: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed `iox-batch` as a user would."""
    exe = Path(sys.executable).parent / "iox-batch"
    return subprocess.run([str(exe), *args], input=stdin, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)
