"""Prompt compaction from the CLI: `iox-batch persist --compact` compacts exactly the partitions the persist left
overlapping (real Spark, real Postgres), and leaves the others as the persist made them."""

from __future__ import annotations

from typing import Any

import pytest

import fuzz_support as fz
from common_support import live_chunks
from iox_planner.catalog.store import Catalog
from spark_support import cli, load, run_jsonl

pytestmark = pytest.mark.spark

T0, DAY = fz.T0, fz.DAY


def test_persist_compact_compacts_only_the_partitions_left_overlapping(spark: Any, catalog: Catalog,
                                                                       db: str) -> None:
    load(catalog, db, [
        # Day 1: a file, then a late write to it in the ingester: the persist's file overlaps the old one.
        {"id": "A", "kind": "parquet", "order": 1, "lines": f"m,t=a f=1 {T0}\nm,t=b f=1 {T0}"},
        {"id": "L", "kind": "ingester", "order": 2, "lines": f"m,t=a f=2 {T0}"},
        # Day 2: only new data: its file overlaps nothing (a promotion for the scheduled run, not a rewrite).
        {"id": "N", "kind": "ingester", "order": 3, "lines": f"m,t=c f=3 {T0 + DAY}"},
    ])
    result = cli("persist", "--db", db, "--compact")
    assert result.returncode == 0, result.stderr
    assert "compacting the 1 partition(s) the persist left overlapping" in result.stderr
    assert ("compacted 1 partition(s): 2 file(s) in, 1 out; 3 rows in, 2 out; 1 duplicates removed"
            in result.stdout), result.stdout
    levels = sorted((c["partition_key"], c["kind"], c.get("compaction_level")) for c in live_chunks(catalog, db))
    assert levels == [("2024-01-01", "parquet", 1), ("2024-01-02", "parquet", 0)], levels
    rows = run_jsonl(spark, catalog, db, "SELECT t, f FROM m ORDER BY t")
    assert [(r["t"], r["f"]) for r in rows] == [("a", 2.0), ("b", 1.0), ("c", 3.0)]


def test_persist_compact_with_nothing_overlapping_compacts_nothing(spark: Any, catalog: Catalog, db: str) -> None:
    load(catalog, db, [{"id": "N", "kind": "ingester", "order": 1, "lines": f"m,t=c f=3 {T0}"}])
    result = cli("persist", "--db", db, "--compact")
    assert result.returncode == 0, result.stderr
    assert "nothing to compact now" in result.stdout
    assert [c["compaction_level"] for c in live_chunks(catalog, db)] == [0]
