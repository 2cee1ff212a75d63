"""Compaction benchmark on Spark: the TSBS-style cpu set with 10% and 50% of hours rewritten, queried before
compaction, compacted, queried after.

For each rewrite fraction it builds hourly Parquet files (L0) plus the rewritten hours (overlapping L0 files with
changed and omitted fields, as `bench_spark.py` builds them), plans the query, compacts the database
(`maintenance/compact/`, slices on the one SparkSession), plans the query again, and then times in one interleaved
run (variants taking turns, `--repeat` rounds after a warm-up round; the table shows each variant's median, and
each ratio as the median of the rounds' own ratios):
  - before:  the plan made before compaction (its files are retired but kept for the grace period, so it still
    runs), which deduplicates every overlapping group at query time;
  - after:   the plan over the compacted files (no dedup left);
  - scan:    a plain Spark scan of the compacted files (the same rows, no planner: the lower bound); before
    timing, the benchmark checks that Spark's physical plans of `after` and `scan` are the same operators over
    the same files and columns, so after/scan can only measure the planner's own (driver-side) cost;
  - compact: the whole compaction again (planning, the merge: a Spark job, or in the driver when the rows are
    few, `IOX_COMPACT_DRIVER_ROWS`; the catalog swap), on the same inputs: before each turn, untimed, the
    previous turn's outputs are retired (their files stay, for the `after` plan) and the inputs made live again, so
    every turn does the same work, warmed up as the queries are.
The query sums every field and counts rows (every column of every row is read); before and after must agree.
Hot compaction promotes the hourly files no late write overlaps to L1 in place (a catalog update) and rewrites the
rest. Its throughput is reported two ways: rows rewritten per second (the rewritten inputs' rows over the
compaction's time) and rows covered per second (rewritten plus promoted rows: every stored row is L1 afterwards).
Targets: after/scan <= 1.05x at both fractions; compaction rows/s at least the query-time dedup's (rows stored over
the `before` query's time): `rewritten/dedup` and `covered/dedup` are those ratios per round (medians), >= 1.00x
meets it; both run on the same `--master` cores, so the ratio is per core too. On a shared machine the wall times
grow with the other users' load; each variant's CPU seconds (this process, its Spark JVM and Python workers,
`tree_cpu_seconds`) do not: the `per cpu s` columns are rows per CPU second, the per-core figures. The load average is printed: on a shared
machine the ratios, taken from one interleaved run, are what to trust, not the seconds.

Run: `python benchmarks/bench_compact.py [--hosts 1000 --hours 24 --repeat 5]` (the defaults: about 9 M rows stored,
queries of several seconds, so a ratio is not a ratio of timer noise).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sqlalchemy as sa  # noqa: E402
from bench_spark import QUERY, build  # noqa: E402
from turns import interleaved, load_report, median_of, median_ratio, tree_cpu_seconds  # noqa: E402

from iox_planner.catalog.schema import parquet_files  # noqa: E402
from iox_planner.catalog.drops import drop_database  # noqa: E402
from iox_planner.catalog.store import Catalog, CatalogSource  # noqa: E402
from iox_planner.config import warehouse  # noqa: E402
from iox_planner.ingest import tsbs  # noqa: E402
from iox_planner.maintenance.compact.run import compact  # noqa: E402
from iox_planner.maintenance.compact.settings import CompactSettings  # noqa: E402
from iox_planner.planner import plan_query  # noqa: E402


def live_files(catalog: Catalog, db: str) -> set[int]:
    with catalog.engine.connect() as conn:
        db_id = catalog.database_id(conn, db)
        return {c.id for c in catalog.chunk_rows(conn, db_id) if c.path}


def undo_compaction(catalog: Catalog, inputs: set[int], outputs: set[int]) -> None:
    """The catalog as before a compaction, for the next timed one: its outputs retired (files kept), its inputs
    live again and L0 again (promoted files are inputs that stayed live)."""
    with catalog.engine.begin() as conn:
        conn.execute(parquet_files.update().where(parquet_files.c.id.in_(outputs - inputs))
                     .values(to_delete=sa.func.now()))
        conn.execute(parquet_files.update().where(parquet_files.c.id.in_(inputs))
                     .values(to_delete=None, compaction_level=0))


def scan_shape(df: Any) -> tuple[list[str], list[str], list[str]]:
    """What a query's physical plan reads and does: its operator tree (names only), each scan's read schema and
    the files read. `after` must equal `scan` on all three (same files, same columns, no extra step), so their
    ratio measures the planner's overhead and nothing else."""
    text = df._sc._jvm.PythonSQLUtils.explainString(df._jdf.queryExecution(), "formatted")
    tree = [re.sub(r"\s*\(\d+\)$", "", line) for line in text.split("\n\n\n")[0].splitlines()[1:]]
    schemas = [line for line in text.splitlines() if line.startswith("ReadSchema:")]
    return tree, schemas, sorted(df.inputFiles())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--interval", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--fractions", default="0.1,0.5")
    parser.add_argument("--master", default=os.environ.get("IOX_SPARK_MASTER", "local[2]"))
    args = parser.parse_args()
    console = Console(width=240)

    from spark_jobs.compact_job import spark_slice_runner
    from spark_jobs.execute import execute
    from spark_jobs.session import build_session

    catalog = Catalog()
    catalog.require_schema()
    spark = build_session(args.master, app="iox-batch bench compact", conf={"spark.driver.memory": "4g"})
    root = warehouse()
    # Start a Python worker before any timing: the queries' warm-up round pays theirs, compaction must not pay its.
    spark.sparkContext.parallelize([1], 1).map(lambda x: x).collect()
    load_start = os.getloadavg()
    report = Table(title=f"sum of 10 fields + count(*), {args.hosts} hosts x {args.hours} h, {args.interval} s "
                         f"samples, {args.master}; medians of {args.repeat} rounds")
    for col in ("rewritten", "rows stored", "rows after", "files before", "files after", "before s", "after s",
                "scan s", "after/scan", "before/scan", "files in/promoted", "compact s",
                "compact rows rewritten/s", "compact rows covered/s", "query dedup rows/s",
                "rewritten/dedup", "covered/dedup", "compact rows rewritten/cpu s", "query dedup rows/cpu s",
                "rewritten/dedup per cpu s"):
        report.add_column(col, justify="right")
    for fraction in [float(f) for f in args.fractions.split(",")]:
        db = f"bench_compact_{int(fraction * 100)}_{uuid.uuid4().hex[:6]}"
        started = time.perf_counter()
        stored = build(catalog, db, args.hosts, args.hours, args.interval, fraction)
        console.print(f"built {db}: {stored:,} rows in {time.perf_counter() - started:.1f} s")
        before = plan_query(QUERY, CatalogSource(catalog, db))
        files_before = sum(1 for c in before.chunks().values() if c.path)
        inputs = live_files(catalog, db)
        settings = CompactSettings.from_env()
        first = compact(catalog, db, spark_slice_runner(spark), settings=settings)
        after = plan_query(QUERY, CatalogSource(catalog, db))
        files = [str(root / c.path) for c in after.chunks().values() if c.path]
        dedups = sum(1 for tree in after.children for n in tree.walk() if n.name == "DeduplicateExec")

        def plan_frame(p: Any) -> Any:
            return execute(spark, p, root).result

        def scan_frame() -> Any:
            from pyspark.sql import functions as F

            df = spark.read.parquet(*files)
            return df.agg(F.count("*"), *[F.sum(f) for f in tsbs.FIELDS])

        def run_plan(p: Any) -> Any:
            return plan_frame(p).collect()[0]

        def scan() -> Any:
            return scan_frame().collect()[0]

        shape_after, shape_scan = scan_shape(plan_frame(after)), scan_shape(scan_frame())
        assert shape_after == shape_scan, f"after and scan differ:\n{shape_after}\n{shape_scan}"

        def recompact() -> Any:
            return compact(catalog, db, spark_slice_runner(spark), settings=settings).totals()

        variants: dict[str, Callable[[], Any]] = {"before": lambda: run_plan(before),
                                                  "after": lambda: run_plan(after), "scan": scan,
                                                  "compact": recompact}
        setup = {"compact": lambda: undo_compaction(catalog, inputs, live_files(catalog, db))}
        rounds, results = interleaved(variants, setup, args.repeat, cpu=tree_cpu_seconds)
        totals = results["compact"]
        assert totals == first.totals(), (totals, first.totals())
        r_before, r_after = results["before"], results["after"]
        assert r_before[0] == r_after[0] == results["scan"][0], results
        for a, b in zip(r_before[1:], r_after[1:]):
            assert abs(a - b) <= 1e-6 * max(1.0, abs(b)), (r_before, r_after)
        assert dedups == 0, f"{dedups} DeduplicateExec left after compaction"
        t_before, t_after, t_scan, t_compact = (median_of(rounds, n) for n in ("before", "after", "scan", "compact"))
        covered = totals["rows_in"] + totals["rows_promoted"]
        for i, r in enumerate(rounds):
            console.print(f"  {fraction:.0%} round {i + 1}: " + ", ".join(f"{n} {t:.2f} s" for n, t in r.items()
                                                                        if not n.endswith(" cpu"))
                          + "; cpu: " + ", ".join(f"{n} {t:.2f} s" for n, t in r.items() if n.endswith(" cpu")))
        report.add_row(f"{fraction:.0%}", f"{stored:,}", f"{r_after[0]:,}", str(files_before), str(len(files)),
                       f"{t_before:.2f}", f"{t_after:.2f}", f"{t_scan:.2f}", f"{median_ratio(rounds, 'after', 'scan'):.3f}x",
                       f"{median_ratio(rounds, 'before', 'scan'):.2f}x", f"{totals['files_in']}/{totals['files_promoted']}",
                       f"{t_compact:.2f}", f"{totals['rows_in'] / t_compact:,.0f}",
                       f"{covered / t_compact:,.0f}", f"{stored / t_before:,.0f}",
                       f"{totals['rows_in'] / stored * median_ratio(rounds, 'before', 'compact'):.2f}x",
                       f"{covered / stored * median_ratio(rounds, 'before', 'compact'):.2f}x",
                       f"{totals['rows_in'] / median_of(rounds, 'compact cpu'):,.0f}",
                       f"{stored / median_of(rounds, 'before cpu'):,.0f}",
                       f"{totals['rows_in'] / stored * median_ratio(rounds, 'before cpu', 'compact cpu'):.2f}x")
        console.print(f"  {fraction:.0%}: compacted {totals['partitions']} partition(s), {totals['files_in']} -> "
                      f"{totals['files_out']} files, {totals['files_promoted']} promoted in place, "
                      f"{totals['duplicates_removed']:,} duplicates removed in "
                      f"{t_compact:.2f} s; before {t_before:.2f} s, after {t_after:.2f} s, scan {t_scan:.2f} s")
        drop_database(catalog, db, root)  # the benchmark's own database: its rows and files go
    console.print(report)
    console.print(load_report(load_start))
    spark.stop()


if __name__ == "__main__":
    main()
