"""spark-submit entry point of a compaction batch (the `iox_compact` DAG's mapped task) or of `iox-batch compact`
under `IOX_RUNNER=spark-submit`.

    spark-submit run_compact.py --metrics REPORT.json --target DB=PARTITION_ID,PARTITION_ID ... [--target ...]
    spark-submit run_compact.py --metrics REPORT.json --db DB [--table TABLE] [--partition YYYY-MM-DD]

Compacts the listed partitions of each database (or whatever of one database, table or partition needs it) as
`iox_planner/maintenance/compact/batches.py` `compact_batch` does (each partition's compaction lock, one Spark job
for all slices of a database, one catalog transaction per partition) and writes the run's report (partitions,
files and rows in and out, duplicates removed, each partition's outcome) as JSON at `--metrics`, written aside and
renamed. Exit status 0 on success; on failure a one-paragraph `error: ...` on standard error and status 1 (75
when the catalog's Postgres was unreachable or dropped the connection: retry), with every swap not yet done left
undone (the catalog as it was for those partitions).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run_compact.py")
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--target", action="append")
    parser.add_argument("--db")
    parser.add_argument("--table")
    parser.add_argument("--partition")
    args = parser.parse_args(argv)
    if bool(args.target) == bool(args.db) or (args.target and (args.table or args.partition)):
        parser.error("give either --target DB=PARTITION_ID[,...] (repeatable) or --db DB [--table] [--partition]")
    from spark_jobs.errors import exit_status

    return exit_status(lambda: run(args))


def run(args: argparse.Namespace) -> int:
    from iox_planner.maintenance.compact.batches import compact_batch, parse_target
    from spark_jobs.compact_job import spark_slice_runner
    from spark_jobs.session import build_session

    targets: list[tuple[str, list[int] | None]] = (
        [(args.db, None)] if args.db else [parse_target(t) for t in args.target])
    if args.db:
        from iox_planner.catalog.names import check_db_name

        check_db_name(args.db)
    sessions: list[Any] = []

    def run_slices(tasks: Any, root: Any) -> Any:
        # Built on the first rewrite: a batch of promotions only starts no Spark session.
        if not sessions:
            sessions.append(build_session(app="iox-batch compact"))
        return spark_slice_runner(sessions[0])(tasks, root)

    compact_batch(targets, Path(args.metrics), run_slices, table=args.table, partition=args.partition)
    return 0


if __name__ == "__main__":
    sys.exit(main())
