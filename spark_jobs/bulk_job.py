"""A bulk load on Spark: the job's body (`run_bulk_load`, inside the one job wrapper `job.py`), and its ranges as
one Spark job, one task per byte range, each parsed by the plain write's parser in a Python worker
(`ingest/bulk.py` `parse_range`), which writes its chunks into the load's staging folder (on an object store,
straight to the keys they keep; the task reads an `s3://` input and writes through its own filesystem, built from
its own environment) and returns their metadata; the driver registers them all in one catalog transaction."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Sequence

from iox_planner.ingest.bulk import Range, RangeResult, RangeRunner, StagedChunk, TaskParams
from spark_jobs.errors import default_parallelism, run_tasks

if TYPE_CHECKING:
    from spark_jobs.context import JobContext


def _run_one(payload: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
    # Runs in a Python worker: plain dicts in and out.
    from iox_planner.ingest.bulk import Range, TaskParams, parse_range

    raw_range, raw_params = payload
    return asdict(parse_range(Range(**raw_range), TaskParams(**raw_params)))


def _result(d: dict[str, Any]) -> RangeResult:
    chunks = tuple(StagedChunk(**{**c, "columns": tuple(tuple(x) for x in c["columns"]),
                                  "tag_ranges": {k: tuple(v) for k, v in c["tag_ranges"].items()}})
                   for c in d["chunks"])
    return RangeResult(**{**d, "chunks": chunks})


def spark_range_runner(spark: Any) -> RangeRunner:
    """A `bulk.RangeRunner` running every range of a load as a task of one Spark job."""

    def run(ranges: Sequence[Range], params: TaskParams) -> list[RangeResult]:
        done = run_tasks(spark, [(asdict(r), asdict(params)) for r in ranges], _run_one,
                         f"iox-batch write --spark: {len(ranges)} range(s)",
                         "the bulk load's Spark job failed, nothing was written")
        return [_result(d) for d in done]

    return run


def run_bulk_load(ctx: JobContext) -> dict[str, Any]:
    """The job's body: the load (`ingest/bulk.py` `bulk_write`, one task per range of the session's parallelism),
    its report the chunks registered and the lines rejected."""
    from iox_planner.catalog.store import open_catalog
    from iox_planner.ingest.bulk import bulk_write
    from iox_planner.spark.jobs import BulkLoadJob

    job = ctx.job
    assert isinstance(job, BulkLoadJob)
    with open_catalog() as catalog:
        spark = ctx.session()
        result = bulk_write(catalog, job.db, job.source, spark_range_runner(spark), precision=job.precision,
                            accept_partial=job.accept_partial, progress=ctx.progress,
                            min_ranges=default_parallelism(spark), input_root=job.root)
    return {"chunks": [asdict(c) for c in result.chunks], "rejected": [asdict(e) for e in result.rejected]}
