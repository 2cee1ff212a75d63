"""Wide-overlap benchmark: a day of hosts in hourly files plus one late batch touching every hour, so the whole
day partition is one dedup group. Compares, in one run on one SparkSession, variants taking turns:
  - sliced:   this planner with `max_dedup_rows_per_slice` = --slice-rows (the group cut into time slices, each
              merged as its own Spark task);
  - unsliced: the same plan with slicing off (the whole day merged by one task);
  - naive:    the naive initial plan (one dedup over everything, groupBy);
  - scan:     a plain scan of the same files with no dedup (the lower bound; wrong where rows overlap).
The query sums every field and counts rows. Then, for sliced and unsliced, the largest task is run alone in a
fresh process (the same Arrow merge Spark's Python workers run) to report its input rows and its peak RSS above
the process's baseline. Targets: sliced at most 1.3x scan; no task above 1 GB.

Run: `python benchmarks/bench_wide_overlap.py [--hosts 100 --late-hosts 5 --slice-rows 200000 --repeat 2]`
(the issue's shape is 1,000 hosts: `--hosts 1000 --slice-rows 1000000 --skip-unsliced`, 8.6 M rows, the planner's default slice budget, which
takes long on a shared 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any, Callable

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.dirname(__file__))
from bench_spark import COLUMNS, QUERY, hour_table, interleaved, rewrite_of  # noqa: E402

from iox_planner.catalog.store import Catalog, CatalogSource  # noqa: E402
from iox_planner.config import warehouse  # noqa: E402
from iox_planner.ingest import tsbs  # noqa: E402
from iox_planner.ingest.write import write_table  # noqa: E402
from iox_planner.planner import PlannerSettings, plan_query  # noqa: E402
from iox_planner.planner.nodes import DeduplicateExec  # noqa: E402

import pyarrow as pa  # noqa: E402

TASK = r"""
import json, resource, sys
root, spec, schema, keys, types = json.loads(sys.stdin.read())
import pyarrow as pa
from spark_jobs.arrow_merge import merge_groups
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
batch = pa.record_batch([pa.array([0], pa.int64())], names=["id"])
rows = sum(b.num_rows for b in merge_groups(iter([batch]), root, [spec], schema, keys, types))
print(rows, pa.default_memory_pool().max_memory() // 1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def write_day(catalog: Catalog, db: str, hosts: int, late_hosts: int, interval_s: int) -> pa.Table:
    """A day of `hosts` in 24 hourly Parquet files, written; returns the late batch, not written: the first
    `late_hosts` hosts rewritten across the whole day (changed and omitted fields)."""
    rng = np.random.default_rng(7)
    walk = rng.uniform(0, 100, (hosts, len(tsbs.FIELDS)))
    late = []
    for hour in range(24):
        table = hour_table(rng, hosts, hour, interval_s, walk)
        write_table(catalog, db, "cpu", table, COLUMNS)
        late.append(table.filter(pa.array(np.isin(table["hostname"].to_numpy(zero_copy_only=False),
                                                   [tsbs.host_tags(h)["hostname"] for h in range(late_hosts)]))))
    return rewrite_of(rng, pa.concat_tables(late))


def build(catalog: Catalog, db: str, hosts: int, late_hosts: int, interval_s: int) -> int:
    late = write_day(catalog, db, hosts, late_hosts, interval_s)
    # The late batch: a few hosts rewritten across the whole day, one file spanning every hour.
    write_table(catalog, db, "cpu", late, COLUMNS)
    return hosts * 24 * 3600 // interval_s + late.num_rows


def largest_task(plan: Any, root: Any) -> tuple[int, int, int]:
    """Run the largest dedup group of the plan alone, as a Spark Python worker would: (rows out, peak Arrow
    memory KB, peak RSS KB of the whole worker process, Python and imports included)."""
    from spark_jobs.extract import group_inputs
    from iox_planner.planner.timebounds import time_bounds

    best = None
    for tree in plan.children:
        for node in tree.walk():
            if isinstance(node, DeduplicateExec):
                chunks, predicates = group_inputs(node.child)
                low, high = time_bounds(predicates)
                if node.time_slice:
                    low, high = node.time_slice
                lo, hi = low if low is not None else -2**63, high if high is not None else 2**63 - 1
                rows = sum((c.rows or 0) * max(0, min(hi, c.time_max) - max(lo, c.time_min) + 1)
                           // max(1, c.time_max - c.time_min + 1) for c in chunks)
                if best is None or rows > best[0]:
                    best = (rows, node, chunks, [low, high])
    assert best is not None
    _, node, chunks, bounds = best
    spec = json.dumps({"files": [[c.id, c.path, c.order, False, c.file_size] for c in chunks], "bounds": bounds})
    schema = [c for c in node.schema]
    keys = [s.column for s in node.sort_key]
    types = {n: COLUMNS[n].value for n in schema if n in COLUMNS}
    out = subprocess.run([sys.executable, "-c", TASK], input=json.dumps([str(root), spec, schema, keys, types]),
                         capture_output=True, text=True, check=True)
    rows, arrow_peak, rss_peak = map(int, out.stdout.split())
    return rows, arrow_peak, rss_peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--late-hosts", type=int, default=5)
    parser.add_argument("--interval", type=int, default=10)
    parser.add_argument("--slice-rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--master", default=os.environ.get("IOX_SPARK_MASTER", "local[2]"))
    parser.add_argument("--skip-unsliced", action="store_true",
                        help="leave out the unsliced variant (one task merging the whole day: at --hosts 1000 it "
                             "needs several GB in one Python worker and minutes per run)")
    parser.add_argument("--skip-naive", action="store_true",
                        help="leave out the naive variant (one groupBy over everything: about 30x a scan); the "
                             "sliced answer is then checked against nothing but itself")
    args = parser.parse_args()
    console = Console(width=200)

    from spark_jobs.execute import execute
    from spark_jobs.session import build_session

    catalog = Catalog()
    catalog.require_schema()
    spark = build_session(args.master, app="iox-batch bench wide overlap", conf={"spark.driver.memory": "4g"})
    root = warehouse()
    db = f"bench_wide_{uuid.uuid4().hex[:6]}"
    started = time.perf_counter()
    stored = build(catalog, db, args.hosts, args.late_hosts, args.interval)
    console.print(f"built {db}: {stored:,} rows in {time.perf_counter() - started:.1f} s")
    source = CatalogSource(catalog, db)
    sliced = plan_query(QUERY, source, settings=PlannerSettings(max_dedup_rows_per_slice=args.slice_rows))
    unsliced = plan_query(QUERY, source, settings=PlannerSettings(max_dedup_rows_per_slice=2**62))
    naive = plan_query(QUERY, source, optimize=False)
    files = [str(root / c.path) for c in sliced.chunks().values() if c.path]
    slices = sum(1 for t in sliced.children for n in t.walk() if isinstance(n, DeduplicateExec) and n.time_slice)

    def run_plan(p: Any, strategy: str = "arrow") -> Any:
        return execute(spark, p, root, strategy=strategy).result.collect()[0]

    def scan() -> Any:
        from pyspark.sql import functions as F

        df = spark.read.parquet(*files)
        return df.agg(F.count("*"), *[F.sum(f) for f in tsbs.FIELDS]).collect()[0]

    variants: dict[str, Callable[[], Any]] = {
        "sliced": lambda: run_plan(sliced),
        "unsliced": lambda: run_plan(unsliced),
        "naive": lambda: run_plan(naive, "node"),
        "scan": scan,
    }
    if args.skip_unsliced:
        del variants["unsliced"]
    if args.skip_naive:
        del variants["naive"]
    best, results = interleaved(variants, args.repeat)
    reference = "naive" if "naive" in variants else "sliced"
    assert all(results[name][0] == results[reference][0] for name in variants if name != "scan"), results
    for a, b in zip(results["sliced"][1:], results[reference][1:]):
        assert abs(a - b) <= 1e-6 * max(1.0, abs(b)), results
    tasks = {name: largest_task(p, root) for name, p in (("sliced", sliced), ("unsliced", unsliced))
             if name in variants}
    report = Table(title=f"wide overlap: {args.hosts} hosts x 24 h + {args.late_hosts} late hosts over the day, "
                         f"{stored:,} rows stored, {results['sliced'][0]:,} after dedup; {args.master}; "
                         f"best of {args.repeat}")
    for col in ("variant", "seconds", "x scan", "dedup tasks", "largest task rows out", "its peak Arrow MB",
                "its peak RSS MB"):
        report.add_column(col, justify="right")
    for name in variants:
        count = {"sliced": str(slices), "unsliced": "1", "naive": "1 (groupBy)", "scan": "-"}[name]
        task = [f"{tasks[name][0]:,}", f"{tasks[name][1] / 1024:.0f}", f"{tasks[name][2] / 1024:.0f}"] \
            if name in tasks else ["-", "-", "-"]
        report.add_row(name, f"{best[name]:.2f}", f"{best[name] / best['scan']:.2f}x", count, *task)
    console.print(report)
    spark.stop()


if __name__ == "__main__":
    main()
