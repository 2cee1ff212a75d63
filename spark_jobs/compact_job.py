"""Compaction on Spark: the job's body (`run_compact`, inside the one job wrapper `job.py`), and its slices as one
Spark job per call, one task per time slice (each bounded by the compaction memory budget, see
`iox_planner/maintenance/compact/`), merged by the one Arrow IOx dedup in Spark's Python workers. The workers write
each slice's output aside and return its metadata; the driver swaps them into the catalog."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from iox_planner.maintenance.compact.slices import SliceResult, SliceTask
from spark_jobs.errors import run_tasks

if TYPE_CHECKING:
    from spark_jobs.context import JobContext


def _run_one(payload: tuple[dict[str, Any], str]) -> dict[str, Any]:
    # Runs in a Python worker: plain dicts in and out (the dataclasses rebuilt here), tuples restored.
    from iox_planner.maintenance.compact.slices import SliceTask, compact_slice

    raw, root = payload
    task = SliceTask(**{**raw, "inputs": tuple(tuple(i) for i in raw["inputs"]),
                        "columns": tuple(tuple(c) for c in raw["columns"]), "sort_key": tuple(raw["sort_key"])})
    return asdict(compact_slice(task, root))


def spark_slice_runner(spark: Any) -> Any:
    """A `slices.SliceRunner` running every slice of a call as a task of one Spark job."""

    def run(tasks: Sequence[SliceTask], root: Path) -> list[SliceResult]:
        done = run_tasks(spark, [(asdict(t), str(root)) for t in tasks], _run_one,
                         f"iox-batch compact: {len(tasks)} slice(s)",
                         "compaction's Spark job failed, nothing was changed")
        return [SliceResult(**{**d, "tag_ranges": {k: tuple(v) for k, v in d["tag_ranges"].items()}})
                for d in done]

    return run


def run_compact(ctx: JobContext) -> dict[str, Any]:
    """The job's body: the job's targets (an `iox_compact` batch) or database compacted as
    `maintenance/compact/batches.py` `compact_batch` does, the session started only when some partition needs a
    rewrite (promotions alone need no Spark job). Progress lines name their database in a batch."""
    from iox_planner.maintenance.compact.batches import compact_batch
    from iox_planner.spark.jobs import CompactJob

    job = ctx.job
    assert isinstance(job, CompactJob)

    def run_slices(tasks: Sequence[SliceTask], root: Path) -> list[SliceResult]:
        return list(spark_slice_runner(ctx.session())(tasks, root))

    if job.db is not None:
        return compact_batch([(job.db, None)], run_slices, table=job.table, partition=job.partition,
                             progress=lambda db, line: ctx.progress(line))
    return compact_batch(job.targets, run_slices,
                         progress=lambda db, line: ctx.progress(f"{db}: {line}"))
