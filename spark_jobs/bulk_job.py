"""A bulk load's ranges on Spark: one Spark job per load, one task per byte range, each parsed by the plain write's
parser in a Python worker (`ingest/bulk.py` `parse_range`), which writes its chunks into the load's staging folder
and returns their metadata; the driver registers them all in one catalog transaction."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Sequence

from iox_planner.ingest.bulk import Range, RangeResult, RangeRunner, StagedChunk, TaskParams
from spark_jobs.errors import run_tasks


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
