"""Compaction's slices on Spark: one Spark job per call, one task per time slice (each bounded by the compaction
memory budget, see `ingest/compact.py`), merged by the one Arrow IOx dedup in Spark's Python workers. The workers
write each slice's output aside and return its metadata; the driver swaps them into the catalog."""

from __future__ import annotations

import os
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from iox_planner.errors import CatalogError
from iox_planner.ingest.compact import SliceResult, SliceTask


def _run_one(payload: tuple[dict[str, Any], str]) -> dict[str, Any]:
    # Runs in a Python worker: plain dicts in and out (the dataclasses rebuilt here), tuples restored.
    from iox_planner.ingest.compact import SliceTask, compact_slice

    raw, root = payload
    task = SliceTask(**{**raw, "inputs": tuple(tuple(i) for i in raw["inputs"]),
                        "columns": tuple(tuple(c) for c in raw["columns"]), "sort_key": tuple(raw["sort_key"])})
    return asdict(compact_slice(task, root))


def spark_slice_runner(spark: Any) -> Any:
    """A `compact.SliceRunner` running every slice of a call as a task of one Spark job."""

    def run(tasks: Sequence[SliceTask], root: Path) -> list[SliceResult]:
        if not tasks:
            return []
        payloads = [(asdict(t), str(root)) for t in tasks]
        sc = spark.sparkContext
        sc.setJobDescription(f"iox-batch compact: {len(tasks)} slice(s)")
        try:
            done = sc.parallelize(payloads, len(payloads)).map(_run_one).collect()
        except Exception as err:  # noqa: BLE001 - Spark's errors as one paragraph
            if os.environ.get("IOX_DEBUG"):
                raise
            raise CatalogError(f"compaction's Spark job failed, nothing was changed: {_first_error(err)}") from err
        return [SliceResult(**{**d, "tag_ranges": {k: tuple(v) for k, v in d["tag_ranges"].items()}})
                for d in done]

    return run


def _first_error(err: Exception) -> str:
    """The Python worker's own error line (e.g. `CatalogError: ...`, `FileNotFoundError: ...`) when there is one,
    else the first line of Spark's message; never a traceback."""
    text = str(err)
    found = re.findall(r"^(?:[A-Za-z_.]+(?:Error|Exception)): .+$", text, flags=re.M)
    line = found[-1] if found else (text.strip().splitlines() or [type(err).__name__])[0]
    return line[:500]
