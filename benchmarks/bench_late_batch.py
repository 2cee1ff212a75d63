"""Late-batch benchmark: a late batch lands on the wide shape; how long until queries are back within 1.05x a
plain scan, with compaction triggered the prompt way (what `iox-batch persist --compact` runs).

Builds the wide shape of `bench_wide_overlap.py` (its generator): `--hosts` hosts x 24 hourly Parquet files of 10 s
samples (1,000 hosts: 8.64 M rows), compacted once (the day is promoted to L1 in place, the steady state of
yesterday's data). Then, on the clock:
  1. the late batch lands: `--late-hosts` hosts rewritten across the whole day (changed and omitted fields), written
     as one ingester chunk (the clock starts when its write commits: from then on every query deduplicates it);
  2. persist, then compaction of exactly the partitions the persist left overlapping: the functions
     `iox-batch persist --compact` calls (`persist`, `left_overlapping`, then the compaction job's
     `compact_batch` on this process's SparkSession);
  3. the first query after compaction, as a user would run it (its time is shown, not counted; the session ran
     one query before the clock, so this is the cost of new files, not Spark's own first-query warm-up).
Queries are back within `--target` (1.05x) a plain scan when compaction commits, if the `after` state's
query/scan below is at most that: the time to recovery is the time from landing to that commit.
Then, in one interleaved run (variants taking turns, `--repeat` rounds after a warm-up round, medians of the rounds'
own ratios), the query in each state against a plain scan of that state's files (the lower bound; a scan of
overlapping files counts duplicates twice, so it is no answer, only a cost):
  - before:  the plan made before the batch landed (the clean day);
  - landed:  the plan made right after it landed (the day plus one ingester chunk);
  - overlap: the plan made after persist, before compaction (the day plus one L0 file spanning it: the wide overlap);
  - after:   the plan made after compaction.
The earlier plans still run: the files compaction and persist retired are kept for the grace period. The query sums
every field and counts rows; the `landed` and `overlap` answers are checked against the `after` one (the late
batch's values win), and `after`'s and `before`'s against their scans (duplicate-free files), before any figure is
printed.

Run: `python benchmarks/bench_late_batch.py [--hosts 1000 --late-hosts 5 --repeat 3]` (`make bench-late-batch`;
`--hosts 20` is a smoke test of a minute or two). At 1,000 hosts it needs several minutes on 2 shared cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from turns import interleaved, load_report, median_of, median_ratio  # noqa: E402
from bench_persist import _ingester  # noqa: E402
from bench_spark import COLUMNS, QUERY  # noqa: E402
from bench_wide_overlap import write_day  # noqa: E402

from iox_planner.catalog.drops import drop_database  # noqa: E402
from iox_planner.catalog.store import Catalog, CatalogSource  # noqa: E402
from iox_planner.config import warehouse  # noqa: E402
from iox_planner.ingest import tsbs  # noqa: E402
from iox_planner.ingest.write import write_table  # noqa: E402
from iox_planner.maintenance.compact.batches import compact_batch  # noqa: E402
from iox_planner.maintenance.compact.plan import left_overlapping  # noqa: E402
from iox_planner.maintenance.compact.run import compact  # noqa: E402
from iox_planner.maintenance.persist import persist  # noqa: E402
from iox_planner.model import ChunkKind  # noqa: E402
from iox_planner.planner import plan_query  # noqa: E402
from iox_planner.planner.nodes import QueryPlan  # noqa: E402

STATES = ("before", "landed", "overlap", "after")


def same_answer(a: Any, b: Any) -> bool:
    """count(*) equal, every sum equal up to the float summation order."""
    return a[0] == b[0] and all(abs(x - y) <= 1e-6 * max(1.0, abs(y)) for x, y in zip(a[1:], b[1:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=1000, help="hosts of the day (1,000: 8.64 M rows; 20: smoke)")
    parser.add_argument("--late-hosts", type=int, default=5)
    parser.add_argument("--interval", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--target", type=float, default=1.05, help="query/scan ratio that counts as recovered")
    parser.add_argument("--master", default=os.environ.get("IOX_SPARK_MASTER", "local[2]"))
    args = parser.parse_args()
    if not 1 <= args.late_hosts <= args.hosts:
        parser.error("--late-hosts must be between 1 and --hosts")
    console = Console(width=200)

    from pyspark.sql import functions as F

    from spark_jobs.compact_job import spark_slice_runner
    from spark_jobs.execute import execute
    from spark_jobs.session import build_session

    catalog = Catalog()
    catalog.require_schema()
    spark = build_session(args.master, app="iox-batch bench late batch", conf={"spark.driver.memory": "4g"})
    # A Python worker before any timing: compaction's slices run in one, the first query must not pay for it.
    spark.sparkContext.parallelize([1], 1).map(lambda x: x).collect()
    root = warehouse()
    db = f"bench_late_{uuid.uuid4().hex[:6]}"
    load_start = os.getloadavg()

    started = time.perf_counter()
    late = write_day(catalog, db, args.hosts, args.late_hosts, args.interval)
    compact(catalog, db, spark_slice_runner(spark))  # yesterday's day, compacted: its hourly files become L1
    console.print(f"built {db}: {args.hosts} hosts x 24 h, {args.hosts * 24 * 3600 // args.interval:,} rows in "
                  f"{time.perf_counter() - started:.1f} s; the late batch: {late.num_rows:,} rows of "
                  f"{args.late_hosts} host(s) across the day")

    def plan_now() -> QueryPlan:
        return plan_query(QUERY, CatalogSource(catalog, db))

    def files_of(p: QueryPlan) -> list[str]:
        return [str(root / c.path) for c in p.chunks().values() if c.path]

    def run_plan(p: QueryPlan) -> Any:
        return execute(spark, p, root).result.collect()[0]

    def scan(files: list[str]) -> Any:
        return spark.read.parquet(*files).agg(F.count("*"), *[F.sum(f) for f in tsbs.FIELDS]).collect()[0]

    plans: dict[str, QueryPlan] = {"before": plan_now()}
    # The session's first query pays for Spark's own warm-up (classes, code generation), whatever files it reads:
    # run one before the clock, so the first query after compaction shows what new files cost.
    warm = time.perf_counter()
    run_plan(plans["before"])
    console.print(f"the session's first query (before the late batch, untimed): {time.perf_counter() - warm:.2f} s")
    ingester = _ingester(late)
    write_started = time.perf_counter()
    write_table(catalog, db, "cpu", ingester, COLUMNS, kind=ChunkKind.INGESTER)
    landed = time.perf_counter()  # the clock: the late batch is visible to queries from here on
    timeline = [("write of the late batch (before the clock)", landed - write_started)]
    plans["landed"] = plan_now()
    persisted = persist(catalog, db)
    overlapping = left_overlapping(catalog, db, [r.partition_id for r in persisted])
    timeline.append(("persist", time.perf_counter() - landed))
    plans["overlap"] = plan_now()
    report = compact_batch([(db, overlapping)], spark_slice_runner(spark),
                           progress=lambda _db, line: console.print(f"  compact: {line}", markup=False))
    compacted = time.perf_counter() - landed
    timeline.append((f"compaction of {len(overlapping)} partition(s): {report['files_in']} files, "
                     f"{report['rows_in']:,} rows rewritten", compacted))
    plans["after"] = plan_now()
    after_files = files_of(plans["after"])

    # The first query after compaction, as a user would run it (cold: new files).
    first = time.perf_counter()
    run_plan(plans["after"])
    first_query = time.perf_counter() - first
    timeline.append((f"the first query after compaction ({first_query:.2f} s) ended", time.perf_counter() - landed))

    files = {name: files_of(p) for name, p in plans.items()}
    variants: dict[str, Callable[[], Any]] = {}
    for name in STATES:
        variants[name] = (lambda p: lambda: run_plan(p))(plans[name])
        variants[f"scan {name}"] = (lambda f: lambda: scan(f))(files[name])
    rounds, results = interleaved(variants, {}, args.repeat)
    for name in ("landed", "overlap"):  # the late batch's values win wherever it wrote one
        assert same_answer(results[name], results["after"]), (name, results[name], results["after"])
    for name in ("before", "after"):  # duplicate-free files: the scan's answer is the answer
        assert same_answer(results[f"scan {name}"], results[name]), (name, results)

    recovered = median_ratio(rounds, "after", "scan after") <= args.target
    table = Table(title=f"a late batch on the wide shape: {args.hosts} hosts x 24 h ({results['before'][0]:,} rows), "
                        f"{late.num_rows:,} late rows of {args.late_hosts} host(s) across the day; {args.master}")
    table.add_column("seconds after the late batch landed", justify="right")
    table.add_column("step")
    for step, seconds in timeline:
        table.add_row(f"{seconds:.2f}", step)
    console.print(table)
    verdict = (f"queries back within {args.target}x a plain scan {compacted:.2f} s after the late batch landed "
               "(when compaction committed: every query planned from then on reads the compacted files)"
               if recovered else f"queries NOT back within {args.target}x a plain scan after compaction")
    console.print(verdict)
    states = Table(title=f"the query (sum of 10 fields + count(*)) in each state against a plain scan of that "
                         f"state's files; medians of {args.repeat} rounds taking turns")
    for col in ("state", "files", "query s", "scan s", "query/scan"):
        states.add_column(col, justify="right")
    for name in STATES:
        states.add_row(name, str(len(files[name])), f"{median_of(rounds, name):.2f}",
                       f"{median_of(rounds, f'scan {name}'):.2f}",
                       f"{median_ratio(rounds, name, f'scan {name}'):.3f}x")
    console.print(states)
    console.print(load_report(load_start))
    drop_database(catalog, db, root)
    spark.stop()


if __name__ == "__main__":
    main()
