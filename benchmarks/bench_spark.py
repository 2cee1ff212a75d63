"""Dedup benchmark on Spark: this plan against a naive full dedup and a plain scan, on TSBS-style cpu data.

Builds three databases of hourly, sorted Parquet files (hosts x 10 s samples, ten float fields as clamped random
walks), where 0%, 10% and 50% of the hours were rewritten later (overlapping files with changed and omitted
fields). For each it times, in one run on one SparkSession:
  - plan:  this planner's optimized plan (dedup only inside overlapping groups), executed by spark_jobs;
  - plan (groupBy), plan (window): the same plan with the dedup groups run as one Spark groupBy (max_by over a
    packed write order) or with window functions, instead of merged in Python workers (mapInArrow);
  - naive: the naive initial plan (one dedup over everything, groupBy) with the same per-column semantics;
  - scan:  a plain scan with no dedup (the lower bound; wrong where rows overlap).
The query sums every field and counts rows, so every column of every row is read. Targets: at 10%, plan <= 1.2x
scan and >= 3x faster than naive; at 0%, plan <= 1.05x scan.

Run: `python benchmarks/bench_spark.py [--hosts 100 --hours 72 --repeat 3]`.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from typing import Any, Callable

import numpy as np
import pyarrow as pa
from rich.console import Console
from rich.table import Table

from iox_planner.ingest import tsbs
from iox_planner.catalog.store import Catalog, CatalogSource
from iox_planner.config import warehouse
from iox_planner.ingest.write import write_table
from iox_planner.model import TIME, ColumnType
from iox_planner.planner import plan_query

HOUR = 3_600_000_000_000
T0 = 1_704_067_200_000_000_000
COLUMNS = {**{t: ColumnType.TAG for t in tsbs.TAGS}, **{f: ColumnType.FLOAT for f in tsbs.FIELDS},
           TIME: ColumnType.TIME}
QUERY = "SELECT count(*) AS n, " + ", ".join(f"sum({f}) AS {f}" for f in tsbs.FIELDS) + " FROM cpu"


def hour_table(rng: np.random.Generator, hosts: int, hour: int, interval_s: int, walk: np.ndarray) -> pa.Table:
    """One hour of samples for every host; `walk` (hosts x fields) carries the random walks across hours."""
    steps = 3600 // interval_s
    times = T0 + hour * HOUR + np.arange(steps, dtype=np.int64) * interval_s * 1_000_000_000
    values = np.empty((hosts, steps, len(tsbs.FIELDS)))
    for s in range(steps):
        walk += rng.normal(0, 1, walk.shape)
        np.clip(walk, 0, 100, out=walk)
        values[:, s, :] = walk
    tags = [tsbs.host_tags(h) for h in range(hosts)]
    data: dict[str, Any] = {t: pa.array(np.repeat([tag[t] for tag in tags], steps)) for t in tsbs.TAGS}
    for i, f in enumerate(tsbs.FIELDS):
        data[f] = pa.array(values[:, :, i].reshape(-1))
    data[TIME] = pa.array(np.tile(times, hosts))
    return pa.table(data)


def rewrite_of(rng: np.random.Generator, table: pa.Table) -> pa.Table:
    """The same keys written again: each field changed, omitted (NULL) or kept, independently per value."""
    data = {name: table[name] for name in table.column_names}
    for f in tsbs.FIELDS:
        old = table[f].to_numpy()
        choice = rng.integers(0, 3, len(old))
        new = np.where(choice == 0, old + rng.normal(0, 5, len(old)), old)
        data[f] = pa.array(new, mask=choice == 1)
    return pa.table(data)


def build(catalog: Catalog, db: str, hosts: int, hours: int, interval_s: int, fraction: float) -> int:
    rng = np.random.default_rng(42)
    walk = rng.uniform(0, 100, (hosts, len(tsbs.FIELDS)))
    tables = []
    for hour in range(hours):
        table = hour_table(rng, hosts, hour, interval_s, walk)
        tables.append(table)
        write_table(catalog, db, "cpu", table, COLUMNS)
    rewritten = sorted(rng.choice(hours, size=round(fraction * hours), replace=False).tolist())
    for hour in rewritten:
        write_table(catalog, db, "cpu", rewrite_of(rng, tables[hour]), COLUMNS)
    return sum(t.num_rows for t in tables) + sum(tables[h].num_rows for h in rewritten)


def interleaved(variants: dict[str, Callable[[], Any]], repeat: int) -> tuple[dict[str, float], dict[str, Any]]:
    """Best time of each variant over `repeat` rounds, the variants taking turns in every round (after one
    warm-up round), so a burst of load on a shared machine hits all of them alike."""
    best = {name: float("inf") for name in variants}
    results: dict[str, Any] = {}
    for round_ in range(repeat + 1):
        for name, action in variants.items():
            started = time.perf_counter()
            results[name] = action()
            if round_:
                best[name] = min(best[name], time.perf_counter() - started)
    return best, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--hours", type=int, default=72)
    parser.add_argument("--interval", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fractions", default="0,0.1,0.5")
    parser.add_argument("--master", default=os.environ.get("IOX_SPARK_MASTER", "local[2]"))
    args = parser.parse_args()
    console = Console(width=200)

    from spark_jobs.execute import execute
    from spark_jobs.session import build_session

    catalog = Catalog()
    catalog.require_schema()
    spark = build_session(args.master, app="iox-batch bench", conf={"spark.driver.memory": "4g"})
    root = warehouse()
    report = Table(title=f"sum of 10 fields + count(*), {args.hosts} hosts x {args.hours} h, "
                         f"{args.interval} s samples, {args.master}; best of {args.repeat}")
    for col in ("rewritten", "rows stored", "rows after dedup", "dedup groups", "plan s", "plan (groupBy) s",
                "plan (window) s", "naive s", "scan s", "plan/scan", "naive/plan"):
        report.add_column(col, justify="right")
    for fraction in [float(f) for f in args.fractions.split(",")]:
        db = f"bench_{int(fraction * 100)}_{uuid.uuid4().hex[:6]}"
        started = time.perf_counter()
        stored = build(catalog, db, args.hosts, args.hours, args.interval, fraction)
        console.print(f"built {db}: {stored:,} rows in {time.perf_counter() - started:.1f} s")
        source = CatalogSource(catalog, db)
        optimized = plan_query(QUERY, source)
        naive = plan_query(QUERY, source, optimize=False)
        files = [str(root / c.path) for c in optimized.chunks().values() if c.path]

        def run_plan(p: Any, strategy: str = "arrow") -> Any:
            return execute(spark, p, root, strategy=strategy).result.collect()[0]

        def scan() -> Any:
            from pyspark.sql import functions as F

            df = spark.read.parquet(*files)
            return df.agg(F.count("*"), *[F.sum(f) for f in tsbs.FIELDS]).collect()[0]

        variants: dict[str, Callable[[], Any]] = {
            "plan": lambda: run_plan(optimized),
            "shared": lambda: run_plan(optimized, "shared"),
            "window": lambda: run_plan(optimized, "window"),
            "naive": lambda: run_plan(naive, "node"),
            "scan": scan,
        }
        best, results = interleaved(variants, args.repeat)
        t_plan, t_shared, t_window, t_naive, t_scan = (best[k] for k in ("plan", "shared", "window", "naive", "scan"))
        r_plan, r_shared, r_naive = results["plan"], results["shared"], results["naive"]
        assert r_plan[0] == r_naive[0] == r_shared[0] == results["window"][0], results
        for a, b in zip(r_plan[1:], r_naive[1:]):
            assert abs(a - b) <= 1e-6 * max(1.0, abs(b)), (r_plan, r_naive)
        dedups = sum(1 for tree in optimized.children for n in tree.walk() if n.name == "DeduplicateExec")
        report.add_row(f"{fraction:.0%}", f"{stored:,}", f"{r_plan[0]:,}", str(dedups), f"{t_plan:.2f}",
                       f"{t_shared:.2f}", f"{t_window:.2f}", f"{t_naive:.2f}", f"{t_scan:.2f}", f"{t_plan / t_scan:.2f}x",
                       f"{t_naive / t_plan:.1f}x")
        console.print(f"  {fraction:.0%}: plan {t_plan:.2f} s, groupBy split {t_shared:.2f} s, window split "
                      f"{t_window:.2f} s, naive {t_naive:.2f} s, scan {t_scan:.2f} s")
    console.print(report)
    spark.stop()


if __name__ == "__main__":
    main()
