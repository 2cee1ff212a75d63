"""The steps of a query run that are not Spark: `plan` and `commit` (and `fail`). The DAGs' tasks call these and
do nothing else; no Airflow import here, so the steps are plain functions of a request and a run identity.

A run owns a staging folder beside its output (same filesystem, so publishing is a rename):
`<output parent>/.<output name>.iox-run-<hash of dag id and run id>/` holding `plan.json`, the Spark result
(`result.<format>`, or `result.arrow` when the commit step converts it), `metrics.json` (written by the Spark job
last, on success only), and, when fanned out, `part-<k>.json` plans and `parts/<k>/`. The plan step recreates it;
the commit step removes it whatever the outcome.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, NoReturn

from iox_planner.errors import BadInputError, IoxError
from iox_planner.faults import kill_point
from iox_planner.sparkconf import TIMEOUT_ARG, jobs_dir
from iox_planner.timeutil import format_time

from iox_airflow.query_request import QueryRequest, ResultFormat
from iox_airflow.settings import AirflowSettings

if TYPE_CHECKING:
    from iox_planner.output.publish import PinnedFolder

# Every Spark job lives in spark_jobs/ (beside run_plan.py): the DAGs submit files, they hold no Spark code.
PARTS_JOB = jobs_dir() / "run_parts.py"


class RunFailed(Exception):
    """A run step failed and has already recorded it (run marked failed, lock released, staging removed).
    `exit_code` is the cause's (75: the catalog was unreachable, retry the run)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


RECORD_FAILURE_WAIT_S = 20.0
"""How long a failed step keeps trying to record its failure while the catalog is unreachable (a Postgres restart
takes seconds): recorded, the run's lock is free at once for a rerun; not, it holds until IOX_RUN_LOCK_TTL_S."""


@dataclass(frozen=True)
class RunIdentity:
    dag_id: str
    run_id: str

    @property
    def holder(self) -> str:
        return f"{self.dag_id}/{self.run_id}"


@dataclass(frozen=True)
class Staging:
    root: Path

    @staticmethod
    def for_run(output: Path, run: RunIdentity) -> Staging:
        digest = hashlib.sha1(f"{run.dag_id}\0{run.run_id}".encode()).hexdigest()[:16]
        return Staging(output.parent / f".{output.name}.iox-run-{digest}")

    @property
    def plan_file(self) -> Path:
        return self.root / "plan.json"

    @property
    def reads(self) -> Path:
        return self.root / "reads.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.json"

    @property
    def parts(self) -> Path:
        return self.root / "parts"

    def result(self, spark_format: str) -> Path:
        return self.root / ("result" if spark_format == "parquet" else f"result.{spark_format}")

    def part_plan(self, k: int) -> Path:
        return self.root / f"part-{k}.json"

    def part_metrics(self, k: int) -> Path:
        return self.root / f"part-{k}.metrics.json"

    def reset(self) -> None:
        self.remove()
        self.root.mkdir(parents=True)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def errors(self) -> list[str]:
        """What failed Spark jobs reported (their operator leaves `<metrics>.error` files)."""
        if not self.root.is_dir():
            return []
        return [p.read_text().strip() for p in sorted(self.root.glob("*.error")) if p.read_text().strip()]


@dataclass(frozen=True)
class PlanOutcome:
    """What the plan step hands on: Spark jobs to map over, the merge job (None: not fanned out), a summary."""

    query_run: int
    staging: str
    jobs: list[dict[str, Any]]
    merge: list[str] | None
    summary: dict[str, Any]
    merge_fast_start: bool = False

    def handle(self) -> dict[str, Any]:
        return {"query_run": self.query_run, "staging": self.staging}


@dataclass(frozen=True)
class CommitOutcome:
    query_run: int
    output: str
    rows: int
    registered: dict[str, Any] | None = None


def _catalog() -> Any:
    from iox_planner.catalog.store import Catalog

    catalog = Catalog()
    catalog.require_schema()
    return catalog


def spark_format(request: QueryRequest) -> str:
    """What the Spark job writes: the requested format, or Arrow when the commit step must also register the
    rows as a table (it then writes the requested format itself)."""
    return "arrow" if request.register_as is not None else request.format.value


def plan(request: QueryRequest, run: RunIdentity, settings: AirflowSettings,
         holder_state: Callable[[str, str], str] | None = None) -> PlanOutcome:
    """Record the run, plan against the catalog, take the run lock and write the plan and the Spark jobs' inputs
    into the run's staging folder. Bad input fails here with a clear message: the run is marked failed and
    nothing is written anywhere else. `holder_state` (a task's `ti.get_dagrun_state`) lets the lock be taken over
    from a holder whose Airflow DAG run has ended (catalog/runs.py `acquire_lock`)."""
    from iox_planner.catalog import runs
    from iox_planner.catalog.store import CatalogSource
    from iox_planner.output.publish import check_destination
    from iox_planner.planner import PlannerSettings, plan_query, serde

    catalog = _catalog()
    staging = Staging.for_run(request.output, run)
    run_pk = runs.start_run(
        catalog, database=request.db, params=request.as_params(), dag_id=run.dag_id, run_id=run.run_id,
        definition=request.definition, interval=(request.time_start, request.time_end), output=str(request.output),
    )
    key = request.lock_key()
    try:
        # Before anything touches the filesystem: the output lies under the output roots (the request may come
        # from code or a definition, not only from params checked on the way in).
        request.check_output(settings)
        if request.definition is not None or settings.root_of(request.output) is not None:
            # A materialization owns its output tree (interval folders appear), and IOX_OUTPUT_ROOT is ours;
            # anywhere else the folder must exist, as for `iox-batch query --output`.
            request.output.parent.mkdir(parents=True, exist_ok=True)
        check_destination(request.output, folder=request.format.is_folder)
        source = CatalogSource(catalog, request.db)
        query_plan = plan_query(request.sql, source, params=dict(request.args),
                                time_start=request.time_start, time_end=request.time_end,
                                settings=PlannerSettings.from_env())
        runs.acquire_lock(catalog, key, run.holder, query_run=run_pk, ttl_seconds=settings.run_lock_ttl_s,
                          holder_state=holder_state)
        _remove_dead_stagings(request.output, staging)
        staging.reset()
        staging.plan_file.write_text(serde.plan_to_json(query_plan))
        # What this run read (per table, the order counter of the plan's snapshot): the commit records it with the
        # interval, so `materialized status` can tell later whether data arrived that this run did not see.
        staging.reads.write_text(json.dumps([dataclasses.asdict(r) for r in source.reads()]))
        runs.record_plan(catalog, run_pk, serde.plan_to_dict(query_plan))
        jobs, merge = _spark_jobs(query_plan, request, staging, settings)
        summary = plan_summary(query_plan)
        summary["spark_jobs"] = len(jobs) + (1 if merge else 0)
        return PlanOutcome(run_pk, str(staging.root), jobs, merge, summary,
                           merge_fast_start=summary["rows_estimated"] <= settings.spark_fast_start_rows)
    except BaseException as err:
        _fail_run(err, "planning", catalog, run_pk, key, run, staging)
    finally:
        catalog.dispose()


_STAGING_NAME = re.compile(r"\.iox-run-[0-9a-f]{16}")


def _remove_dead_stagings(output: Path, ours: Staging) -> list[str]:
    """Other runs' staging folders beside `output`, removed. Called holding the output's run lock: a run writes
    its staging only while it holds that lock, and ours was free (or expired), so every other staging folder is a
    dead run's (a commit task killed, say) and nobody else would ever remove it."""
    prefix = f".{output.name}"
    removed = []
    for entry in output.parent.iterdir():
        rest = entry.name[len(prefix):]
        if (entry.name.startswith(prefix) and _STAGING_NAME.fullmatch(rest) and entry != ours.root
                and entry.is_dir() and not entry.is_symlink()):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed


def _spark_jobs(query_plan: Any, request: QueryRequest, staging: Staging,
                settings: AirflowSettings) -> tuple[list[dict[str, Any]], list[str] | None]:
    from iox_planner.config import warehouse
    from iox_planner.planner import serde
    from iox_planner.planner.fanout import split_plan

    fmt = spark_format(request)
    wh = str(warehouse())
    result = str(staging.result(fmt))
    # Every job of the run carries the run's budget: the job cancels itself at it, and whoever runs the job
    # (IoxSparkSubmitOperator, `materialized refresh`) stops its process group if it outlives it.
    budget = [TIMEOUT_ARG, str(request.budget_s())]
    parts = split_plan(query_plan, request.max_spark_jobs or settings.max_spark_jobs)
    if not parts:
        return [{
            "application": str(jobs_dir() / "run_plan.py"),
            "application_args": ["--plan", str(staging.plan_file), "--warehouse", wh, "--format", fmt,
                                 "--output", result, "--metrics", str(staging.metrics), *budget],
            "fast_start": _rows(query_plan) <= settings.spark_fast_start_rows,
        }], None
    staging.parts.mkdir()
    jobs = []
    for k, part in enumerate(parts):
        staging.part_plan(k).write_text(serde.plan_to_json(part))
        jobs.append({
            "application": str(PARTS_JOB),
            "application_args": ["part", "--plan", str(staging.part_plan(k)), "--warehouse", wh,
                                 "--output", str(staging.parts / str(k)), "--metrics", str(staging.part_metrics(k)),
                                 *budget],
            "fast_start": _rows(part) <= settings.spark_fast_start_rows,
        })
    merge = ["merge", "--plan", str(staging.plan_file), "--warehouse", wh, "--parts", str(staging.parts),
             "--format", fmt, "--output", result, "--metrics", str(staging.metrics), *budget]
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


def commit(request: QueryRequest, run: RunIdentity, handle: Mapping[str, Any]) -> CommitOutcome:
    """Publish the staged result at the output (atomically, by output/publish.py's rules) and, for `register_as`, write
    it as a catalog table too; record the run as succeeded and release its lock, all in one catalog transaction
    that first checks the lock is still ours. Any failure: the run is marked failed, nothing is published.

    From the output check on, the output's folder is held open (output/publish.py `PinnedFolder`): the run's staging
    folder, everything read from it and the publication all go through that descriptor, so a folder swapped for a
    link meanwhile neither feeds the commit someone else's files nor receives the result."""
    from iox_planner.catalog import runs
    from iox_planner.catalog.store import Catalog, catalog_unavailable
    from iox_planner.output.publish import PinnedFolder

    kill_point("commit.start")
    catalog = Catalog()  # connects on first use, inside the try: a catalog unreachable from the start is a failure
    staging = Staging(Path(handle["staging"]))
    run_pk = int(handle["query_run"])
    key = request.lock_key()
    try:
        catalog.require_schema()
        done = runs.get_run(catalog, run_pk)
        if done is not None and done["status"] == runs.RunStatus.SUCCESS.value:
            # This commit already happened (the task was cleared and ran again, or was killed after its
            # transaction committed, before removing the staging folder): finish the tidying, change nothing else.
            # Going on would find the lock released and mark a succeeded run failed.
            staging.remove()
            return CommitOutcome(run_pk, str(request.output), int(done["row_count"] or 0), None)
        fmt = spark_format(request)
        # Again at publication: a folder under the root swapped for a symlink since planning must not lead out.
        output = request.check_output(AirflowSettings.from_env())
        with PinnedFolder(output.parent) as folder:
            files = _RunFiles(folder, staging)
            try:
                if files.lstat(staging.metrics.name) is None:
                    raise BadInputError(f"the Spark job left no result in {staging.root}; it did not finish")
                rows = int(json.loads(files.read_text(staging.metrics.name))["rows"])
                registered = None
                from iox_planner.output.publish import publishing_as
                from iox_planner.catalog.publications import CatalogLedger

                with publishing_as(run.holder, CatalogLedger(catalog)), catalog.engine.begin() as conn:
                    runs.check_lock(conn, key, run.holder)
                    if fmt == "arrow":
                        rows, registered = _publish_from_arrow(catalog, conn, request, output, folder, files,
                                                               staging.result(fmt).name)
                    else:
                        _publish(files, staging.result(fmt).name, output, folder, request.format)
                    if (request.definition is not None and request.time_start is not None
                            and request.time_end is not None):
                        _record_reads(conn, request, files, run_pk)
                    runs.finish_run(catalog, run_pk, runs.RunStatus.SUCCESS, row_count=rows, conn=conn)
                    runs.release_lock(catalog, key, run.holder, conn=conn)
                    kill_point("commit.before_commit")
                kill_point("commit.after_commit")
                files.remove()
            except BaseException as err:
                # As _record_failure would (it keeps the folder only for a retry once the catalog is back), but
                # through the held folder: after a swap the staging folder's name leads elsewhere.
                if catalog_unavailable(err) is None:
                    files.remove()
                raise
            finally:
                files.close()
        return CommitOutcome(run_pk, str(request.output), rows, registered)
    except BaseException as err:
        _fail_run(err, "publishing", catalog, run_pk, key, run, staging)
    finally:
        catalog.dispose()


class _RunFiles:
    """The run's staging folder, opened through the held output folder (never by its name from `/`), and the
    files the plan step and the Spark job left in it."""

    def __init__(self, folder: PinnedFolder, staging: Staging) -> None:
        self.folder, self.staging, self.name, self.where = folder, staging, staging.root.name, staging.root
        try:
            self.fd = folder.open_folder(self.name)
        except OSError:
            raise BadInputError(f"the Spark job left no result in {staging.root}; it did not finish") from None

    def open(self, name: str) -> int:
        """A descriptor of the file `name` in it (not a link), or a BadInputError naming what is missing."""
        try:
            return os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.fd)
        except OSError:
            raise BadInputError(f"the run's {name} is missing from {self.where}; the Spark job did not finish "
                                "writing it") from None

    def read_text(self, name: str) -> str:
        with os.fdopen(self.open(name), encoding="utf-8") as fh:
            return fh.read()

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def remove(self) -> None:
        """Remove the folder, if its name in the held folder still is this folder."""
        found, held = self.folder.lstat(self.name), os.fstat(self.fd)
        if found is not None and (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino):
            shutil.rmtree(self.name, ignore_errors=True, dir_fd=self.folder.fd)

    def close(self) -> None:
        os.close(self.fd)


def _record_reads(conn: Any, request: QueryRequest, files: _RunFiles, run_pk: int) -> None:
    """In the publishing transaction: what this run read replaces what the interval's previous run read."""
    from iox_planner.catalog.freshness import TableRead, record_reads

    assert request.definition is not None and request.time_start is not None and request.time_end is not None
    name = files.staging.reads.name
    if files.lstat(name) is None:
        raise BadInputError(f"the plan step left no record of what it read in {files.where}; rerun the interval")
    reads = [TableRead(**r) for r in json.loads(files.read_text(name))]
    record_reads(conn, request.definition, (request.time_start, request.time_end), reads, run_pk)


def fail(request: QueryRequest, run: RunIdentity, handle: Mapping[str, Any] | None, reason: str) -> str:
    """An upstream task failed: record the run as failed (with the Spark job's own error where it left one),
    release the lock, remove the staging folder. Returns the message recorded."""
    staging = Staging(Path(handle["staging"])) if handle else Staging.for_run(request.output, run)
    errors = staging.errors()
    message = "; ".join(errors) if errors else reason
    catalog = _catalog()
    try:
        if handle is not None:
            _record_failure(catalog, int(handle["query_run"]), request.lock_key(), run, staging, message)
            return message
        # The plan step never finished. A plan that failed recorded its own failure; one killed outright (after
        # taking the lock, say) recorded nothing, and its run would stay `running`, holding the lock: record it
        # here, by this DAG run's ids. Only this run's own lock is released (release_lock checks the holder).
        from iox_planner.catalog import runs

        found = runs.find_run(catalog, run.dag_id, run.run_id)
        if found is not None and found["status"] == runs.RunStatus.RUNNING.value:
            _record_failure(catalog, int(found["id"]), request.lock_key(), run, staging, message)
        staging.remove()
    finally:
        catalog.dispose()
    return message


def reject(params: Mapping[str, Any], run: RunIdentity, message: str) -> None:
    """Params that do not even make a request: record the run as failed with the params as given."""
    from iox_planner.catalog import runs

    catalog = _catalog()
    try:
        run_pk = runs.start_run(catalog, database=str(params.get("db") or ""), params=params, dag_id=run.dag_id,
                               run_id=run.run_id, output=str(params.get("output") or "") or None)
        runs.finish_run(catalog, run_pk, runs.RunStatus.FAILED, error=message)
    finally:
        catalog.dispose()


def _fail_run(err: BaseException, doing: str, catalog: Any, run_pk: int, key: Any, run: RunIdentity,
              staging: Staging) -> NoReturn:
    """Mark the run failed (lock released, staging removed) and raise: a user's mistake or a lost catalog as
    RunFailed with its one-paragraph message, anything else as it was."""
    from iox_planner.catalog.store import catalog_unavailable

    lost = catalog_unavailable(err)
    cause = lost if lost is not None else err
    message = str(cause) if isinstance(cause, IoxError) else f"internal error while {doing}: {err!r}"
    recorded = _record_failure(catalog, run_pk, key, run, staging, message)
    if isinstance(cause, IoxError):
        if not recorded:
            message += ("; the run could not be marked failed either, so its lock on the output holds until "
                        "IOX_RUN_LOCK_TTL_S (retrying this task once the catalog is back finishes the run)")
        raise RunFailed(message, cause.exit_code) from err
    raise err


def _record_failure(catalog: Any, run_pk: int, key: Any, run: RunIdentity, staging: Staging, message: str) -> bool:
    """Mark the run failed and release its lock, then remove its staging folder. While the catalog is
    unreachable, keep trying for RECORD_FAILURE_WAIT_S; if it stays so, leave the staging folder (a retry of the
    step may still use it) and return False. A run the catalog already has as succeeded stays so (finish_run): a
    COMMIT whose answer was lost may have happened."""
    import time

    from iox_planner.catalog import runs
    from iox_planner.catalog.store import catalog_unavailable

    deadline = time.monotonic() + RECORD_FAILURE_WAIT_S
    while True:
        try:
            runs.finish_run(catalog, run_pk, runs.RunStatus.FAILED, error=message)
            runs.release_lock(catalog, key, run.holder)
            break
        except Exception as err:
            if catalog_unavailable(err) is None:
                staging.remove()
                raise
            if time.monotonic() > deadline:
                return False
            catalog.engine.dispose()  # the pool's connections died with the server
            time.sleep(0.5)
    staging.remove()
    return True


def _publish(files: _RunFiles, name: str, output: Path, folder: PinnedFolder, fmt: ResultFormat) -> None:
    """Publish the staged result over the output: a rename on the same filesystem, by output/publish.py's rules
    (the catalog's publication record, not a marker). What is renamed is a hard link of the staged file, or a
    copy of the staged folder, not the staged result itself: a commit killed after the rename but before its
    transaction committed is retried, and the retry must find the result where the Spark job left it and publish
    it again (the same bytes) rather than fail the run over an output it already replaced. (A folder is copied:
    its files linked again would change the published files' ctime, which a folder's fingerprint includes, and the
    retry would refuse the output as changed by someone else.) Source and destination are both reached through
    the held output folder."""
    from iox_planner.output.publish import RESULT, fd_path, staged

    st = files.lstat(name)
    if st is None or not (stat.S_ISDIR(st.st_mode) if fmt.is_folder else stat.S_ISREG(st.st_mode)):
        raise BadInputError(f"the staged result {files.where / name} is missing; the Spark job did not write it")
    with staged(output, folder=fmt.is_folder, parent=folder) as stage:
        if fmt.is_folder:
            shutil.copytree(fd_path(files.fd, name), stage.result, symlinks=True)
        else:
            os.link(name, RESULT, src_dir_fd=files.fd, dst_dir_fd=stage.fd, follow_symlinks=False)


def _publish_from_arrow(catalog: Any, conn: Any, request: QueryRequest, output: Path, folder: PinnedFolder,
                        files: _RunFiles, name: str) -> tuple[int, dict[str, Any]]:
    """Register the rows as the catalog table (replacing the interval) and write the requested format."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from iox_planner.ingest import register
    from iox_planner.config import warehouse
    from iox_planner.output.publish import fd_path, staged
    from iox_planner.output.formats import OutputFormat, arrow_for_parquet, finish_columns, write_text_output

    assert request.register_as is not None and request.time_start is not None and request.time_end is not None
    fd = files.open(name)
    try:
        with pa.memory_map(fd_path(fd)) as source:
            table = pa.ipc.open_file(source).read_all()
    finally:
        os.close(fd)
    table, ns_cols = finish_columns(table)
    target = request.register_as
    db = target.db or request.db
    written: list[Path] = []
    try:
        result = register.register_interval(catalog, db, target.table, table, tags=target.tags,
                                       interval=(request.time_start, request.time_end), conn=conn,
                                       warehouse=warehouse(), written=written)
        if request.format is ResultFormat.PARQUET:
            with staged(output, folder=True, parent=folder) as stage:
                stage.result.mkdir()
                pq.write_table(arrow_for_parquet(table, ns_cols), stage.result / "part-00000.parquet")
        else:
            with staged(output, folder=False, parent=folder) as stage, \
                    open(stage.result, "w", encoding="utf-8", newline="") as fh:
                write_text_output(table, ns_cols, OutputFormat(request.format.value), None, fh)
    except BaseException:
        for path in written:  # the transaction will not commit: its files go too
            path.unlink(missing_ok=True)
        raise
    registered = {"db": db, "table": target.table, "files": len(result.files), "rows": result.rows,
                  "retired": result.retired, "interval_start": format_time(request.time_start),
                  "interval_end": format_time(request.time_end)}
    return table.num_rows, registered
