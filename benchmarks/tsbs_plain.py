"""The plain scan `bench_tsbs.py` measures iox-batch against: a query's Spark SQL over a view `cpu` of Parquet files
read as they are (no catalog, no planner, no dedup), `time` shown as the product shows it (`transform.to_view`).

`plain_view` is the in-session variant; run as a script it is the whole-process one, the counterpart of one
`iox-batch query --format parquet --output PATH`: a SparkSession built as the product's jobs build theirs, the view,
the query, the result written as Parquet by Spark.

Run: `python benchmarks/tsbs_plain.py --files LIST --output PATH --sql-file QUERY` (LIST: one file path a line).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

from iox_planner.ingest import tsbs
from iox_planner.model import TIME

# The columns `SELECT *` shows from iox-batch: tags, then fields, each in name order, then `time`.
COLUMNS = [*sorted(tsbs.TAGS), *sorted(tsbs.FIELDS), TIME]
NS_COLUMN = "__bench_time_ns"


def plain_view(spark: Any, files: Sequence[str], view: str = "cpu") -> None:
    """Register `view` over `files`: the table's columns only (files also carry internal ones), `time` as the
    product's views show it."""
    from spark_jobs.transform import to_view

    df = spark.read.parquet(*files).select(*COLUMNS)
    to_view(df, NS_COLUMN).drop(NS_COLUMN).createOrReplaceTempView(view)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=Path, required=True, help="a text file: one Parquet file path a line")
    parser.add_argument("--output", required=True, help="the result's Parquet folder (must not exist)")
    parser.add_argument("--sql-file", type=Path, required=True)
    args = parser.parse_args()

    from spark_jobs.session import build_session

    spark = build_session(app="plain scan")
    plain_view(spark, args.files.read_text().split())
    spark.sql(args.sql_file.read_text()).write.parquet(args.output)
    spark.stop()


if __name__ == "__main__":
    main()
