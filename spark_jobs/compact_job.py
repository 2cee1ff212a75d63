"""Compaction's slices on Spark: one Spark job per call, one task per time slice (each bounded by the compaction
memory budget, see `iox_planner/maintenance/compact/`), merged by the one Arrow IOx dedup in Spark's Python
workers. The workers write each slice's output aside and return its metadata; the driver swaps them into the
catalog."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from iox_planner.maintenance.compact.slices import SliceResult, SliceTask
from spark_jobs.errors import run_tasks


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
