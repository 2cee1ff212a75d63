"""spark-submit entry point of a bulk load (`iox-batch write --spark` with `IOX_RUNNER=spark-submit`, and the
`iox_bulk_load` DAG).

    spark-submit run_bulk_load.py --db DB [--precision ns|us|ms|s] [--accept-partial] --report REPORT.json FILE|DIR

Loads FILE or DIR as `ingest/bulk.py` `bulk_write` does (one Spark task per byte range, one catalog transaction),
progress on standard error, and writes the chunks it registered as JSON at `--report` (written aside, renamed).
Exit status 0 on success; on failure a one-paragraph `error: ...` on standard error, status 1 (75: the catalog
was unreachable, retry), nothing registered.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from iox_planner.ingest.lineprotocol import Precision

    parser = argparse.ArgumentParser(prog="run_bulk_load.py")
    parser.add_argument("--db", required=True)
    parser.add_argument("--precision", choices=Precision.choices(), default=Precision.NS.value)
    parser.add_argument("--accept-partial", action="store_true")
    parser.add_argument("--report", required=True)
    parser.add_argument("--root", help="the folder the input must lie in (a triggered load's IOX_BULK_LOAD_ROOT); "
                                       "checked again here on what is opened, since the DAG's check ran earlier")
    parser.add_argument("source", metavar="FILE|DIR")
    args = parser.parse_args(argv)
    from spark_jobs.errors import exit_status

    return exit_status(lambda: run(args))


def run(args: argparse.Namespace) -> int:
    from iox_planner.catalog.store import Catalog
    from iox_planner.ingest.bulk import bulk_write
    from iox_planner.ingest.lineprotocol import Precision
    from spark_jobs.bulk_job import spark_range_runner
    from spark_jobs.session import build_session

    out = Path(args.report)
    out.unlink(missing_ok=True)  # a report of an earlier try must not stand for this one
    catalog = Catalog()
    catalog.require_schema()
    try:
        spark = build_session(app="iox-batch write --spark")
        result = bulk_write(catalog, args.db, args.source, spark_range_runner(spark),
                            precision=Precision(args.precision), accept_partial=args.accept_partial,
                            progress=lambda line: print(line, file=sys.stderr, flush=True),
                            min_ranges=spark.sparkContext.defaultParallelism,
                            input_root=Path(args.root) if args.root else None)
    finally:
        catalog.dispose()
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps({"chunks": [asdict(c) for c in result.chunks],
                               "rejected": [asdict(e) for e in result.rejected]}))
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
