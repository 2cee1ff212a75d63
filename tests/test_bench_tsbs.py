"""Smoke test of the TSBS benchmark's own parts (no Spark): every query type it times passes the planner, and its
answer check tells different answers apart. The benchmark itself (`make bench-tsbs`) runs them on Spark."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_spark import build  # noqa: E402
from bench_tsbs import difference, tsbs_queries  # noqa: E402

from iox_planner.catalog.store import Catalog, CatalogSource  # noqa: E402
from iox_planner.planner import plan_query  # noqa: E402

pytestmark = pytest.mark.slow


def test_every_tsbs_query_plans(catalog: Catalog, db: str) -> None:
    build(catalog, db, 8, 12, 600, 0.0)
    queries = tsbs_queries(8, 12, seed=1)
    assert {"single-groupby-1-1-1", "single-groupby-1-8-1", "cpu-max-all-8", "double-groupby-1", "high-cpu-all",
            "lastpoint", "groupby-orderby-limit"} <= set(queries)
    for name, sql in queries.items():
        plan = plan_query(sql, CatalogSource(catalog, db))
        assert plan.scans, name


def test_difference_tells_answers_apart() -> None:
    rows = [{"hostname": "host_1", "v": 1.0}, {"hostname": "host_2", "v": 2.0}]
    assert difference(rows[::-1], rows, ordered=False) is None
    assert difference(rows[::-1], rows, ordered=True) is not None
    assert difference([rows[0], {"hostname": "host_2", "v": 2.000001}], rows, ordered=True) is not None
    assert difference(rows[:1], rows, ordered=False) is not None
