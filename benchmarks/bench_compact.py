"""Compaction benchmark on Spark: the TSBS-style cpu set with 10% and 50% of hours rewritten, queried before
compaction, compacted, queried after.

For each rewrite fraction it builds hourly Parquet files (L0) plus the rewritten hours (overlapping L0 files with
changed and omitted fields, as `bench_spark.py` builds them), plans the query, compacts the database
(`ingest/compact.py`, slices on the one SparkSession), plans the query again, and then times in one interleaved
run (variants taking turns, best of `--repeat` after a warm-up round):
  - before: the plan made before compaction (its files are retired but kept for the grace period, so it still
    runs), which deduplicates every overlapping group at query time;
  - after:  the plan over the compacted files (no dedup left);
  - scan:   a plain Spark scan of the compacted files (the same rows, no planner: the lower bound).
The query sums every field and counts rows (every column of every row is read); before and after must agree.
Targets: after/scan <= 1.05x at both fractions; compaction rows/s (input rows over compaction wall time, Spark job
plus catalog swap) at least the query-time dedup's (rows stored over the `before` query's time).

Run: `python benchmarks/bench_compact.py [--hosts 50 --hours 24 --repeat 3]`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_spark import QUERY, build, interleaved  # noqa: E402

from iox_planner.catalog.store import Catalog, CatalogSource, drop_database  # noqa: E402
from iox_planner.config import warehouse  # noqa: E402
from iox_planner.ingest import tsbs  # noqa: E402
from iox_planner.ingest.compact import CompactSettings, compact  # noqa: E402
from iox_planner.planner import plan_query  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--interval", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fractions", default="0.1,0.5")
    parser.add_argument("--master", default=os.environ.get("IOX_SPARK_MASTER", "local[2]"))
    args = parser.parse_args()
    console = Console(width=200)

    from spark_jobs.compact_job import spark_slice_runner
    from spark_jobs.execute import execute
    from spark_jobs.session import build_session

    catalog = Catalog()
    catalog.require_schema()
    spark = build_session(args.master, app="iox-batch bench compact", conf={"spark.driver.memory": "4g"})
    root = warehouse()
    # Start a Python worker before any timing: the queries' warm-up round pays theirs, compaction must not pay its.
    spark.sparkContext.parallelize([1], 1).map(lambda x: x).collect()
    report = Table(title=f"sum of 10 fields + count(*), {args.hosts} hosts x {args.hours} h, {args.interval} s "
                         f"samples, {args.master}; best of {args.repeat}")
    for col in ("rewritten", "rows stored", "rows after", "files before", "files after", "before s", "after s",
                "scan s", "after/scan", "before/scan", "compact s", "compact rows/s", "query dedup rows/s"):
        report.add_column(col, justify="right")
    for fraction in [float(f) for f in args.fractions.split(",")]:
        db = f"bench_compact_{int(fraction * 100)}_{uuid.uuid4().hex[:6]}"
        started = time.perf_counter()
        stored = build(catalog, db, args.hosts, args.hours, args.interval, fraction)
        console.print(f"built {db}: {stored:,} rows in {time.perf_counter() - started:.1f} s")
        before = plan_query(QUERY, CatalogSource(catalog, db))
        files_before = sum(1 for c in before.chunks().values() if c.path)
        started = time.perf_counter()
        result = compact(catalog, db, spark_slice_runner(spark), settings=CompactSettings.from_env())
        t_compact = time.perf_counter() - started
        totals = result.totals()
        after = plan_query(QUERY, CatalogSource(catalog, db))
        files = [str(root / c.path) for c in after.chunks().values() if c.path]
        dedups = sum(1 for tree in after.children for n in tree.walk() if n.name == "DeduplicateExec")

        def run_plan(p: Any) -> Any:
            return execute(spark, p, root).result.collect()[0]

        def scan() -> Any:
            from pyspark.sql import functions as F

            df = spark.read.parquet(*files)
            return df.agg(F.count("*"), *[F.sum(f) for f in tsbs.FIELDS]).collect()[0]

        variants: dict[str, Callable[[], Any]] = {"before": lambda: run_plan(before),
                                                  "after": lambda: run_plan(after), "scan": scan}
        best, results = interleaved(variants, args.repeat)
        r_before, r_after = results["before"], results["after"]
        assert r_before[0] == r_after[0] == results["scan"][0], results
        for a, b in zip(r_before[1:], r_after[1:]):
            assert abs(a - b) <= 1e-6 * max(1.0, abs(b)), (r_before, r_after)
        assert dedups == 0, f"{dedups} DeduplicateExec left after compaction"
        t_before, t_after, t_scan = best["before"], best["after"], best["scan"]
        report.add_row(f"{fraction:.0%}", f"{stored:,}", f"{r_after[0]:,}", str(files_before), str(len(files)),
                       f"{t_before:.2f}", f"{t_after:.2f}", f"{t_scan:.2f}", f"{t_after / t_scan:.2f}x",
                       f"{t_before / t_scan:.2f}x", f"{t_compact:.2f}", f"{totals['rows_in'] / t_compact:,.0f}",
                       f"{stored / t_before:,.0f}")
        console.print(f"  {fraction:.0%}: compacted {totals['partitions']} partition(s), {totals['files_in']} -> "
                      f"{totals['files_out']} files, {totals['duplicates_removed']:,} duplicates removed in "
                      f"{t_compact:.2f} s; before {t_before:.2f} s, after {t_after:.2f} s, scan {t_scan:.2f} s")
        drop_database(catalog, db, root)  # the benchmark's own database: its rows and files go
    console.print(report)
    spark.stop()


if __name__ == "__main__":
    main()
