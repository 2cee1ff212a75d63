"""spark-submit entry point of a fanned-out plan (see plugins/iox_planner/planner/fanout.py).

    spark-submit run_parts.py part  --plan part-0.json --warehouse DIR --output PARTS/0 --metrics m.json
    spark-submit run_parts.py merge --plan plan.json --warehouse DIR --parts PARTS --format jsonl --output OUT \
                                    --metrics m.json

`part` evaluates the scan trees of a part plan (the deduplication happens here) and writes each scan's rows, time
still int64 nanoseconds, as Parquet under `OUTPUT/<view>/`. `merge` reads every part of every scan back as that
scan's view and runs the query's SQL over them, writing the result like `spark_jobs/run_plan.py` does (csv, jsonl,
parquet, or arrow for the commit step to convert). Each takes the query's budget, `--timeout-s N` (see
run_plan.py). Exit status 0 on success; on failure a one-paragraph `error: ...` on standard error and status 1
(124: past its budget), with nothing written at `--output`.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    from iox_planner.output import JOB_FORMATS

    parser = argparse.ArgumentParser(prog="run_parts.py")
    parser.add_argument("mode", choices=["part", "merge"])
    parser.add_argument("--plan", required=True)
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--parts", help="merge: the folder holding every part's output")
    parser.add_argument("--format", default="parquet", choices=[f.value for f in JOB_FORMATS])
    from spark_jobs.run_plan import add_timeout_arg, run_job

    add_timeout_arg(parser)
    args = parser.parse_args(argv)

    return run_job(args.plan, f"iox-batch {args.mode}",
                   lambda spark, plan: run_part(spark, plan, args) if args.mode == "part"
                   else run_merge(spark, plan, args), args.metrics, args.timeout_s)


def run_part(spark: Any, plan: Any, args: argparse.Namespace) -> int:
    """Each scan's rows of this part, written aside and then moved into place (a retry starts from nothing)."""
    from pyspark.sql import functions as F

    from spark_jobs.execute import ScanBuilder

    output = Path(args.output)
    tmp = output.with_name(f".{output.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(output, ignore_errors=True)
    rows = 0
    for scan, tree in zip(plan.scans, plan.children):
        columns = {name: ctype for chunk in tree.scanned_chunks() for name, ctype in chunk.columns.items()}
        columns.update(scan.columns)
        df = ScanBuilder(spark, Path(args.warehouse), columns).build(tree)
        # Exactly the scan tree's columns, in its order: what run_merge reads back with the scan's types.
        df = df.select(*[F.col("`" + c.replace("`", "``") + "`") for c in tree.schema])
        df.write.parquet(str(tmp / scan.view))
        rows += spark.read.parquet(str(tmp / scan.view)).count()
    tmp.rename(output)
    return rows


def run_merge(spark: Any, plan: Any, args: argparse.Namespace) -> int:
    """The query's SQL over the parts: each scan's view is the union of its parts."""
    from pyspark.sql import types as T

    from iox_planner.model import CHUNK_ORDER, TIME
    from spark_jobs.execute import register_view, run_query_sql
    from spark_jobs.load import write_result
    from spark_jobs.transform import file_type

    if not args.parts:
        raise SystemExit("merge needs --parts")
    parts = sorted(p for p in Path(args.parts).iterdir() if p.is_dir() and not p.name.startswith("."))
    for scan, tree in zip(plan.scans, plan.children):
        types = dict(scan.columns)
        schema = T.StructType([
            T.StructField(name, T.LongType() if name == CHUNK_ORDER else file_type(types[name]), name != TIME)
            for name in tree.schema
        ])
        folders = [str(p / scan.view) for p in parts if (p / scan.view).is_dir()]
        df = spark.read.schema(schema).parquet(*folders) if folders else spark.createDataFrame([], schema)
        register_view(df, scan.view)
    return write_result(run_query_sql(spark, plan), args.format, Path(args.output), sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
