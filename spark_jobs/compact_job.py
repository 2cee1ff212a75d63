"""Compaction on Spark: the job's body (`run_compact`, inside the one job wrapper `job.py`), and its slices as one
Spark job per call, the time slices (each bounded by the compaction memory budget, see
`iox_planner/maintenance/compact/`) bundled into about one task per core (`slices.bundles`), merged by the one Arrow
IOx dedup in Spark's Python workers; a call of few rows merges in the driver's own process instead
(`IOX_COMPACT_DRIVER_ROWS`). The workers put each slice's output under a fresh name in the warehouse (a local folder or an
object store, reached by each worker itself) and return its metadata; the driver swaps them into the catalog."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Callable, Sequence

from iox_planner.errors import CatalogError, IoxError
from iox_planner.maintenance.compact.slices import SliceResult, SliceTask, bundles, compact_slices
from iox_planner.objectstore import Root
from spark_jobs.errors import default_parallelism, run_tasks

FAILED = "compaction's Spark job failed, nothing was changed"
FAILED_IN_DRIVER = "compaction's merge failed, nothing was changed"

if TYPE_CHECKING:
    from spark_jobs.context import JobContext


def _run_bundle(payload: tuple[list[dict[str, Any]], str]) -> list[dict[str, Any]]:
    # Runs in a Python worker: plain dicts in and out (the dataclasses rebuilt here), tuples restored.
    from iox_planner.maintenance.compact.slices import SliceTask, compact_slices

    raws, root = payload
    tasks = [SliceTask(**{**raw, "inputs": tuple(tuple(i) for i in raw["inputs"]),
                          "columns": tuple(tuple(c) for c in raw["columns"]), "sort_key": tuple(raw["sort_key"])})
             for raw in raws]
    return [asdict(r) for r in compact_slices(tasks, root)]


def spark_slice_runner(spark: Any, in_driver_rows: int | None = None) -> Any:
    """A `slices.SliceRunner` running every slice of a call in one Spark job on `spark`, bundled into about one
    task per core; or in this process when the call holds at most `in_driver_rows` rows (the plan's estimate;
    default `IOX_COMPACT_DRIVER_ROWS`)."""
    return slice_runner(lambda: spark, in_driver_rows)


def slice_runner(session: Callable[[], Any], in_driver_rows: int | None = None) -> Any:
    """`spark_slice_runner` on the session `session()` gives, asked for only when a call needs a Spark job (a
    compaction of few rows starts no JVM).

    Why a call of few rows merges in the driver, one slice after the other: a Spark job costs about 0.2
    CPU-seconds and 0.3 s of its own (the JVM's scheduling, the Python workers' round trips; measured on 2 cores),
    as much as merging 300 k rows, and below `IOX_COMPACT_DRIVER_ROWS` its parallelism saves less than that. The
    driver sees the warehouse in every deployment: a compaction's driver side sweeps and deletes files there
    (`run.compact`), over Spark Connect too."""
    from iox_planner.config import COMPACT_DRIVER_ROWS

    limit = COMPACT_DRIVER_ROWS.read() if in_driver_rows is None else in_driver_rows

    def run(tasks: Sequence[SliceTask], root: Root) -> list[SliceResult]:
        if limit > 0 and sum(t.rows for t in tasks) <= limit:
            try:
                return compact_slices(tasks, root.uri)
            except IoxError:
                raise
            except Exception as err:  # noqa: BLE001 - as a worker's error is reported (run_tasks)
                raise CatalogError(f"{FAILED_IN_DRIVER}: {err}") from err
        spark = session()
        runs = bundles(tasks, default_parallelism(spark)) if len(tasks) > 1 else [list(tasks)]
        # The warehouse as its URI text: each worker builds its own filesystem from its own environment.
        done = run_tasks(spark, [([asdict(t) for t in run_], root.uri) for run_ in runs], _run_bundle,
                         f"iox-batch compact: {len(tasks)} slice(s) in {len(runs)} task(s)", FAILED)
        return [SliceResult(**{**d, "tag_ranges": {k: tuple(v) for k, v in d["tag_ranges"].items()}})
                for results in done for d in results]

    return run


def run_compact(ctx: JobContext) -> dict[str, Any]:
    """The job's body: the job's targets (an `iox_compact` batch) or database compacted as
    `maintenance/compact/batches.py` `compact_batch` does, the session started only when a rewrite needs a Spark job
    (promotions alone, or a rewrite of at most `IOX_COMPACT_DRIVER_ROWS` rows, need none). Progress lines name their
    database in a batch."""
    from iox_planner.maintenance.compact.batches import compact_batch
    from iox_planner.spark.jobs import CompactJob

    job = ctx.job
    assert isinstance(job, CompactJob)

    run_slices = slice_runner(ctx.session)
    if job.db is not None:
        return compact_batch([(job.db, None)], run_slices, table=job.table, partition=job.partition,
                             progress=lambda db, line: ctx.progress(line))
    return compact_batch(job.targets, run_slices,
                         progress=lambda db, line: ctx.progress(f"{db}: {line}"))
