"""The plan step of a query run: record the run, plan against the catalog, take the run lock, and write the plan
and the Spark jobs' inputs into the run's staging folder (staging.py). The DAGs' plan task and `materialized
refresh` call `plan` and do nothing else."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from iox_planner.errors import BadInputError
from iox_planner.objectstore import Root
from iox_planner.output import OutputFormat, shown
from iox_planner.spark.jobs import JobSpec, MergeJob, PartJob, PlanJob

from iox_planner.runs.failure import fail_run
from iox_planner.runs.request import QueryRequest
from iox_planner.runs.settings import RunSettings
from iox_planner.runs.staging import RunIdentity, Staging, remove_dead_stagings, staging_anchor


@dataclass(frozen=True)
class PlanOutcome:
    """What the plan step hands on: the Spark jobs (the whole plan, or its parts to map over), the merge job (None:
    not fanned out), a summary."""

    query_run: int
    staging: str
    jobs: list[JobSpec]
    merge: MergeJob | None
    summary: dict[str, Any]

    def handle(self) -> dict[str, Any]:
        return {"query_run": self.query_run, "staging": self.staging}


def spark_format(request: QueryRequest) -> OutputFormat:
    """What the Spark job writes: the requested format, or Arrow when the commit step must also register the
    rows as a table (it then writes the requested format itself)."""
    return OutputFormat.ARROW if request.register_as is not None else request.format


def plan(request: QueryRequest, run: RunIdentity, settings: RunSettings,
         holder_state: Callable[[str, str], str] | None = None) -> PlanOutcome:
    """Record the run, plan against the catalog, take the run lock and write the plan and the Spark jobs' inputs
    into the run's staging folder. Bad input fails here with a clear message: the run is marked failed and
    nothing is written anywhere else. `holder_state` (a task's `ti.get_dagrun_state`) lets the lock be taken over
    from a holder whose Airflow DAG run has ended (catalog/runs.py `acquire_lock`)."""
    from iox_planner.catalog import runs
    from iox_planner.catalog.store import open_catalog
    from iox_planner.output.publish import check_destination
    from iox_planner.output.store import check_store_at
    from iox_planner.planner import serde

    with open_catalog() as catalog:
        staging = Staging.for_run(request.output, run)
        run_pk = runs.start_run(
            catalog, database=request.db, params=request.as_params(), dag_id=run.dag_id, run_id=run.run_id,
            definition=request.definition, interval=(request.time_start, request.time_end),
            output=shown(request.output),
        )
        key = request.lock_key()
        created: list[Path] = []
        try:
            source, changes, query_plan = checked_plan(catalog, request, settings)
            if (isinstance(request.output, Root) or request.definition is not None
                    or settings.root_of(request.output) is not None):
                # A materialization owns its output tree (interval folders appear), and IOX_OUTPUT_ROOT is ours;
                # anywhere else the folder must exist, as for `iox-batch query --output`. Made only once the
                # query planned, and removed again if the run fails here: a refused run leaves nothing. (A key on
                # a store has no folder: its staging's, in the project, is made.)
                created = make_folders(staging_anchor(request.output).parent)
            if isinstance(request.output, Root):
                check_store_at(request.output, folder=request.format.is_folder)
            else:
                check_destination(request.output, folder=request.format.is_folder)
            runs.acquire_lock(catalog, key, run.holder, query_run=run_pk, ttl_seconds=settings.run_lock_ttl_s,
                              holder_state=holder_state)
            remove_dead_stagings(request.output, staging)
            staging.reset()
            staging.plan_file.write_text(serde.plan_to_json(query_plan))
            # What this run read (per table, the order counter of the plan's snapshot): the commit records it with
            # the interval, so `materialized status` can tell later whether data arrived that this run did not see.
            staging.reads.write_text(json.dumps([dataclasses.asdict(r) for r in source.reads()]))
            runs.record_plan(catalog, run_pk, serde.plan_to_dict(query_plan))
            jobs, merge = _spark_jobs(query_plan, request, staging, settings)
            summary = plan_summary(query_plan)
            summary["spark_jobs"] = len(jobs) + (1 if merge else 0)
            if changes is not None:
                # The watermark the next changes read passes: in the task's result and on the run's record.
                summary["changes_watermark"] = changes.watermark
                runs.record_changes_watermark(catalog, run_pk, changes.watermark)
            return PlanOutcome(run_pk, str(staging.root), jobs, merge, summary)
        except BaseException as err:
            try:
                fail_run(err, "planning", catalog, run_pk, key, run, staging)
            finally:
                remove_made_folders(created)


def checked_plan(catalog: Any, request: QueryRequest, settings: RunSettings) -> tuple[Any, Any, Any]:
    """A run's checks and its plan, recording nothing: the output under the output roots, the `register_as`
    target, the database, the changes window, the query planned within the run's budget. Returns the chunk
    source (what it read), the changes window (None: not a changes read) and the plan."""
    from iox_planner.catalog.store import CatalogSource
    from iox_planner.planner import PlannerSettings, plan_query
    from iox_planner.planner.deadline import deadline
    from iox_planner.spark.budget import timeout_error

    # Before anything touches the filesystem: the output lies under the output roots (the request may come from
    # code or a definition, not only from params checked on the way in).
    request.check_output(settings)
    check_register_target(catalog, request)
    source = CatalogSource(catalog, request.db)
    # A changes read's window is taken before any chunk list (catalog/changes.py).
    changes = source.change_window(request.changes_since) if request.changes_since is not None else None
    budget_s = request.budget_s()
    with deadline(budget_s, lambda: timeout_error(budget_s)):  # planning within the run's budget too
        query_plan = plan_query(request.sql, source, params=dict(request.args), time_start=request.time_start,
                                time_end=request.time_end, settings=PlannerSettings.from_env(), changes=changes)
    return source, changes, query_plan


def make_folders(folder: Path) -> list[Path]:
    """`folder` with its missing parents; returns the folders this call made, outermost first (one another run
    made meanwhile is not among them)."""
    missing = []
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            break
        missing.append(candidate)
    made = []
    for candidate in reversed(missing):
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        made.append(candidate)
    return made


def remove_made_folders(made: list[Path]) -> None:
    """Undo `make_folders`, innermost first, by rmdir alone: a folder something was put in meanwhile stays."""
    for folder in reversed(made):
        try:
            folder.rmdir()
        except OSError:
            return


def check_register_target(catalog: Any, request: QueryRequest) -> None:
    """`register_as` replaces the run's interval of the table, so it may name only a new table or one that earlier
    runs of the same materialized query registered: never a table ingest wrote into (its rows would be replaced
    interval by interval), nor one another query's registrations fill. Checked before anything runs, and again by
    the registration in the commit's transaction (ingest/register.py: a table created meanwhile)."""
    from iox_planner.catalog.names import excerpt
    from iox_planner.catalog.runs import table_origin

    target = request.register_as
    if target is None:
        return
    db = target.db or request.db
    origin = table_origin(catalog, db, target.table)
    if not origin.exists:
        return
    where = f"register_as: table {excerpt(target.table)} of database {db}"
    advice = "give register_as a table name of its own"
    if origin.ingested:
        raise BadInputError(f"{where} holds data that was written to it ({' and '.join(origin.ingested)}), not "
                            f"registered by this materialized query; registering would replace those rows interval "
                            f"by interval, so nothing was run: {advice}")
    if request.definition not in origin.registered_by:
        shown = ", ".join(excerpt(n) for n in origin.registered_by[:5])
        by = f"by materialized query {shown}" if shown else "by no materialized query"
        raise BadInputError(f"{where} was registered {by}, not by an earlier run of {excerpt(request.definition)}; "
                            f"registering would replace its rows interval by interval, so nothing was run: {advice}")


def _spark_jobs(query_plan: Any, request: QueryRequest, staging: Staging,
                settings: RunSettings) -> tuple[list[JobSpec], MergeJob | None]:
    from iox_planner.planner import serde
    from iox_planner.planner.fanout import split_plan

    fmt = spark_format(request)
    result = staging.result(fmt)
    # Every job of the run carries the run's budget: the job cancels itself at it, and whoever runs the job
    # (IoxSparkSubmitOperator, `materialized refresh`) stops its process group if it outlives it.
    budget = request.budget_s()
    parts = split_plan(query_plan, request.max_spark_jobs or settings.max_spark_jobs)
    if not parts:
        return [PlanJob(staging.plan_file, result, fmt, budget, report=staging.metrics,
                        fast_start=_rows(query_plan) <= settings.spark_fast_start_rows)], None
    staging.parts.mkdir()
    jobs: list[JobSpec] = []
    for k, part in enumerate(parts):
        staging.part_plan(k).write_text(serde.plan_to_json(part))
        jobs.append(PartJob(staging.part_plan(k), staging.parts / str(k), budget, report=staging.part_metrics(k),
                            fast_start=_rows(part) <= settings.spark_fast_start_rows))
    merge = MergeJob(staging.plan_file, staging.parts, result, fmt, budget, report=staging.metrics,
                     fast_start=_rows(query_plan) <= settings.spark_fast_start_rows)
    return jobs, merge


def _rows(query_plan: Any) -> int:
    """Rows the plan's chunks hold (before deduplication): the size estimate behind `fast_start`."""
    return sum(c.rows or 0 for c in query_plan.chunks().values())


def plan_summary(query_plan: Any) -> dict[str, Any]:
    """Small enough for XCom: what pruning did, how many dedups, how many rows the scanned chunks hold."""
    from iox_planner.planner.nodes import DeduplicateExec

    chunks = query_plan.chunks()
    return {
        "scans": len(query_plan.scans),
        "partitions_considered": sum(p.partitions_considered for p in query_plan.pruning),
        "partitions_pruned": sum(p.partitions_pruned for p in query_plan.pruning),
        "chunks_considered": sum(p.chunks_considered for p in query_plan.pruning),
        "chunks_pruned": sum(p.chunks_pruned for p in query_plan.pruning),
        "chunks_scanned": len(chunks),
        "dedup_groups": sum(1 for tree in query_plan.children for node in tree.walk()
                            if isinstance(node, DeduplicateExec)),
        "rows_estimated": sum(c.rows or 0 for c in chunks.values()),
    }
