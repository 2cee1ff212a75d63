"""The query jobs' bodies, run inside the one job wrapper (`job.py`, which loads the plan and holds the budget):
a plan's result written in a format (`run_plan`), or collected as Arrow for a caller to print (`collect`); a
fanned-out plan's part (`run_part`: each scan's rows, see planner/fanout.py) and its merge (`run_merge`: the query's
SQL over the parts). Each returns the job's report."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_jobs.context import JobContext


def run_plan(ctx: JobContext) -> dict[str, Any]:
    """The plan's result, written in the job's format at its output (through `load.write_result`, published
    atomically)."""
    from iox_planner.spark.jobs import PlanJob
    from spark_jobs.execute import execute
    from spark_jobs.load import write_result

    job = ctx.job
    assert isinstance(job, PlanJob)
    result = execute(ctx.session(), ctx.query_plan(), job.warehouse, strategy=job.strategy).result
    if job.limit_rows is not None:
        result = result.limit(job.limit_rows)
    return {"rows": write_result(result, job.format.value, job.output, sys.stdout)}


def collect(ctx: JobContext) -> Any:
    """The plan's result on the driver as an Arrow table, at most `limit_rows` rows (cut on Spark, so a huge
    result costs no more than the bound)."""
    from iox_planner.spark.jobs import PlanJob
    from spark_jobs.execute import execute
    from spark_jobs.load import result_to_arrow

    job = ctx.job
    assert isinstance(job, PlanJob)
    result = execute(ctx.session(), ctx.query_plan(), job.warehouse, strategy=job.strategy).result
    return result_to_arrow(result if job.limit_rows is None else result.limit(job.limit_rows))


def run_part(ctx: JobContext) -> dict[str, Any]:
    """Each scan's rows of this part as Parquet under `output/<view>/`, written into a private staging folder
    through the output's folder held open and published by a rename there (`output/publish.py` `staged`): a
    retry replaces what an earlier try published, and a folder on the way swapped for a link receives nothing."""
    from pyspark.sql import functions as F

    from iox_planner.output.publish import staged
    from iox_planner.spark.jobs import PartJob
    from spark_jobs.connect import executors_share_this_machine
    from spark_jobs.execute import ScanBuilder

    job = ctx.job
    assert isinstance(job, PartJob)
    spark, plan = ctx.session(), ctx.query_plan()
    rows = 0
    with staged(job.output, folder=True) as stage:
        # A local master's executors reach the staging folder through this process's descriptor; a cluster's by
        # its name, allowed only where nobody else can re-point it (as load.write_result does).
        local = executors_share_this_machine(spark)
        where = stage.result if local else stage.shared_result()
        where.mkdir()
        for scan, tree in zip(plan.scans, plan.children):
            columns = {name: ctype for chunk in tree.scanned_chunks() for name, ctype in chunk.columns.items()}
            columns.update(scan.columns)
            df = ScanBuilder(spark, job.warehouse, columns).build(tree)
            # Exactly the scan tree's columns, in its order: what run_merge reads back with the scan's types.
            df = df.select(*[F.col("`" + c.replace("`", "``") + "`") for c in tree.schema])
            df.write.parquet(str(where / scan.view))
            rows += spark.read.parquet(str(where / scan.view)).count()
    return {"rows": rows}


def run_merge(ctx: JobContext) -> dict[str, Any]:
    """The query's SQL over the parts: each scan's view is the union of its parts."""
    from pyspark.sql import types as T

    from iox_planner.model import CHUNK_ORDER, TIME
    from iox_planner.spark.jobs import MergeJob
    from spark_jobs.execute import register_view, run_query_sql
    from spark_jobs.load import write_result
    from spark_jobs.transform import file_type

    job = ctx.job
    assert isinstance(job, MergeJob)
    spark, plan = ctx.session(), ctx.query_plan()
    parts = sorted(p for p in Path(job.parts).iterdir() if p.is_dir() and not p.name.startswith("."))
    for scan, tree in zip(plan.scans, plan.children):
        types = dict(scan.columns)
        schema = T.StructType([
            T.StructField(name, T.LongType() if name == CHUNK_ORDER else file_type(types[name]), name != TIME)
            for name in tree.schema
        ])
        folders = [str(p / scan.view) for p in parts if (p / scan.view).is_dir()]
        df = spark.read.schema(schema).parquet(*folders) if folders else spark.createDataFrame([], schema)
        register_view(df, scan.view)
    return {"rows": write_result(run_query_sql(spark, plan), job.format.value, job.output, sys.stdout)}
