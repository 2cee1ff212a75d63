"""Sliced dedup on Spark: the same random scenarios as `test_differential.py`, planned with a tiny
`max_dedup_rows_per_slice` so their overlap groups are cut into time slices, run under every dedup strategy and
compared with the independent reference of that module (which `test_differential.py` holds the unsliced plans
to).

`IOX_SLICE_CASES` sets how many seeded scenarios run (default 4 in CI); in CI each scenario runs under one
strategy, rotating; `IOX_SLICE_STRATEGIES=all` runs all four for each.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from iox_planner.catalog.store import Catalog
from iox_planner.planner import PlannerSettings
from iox_planner.planner.nodes import DeduplicateExec
from iox_planner.timeutil import format_time
from spark_support import load, plan, run_jsonl
from test_differential import _key, random_scenario, reference_rows

pytestmark = pytest.mark.spark

CASES = int(os.environ.get("IOX_SLICE_CASES", "4"))
STRATEGIES = ("arrow", "shared", "window", "node")


def _slices(catalog: Catalog, db: str, sql: str, settings: PlannerSettings) -> list[tuple[int, int]]:
    query_plan = plan(catalog, db, sql, settings=settings)
    return [n.time_slice for tree in query_plan.children for n in tree.walk()
            if isinstance(n, DeduplicateExec) and n.time_slice is not None]


@pytest.mark.parametrize("seed", range(CASES))
def test_sliced_equals_reference(spark: Any, catalog: Catalog, db: str, seed: int) -> None:
    # Seeds spaced apart from test_differential's, so the two suites see different scenarios.
    rng = random.Random(10_000 + seed)
    chunks, truth = random_scenario(rng)
    load(catalog, db, chunks)
    sql = "SELECT * FROM m"
    want = sorted(_key({**{k: v for k, v in r.items() if k != "time"}, "time": format_time(r["time"])})
                  for r in reference_rows(truth))
    sliced = PlannerSettings(max_dedup_rows_per_slice=2)
    assert len(_slices(catalog, db, sql, sliced)) >= 2  # the scenario is really cut (else this tests nothing)
    strategies = STRATEGIES if os.environ.get("IOX_SLICE_STRATEGIES") == "all" else (STRATEGIES[seed % 4],)
    for strategy in strategies:
        got = run_jsonl(spark, catalog, db, sql, strategy=strategy, settings=sliced)
        assert sorted(map(_key, got)) == want, (strategy, chunks)


def test_neighbour_nanoseconds_and_a_chunk_read_by_every_slice(spark: Any, catalog: Catalog, db: str) -> None:
    """One long Parquet chunk under a burst of rewrites at 1 ns neighbours: the slices cut between neighbours,
    the long chunk is read by each slice, and every strategy gives the rows worked out by hand."""
    base = 1_704_067_200_000_000_000
    old = "\n".join(f"m,h=a v={i}.0,w={i}i {base + i}" for i in range(12))
    new = "\n".join(f"m,h=a v={100 + i}.0 {base + i}" for i in range(3, 9))
    load(catalog, db, [{"id": "P1", "kind": "parquet", "order": 1, "lines": old},
                       {"id": "I2", "kind": "ingester", "order": 2, "lines": new}])
    settings = PlannerSettings(max_dedup_rows_per_slice=4)
    slices = _slices(catalog, db, "SELECT * FROM m", settings)
    assert len(slices) >= 3, slices
    assert all(a[1] + 1 == b[0] for a, b in zip(slices, slices[1:])), slices  # contiguous, cut at neighbours
    # Rows 3..8 were rewritten (v replaced, w kept: the last non-null value wins per column).
    want = sorted((format_time(base + i), float(100 + i) if 3 <= i <= 8 else float(i), i) for i in range(12))
    for strategy in STRATEGIES:
        rows = run_jsonl(spark, catalog, db, "SELECT v, w, time FROM m", strategy=strategy, settings=settings)
        assert sorted((r["time"], r["v"], r["w"]) for r in rows) == want, strategy
