"""Read-once benchmark: a compaction task whose slices share a large input, the input decoded once for all of them
(`slices.compact_slices`) against once per slice (each slice's own filtered read, `slices.compact_slice` alone: how
every slice read its inputs before).

The shape: a day of `--hosts` hosts in 24 hourly Parquet files (the wide shape's generator, `bench_wide_overlap.py`),
then the whole day written again in one file (a backfill re-sending the day: every host, changed and omitted
fields). That file is sorted host first, so each of its row groups spans the day and a filter on a slice's time
range prunes none: read slice by slice, it is decoded once per slice. Compaction plans it as it would (the default
settings: at 1,000 hosts, 17.3 M rows in 9 slices of at most 2 M) and bundles the slices into one task per core
(`--cores`, as a Spark job on that many cores does); the benchmark runs each bundle as a Spark Python worker runs it,
in this process, one after the other. Variants take turns in each of `--repeat` rounds after a warm-up round:
  - read once:      `compact_slices` on each bundle;
  - slice by slice: `compact_slice` on each slice of each bundle.
Before timing, the two variants' outputs are checked equal, file by file. Figures: each variant's median wall and
CPU seconds, rows read per CPU second, and the medians of the rounds' own ratios (slice by slice over read once).

Run: `python benchmarks/bench_read_once.py [--hosts 1000 --repeat 3]` (`--hosts 100` is a smoke test: 1.7 M rows,
two slices, one per bundle, so the variants are the same work).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow.parquet as pq  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench_spark import COLUMNS  # noqa: E402
from bench_wide_overlap import write_day  # noqa: E402
from turns import interleaved, load_report, median_of, median_ratio, tree_cpu_seconds  # noqa: E402

from iox_planner.catalog.drops import drop_database  # noqa: E402
from iox_planner.catalog.store import Catalog  # noqa: E402
from iox_planner.config import warehouse  # noqa: E402
from iox_planner.ingest.write import write_table  # noqa: E402
from iox_planner.maintenance.compact.plan import PartitionPlan, dry_run  # noqa: E402
from iox_planner.maintenance.compact.slices import bundles, compact_slice, compact_slices, slice_tasks  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=1000, help="hosts of the day (1,000: 8.64 M rows a copy)")
    parser.add_argument("--interval", type=int, default=10)
    parser.add_argument("--cores", type=int, default=2, help="bundles: one per core, as a Spark job's")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    console = Console(width=200)
    catalog = Catalog()
    catalog.require_schema()
    root = warehouse()
    db = f"bench_once_{uuid.uuid4().hex[:6]}"
    load_start = os.getloadavg()
    try:
        started = time.perf_counter()
        replay = write_day(catalog, db, args.hosts, args.hosts, args.interval)
        write_table(catalog, db, "cpu", replay, COLUMNS)
        [plan] = dry_run(catalog, db)
        assert isinstance(plan, PartitionPlan)
        tasks = slice_tasks(plan)
        runs = bundles(tasks, args.cores)
        console.print(f"built {db} in {time.perf_counter() - started:.1f} s: 24 hourly files and a replay of the "
                      f"day, {plan.rows_in:,} rows in {len(tasks)} slices, {len(runs)} bundles of "
                      f"{', '.join(str(len(r)) for r in runs)} slices")

        def read_once() -> list[str]:
            return [r.output for run in runs for r in compact_slices(run, str(root)) if r.rows_out]

        def slice_by_slice() -> list[str]:
            return [r.output for run in runs for t in run for r in [compact_slice(t, str(root))] if r.rows_out]

        # Same outputs (each variant writes every slice's output path; read between the two).
        first = {p: pq.read_table(root / p) for p in read_once()}
        second = slice_by_slice()
        assert sorted(first) == sorted(second), "the variants wrote different slices"
        assert all(first[p].equals(pq.read_table(root / p)) for p in second), "the variants' outputs differ"
        del first

        variants = {"read once": read_once, "slice by slice": slice_by_slice}
        rounds, _ = interleaved(variants, {}, args.repeat, cpu=tree_cpu_seconds)
        table = Table(title=f"one compaction's merge of {plan.rows_in:,} rows, {len(tasks)} slices in {len(runs)} "
                            f"bundles, run in this process ({args.repeat} rounds after a warm-up)")
        for column in ("variant", "wall s", "cpu s", "rows read per cpu s"):
            table.add_column(column, justify="left" if column == "variant" else "right")
        for name in variants:
            cpu = median_of(rounds, f"{name} cpu")
            table.add_row(name, f"{median_of(rounds, name):.2f}", f"{cpu:.2f}", f"{plan.rows_in / cpu:,.0f}")
        console.print(table)
        console.print(f"slice by slice / read once: wall {median_ratio(rounds, 'slice by slice', 'read once'):.2f}x, "
                      f"cpu {median_ratio(rounds, 'slice by slice cpu', 'read once cpu'):.2f}x")
        console.print(load_report(load_start))
    finally:
        drop_database(catalog, db, root)  # its warehouse folder too, with the outputs written under it


if __name__ == "__main__":
    main()
