"""The pass-through split on Spark (`spark_jobs/execute.py`): Spark's scan emits the base rows that meet no late
row, the Python workers merge the rest. The two halves must agree on every row (Spark's `may_meet_column` and the
workers' `dedup.may_meet`), and the answer must be the reference's whatever the scenario.

`IOX_PASS_THROUGH_SPARK_CASES` sets how many random scenarios run (default 4 in CI), each planned whole and sliced.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iox_planner.catalog.store import Catalog, CatalogSource
from iox_planner.ingest.dedup import may_meet
from iox_planner.model import ColumnType
from iox_planner.planner import PlannerSettings
from iox_planner.planner.nodes import DeduplicateExec
from iox_planner.timeutil import format_time
from spark_helpers import load, plan, run_jsonl, warehouse_path
from spark_jobs.execute import PassThrough, ScanBuilder, may_meet_column
from spark_jobs.extract import group_inputs
from test_differential import _key, random_scenario, reference_rows

pytestmark = pytest.mark.spark

CASES = int(os.environ.get("IOX_PASS_THROUGH_SPARK_CASES", "4"))
# Strings Spark and Arrow must compare alike: empty, accents composed and not, quotes, backticks, spaces.
VALUES = ["a", "b", "", "é", "e\u0301", "it's", "a`b", "x y", "A", None]


def test_spark_and_the_workers_agree_on_every_row(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import types as T

    rng = random.Random(3)
    checked = met = 0
    for case in range(12):
        rows = 200
        columns: dict[str, pa.Array] = {"id": pa.array(range(rows), pa.int64())}
        columns["h"] = pa.array([rng.choice(VALUES) for _ in range(rows)], pa.string())
        has_p = rng.random() < 0.7  # a file without tag p: p is NULL in every row
        if has_p:
            columns["p"] = pa.array([rng.choice(VALUES) for _ in range(rows)], pa.string())
        path = tmp_path / f"f{case}.parquet"
        pq.write_table(pa.table(columns), path, use_dictionary=rng.random() < 0.5)
        late_values = {name: sorted(set(rng.sample(VALUES, rng.randint(0, 4))), key=lambda v: (v is not None, v))
                       for name in ("h", "p") if rng.random() < 0.8}
        schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("h", T.StringType()),
                               T.StructField("p", T.StringType())])
        spark_passing = {r["id"] for r in spark.read.schema(schema).parquet(str(path))
                         .where(~may_meet_column(late_values)).select("id").collect()}
        table = pq.read_table(path, read_dictionary=["h"] if rng.random() < 0.5 else None)
        workers_merge = may_meet(table, late_values)
        workers_passing = {i for i, m in zip(table["id"].to_pylist(), workers_merge) if not m}
        assert spark_passing == workers_passing, (case, late_values)
        checked += rows
        met += int(workers_merge.sum())
    assert 0 < met < checked  # both halves were exercised


def _splits(catalog: Catalog, db: str, sql: str, settings: PlannerSettings | None = None) -> int:
    """How many dedup groups of the plan the executor splits with PassThrough.ALWAYS."""
    query_plan = plan(catalog, db, sql, settings=settings)
    count = 0
    for tree in query_plan.children:
        types = {n: t for c in tree.scanned_chunks() for n, t in c.columns.items()}
        builder = ScanBuilder(None, warehouse_path(), types, pass_through=PassThrough.ALWAYS)  # type: ignore[arg-type]
        for node in tree.walk():
            if isinstance(node, DeduplicateExec):
                chunks, _ = group_inputs(node.child)
                count += builder._pass_through_split(chunks, [s.column for s in node.sort_key]) is not None
    return count


def test_random_scenarios_split_and_give_the_reference_rows(spark: Any, catalog: Catalog, db: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOX_DEDUP_PASS_THROUGH", "always")
    split = 0
    for seed in range(CASES):
        rng = random.Random(20_000 + seed)
        chunks, truth = random_scenario(rng)
        name = f"{db}_{seed}"
        load(catalog, name, chunks)
        want = sorted(_key({**{k: v for k, v in r.items() if k != "time"}, "time": format_time(r["time"])})
                      for r in reference_rows(truth))
        for settings in (PlannerSettings(), PlannerSettings(max_dedup_rows_per_slice=2)):
            split += _splits(catalog, name, "SELECT * FROM m", settings)
            got = run_jsonl(spark, catalog, name, "SELECT * FROM m", strategy="arrow", settings=settings)
            assert sorted(map(_key, got)) == want, (seed, settings, chunks)
    assert split >= max(2, CASES // 2)  # the split really ran (else this compares the plain merge with itself)


def test_a_backfill_of_one_host_passes_every_other_row(spark: Any, catalog: Catalog, db: str) -> None:
    """Three hourly files of four hosts and one late file rewriting host b across all three hours (the shape of
    `benchmarks/bench_wide_overlap.py`): with the default setting the group is split, the late values are b's,
    and the answer is the one worked out by hand (b's late values win, other rows as written)."""
    hour = 3_600_000_000_000
    base = 1_704_067_200_000_000_000
    chunks = []
    for h in range(3):
        lines = "\n".join(f"cpu,host={host} v={h}.0,w={h} {base + h * hour + s}"
                          for host in "abcd" for s in (0, 1))
        chunks.append({"id": f"H{h}", "kind": "parquet", "order": h + 1, "lines": lines})
    late = "\n".join(f"cpu,host=b v=9{h}.0 {base + h * hour + 1}" for h in range(3))
    chunks.append({"id": "L", "kind": "parquet", "order": 9, "lines": late})
    load(catalog, db, chunks)
    query_plan = plan(catalog, db, "SELECT host, v, w, time FROM cpu")
    groups = [group_inputs(n.child)[0] for t in query_plan.children for n in t.walk()
              if isinstance(n, DeduplicateExec)]
    assert len(groups) == 1
    builder = ScanBuilder(spark, warehouse_path(), {"host": ColumnType.TAG, "time": ColumnType.TIME})
    split = builder._pass_through_split(groups[0], ["host", "time"])
    assert split is not None
    base_files, late_values = split
    assert sorted(groups[0][i].order for i in base_files) == [1, 2, 3] and late_values == {"host": ["b"]}
    rows = run_jsonl(spark, catalog, db, "SELECT host, v, w, time FROM cpu", strategy="arrow")
    got = sorted((r["host"], r["v"], r["w"], r["time"]) for r in rows)
    want = sorted((host, (90.0 + h) if (host == "b" and s == 1) else float(h), h, format_time(base + h * hour + s))
                  for h in range(3) for host in "abcd" for s in (0, 1))
    assert got == want
