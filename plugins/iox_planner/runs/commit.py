"""The commit step of a query run: publish the staged result at the output (and, for `register_as`, write it as
a catalog table too), record the run as succeeded and release its lock, all in one catalog transaction that first
checks the lock is still the run's. Any failure: the run is recorded failed (failure.py), nothing is published."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from iox_planner.errors import BadInputError
from iox_planner.faults import kill_point
from iox_planner.objectstore import Root
from iox_planner.output import Destination, OutputFormat, shown
from iox_planner.timeutil import format_time

from iox_planner.runs.failure import fail_run
from iox_planner.runs.planning import spark_format
from iox_planner.runs.request import QueryRequest
from iox_planner.runs.settings import RunSettings
from iox_planner.runs.staging import RunFiles, RunIdentity, Staging, staging_anchor

if TYPE_CHECKING:
    from iox_planner.output.publish import PinnedFolder


@dataclass(frozen=True)
class CommitOutcome:
    query_run: int
    output: str
    rows: int
    registered: dict[str, Any] | None = None


def commit(request: QueryRequest, run: RunIdentity, handle: Mapping[str, Any]) -> CommitOutcome:
    """Publish the staged result at the output (atomically, by output/publish.py's rules) and, for `register_as`, write
    it as a catalog table too; record the run as succeeded and release its lock, all in one catalog transaction
    that first checks the lock is still ours. Any failure: the run is marked failed, nothing is published.

    From the output check on, the output's folder is held open (output/publish.py `PinnedFolder`): the run's staging
    folder, everything read from it and the publication all go through that descriptor, so a folder swapped for a
    link meanwhile neither feeds the commit someone else's files nor receives the result."""
    from iox_planner.catalog import runs
    from iox_planner.catalog.store import catalog_unavailable, open_catalog
    from iox_planner.output.publish import PinnedFolder

    kill_point("commit.start")
    # The schema is checked inside the try: a catalog unreachable from the start is a failure this step records.
    with open_catalog(check_schema=False) as catalog:
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
                return CommitOutcome(run_pk, shown(request.output), int(done["row_count"] or 0), None)
            fmt = spark_format(request)
            # Again at publication: a folder under the root swapped for a symlink since planning must not lead out.
            output = request.check_output(RunSettings.from_env())
            # A key on a store has no folder: its run's staging folder lies in the project (staging.py).
            with PinnedFolder(staging_anchor(output).parent) as folder:
                files = RunFiles(folder, staging)
                try:
                    if files.lstat(staging.metrics.name) is None:
                        raise BadInputError(f"the Spark job left no result in {staging.root}; it did not finish")
                    rows = int(json.loads(files.read_text(staging.metrics.name))["rows"])
                    registered = None
                    from iox_planner.output.publish import publishing_as
                    from iox_planner.catalog.publications import CatalogLedger

                    with publishing_as(run.holder, CatalogLedger(catalog)), catalog.engine.begin() as conn:
                        runs.check_lock(conn, key, run.holder)
                        if fmt is OutputFormat.ARROW:
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
                    # As failure.record_failure would (it keeps the folder only for a retry once the catalog is back),
                    # but through the held folder: after a swap the staging folder's name leads elsewhere.
                    if catalog_unavailable(err) is None:
                        files.remove()
                    raise
                finally:
                    files.close()
            return CommitOutcome(run_pk, shown(request.output), rows, registered)
        except BaseException as err:
            fail_run(err, "publishing", catalog, run_pk, key, run, staging)


def _record_reads(conn: Any, request: QueryRequest, files: RunFiles, run_pk: int) -> None:
    """In the publishing transaction: what this run read replaces what the interval's previous run read."""
    from iox_planner.catalog.freshness import TableRead, record_reads

    assert request.definition is not None and request.time_start is not None and request.time_end is not None
    name = files.staging.reads.name
    if files.lstat(name) is None:
        raise BadInputError(f"the plan step left no record of what it read in {files.where}; rerun the interval")
    reads = [TableRead(**r) for r in json.loads(files.read_text(name))]
    record_reads(conn, request.definition, (request.time_start, request.time_end), reads, run_pk)


def _publish(files: RunFiles, name: str, output: Destination, folder: PinnedFolder, fmt: OutputFormat) -> None:
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
    if isinstance(output, Root):
        _publish_to_store(files, name, output, fmt)
        return
    with staged(output, folder=fmt.is_folder, parent=folder) as stage:
        if fmt.is_folder:
            shutil.copytree(fd_path(files.fd, name), stage.result, symlinks=True)
        else:
            os.link(name, RESULT, src_dir_fd=files.fd, dst_dir_fd=stage.fd, follow_symlinks=False)


def _publish_to_store(files: RunFiles, name: str, output: Root, fmt: OutputFormat) -> None:
    """Publish the staged result (left where it is, for a retried commit) as a key on a store, by
    output/store.py's rules: a file as one object in one request; a folder's Parquet files copied under a fresh
    prefix, then its manifest."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from iox_planner.objectstore import local_root, store_errors
    from iox_planner.output.publish import fd_path
    from iox_planner.output.store import publish_file, staged_folder

    if not fmt.is_folder:
        fd = files.open(name)
        with os.fdopen(fd, "rb") as fh:
            publish_file(output, fh.read())
        return
    folder = files.open_folder(name)
    try:
        parts = sorted(e for e in os.listdir(folder) if e.endswith(".parquet") and not e.startswith((".", "_")))
        local = local_root(Path("/")).filesystem()
        with staged_folder(output) as stage:
            for index, part in enumerate(parts):
                source = fd_path(folder, part)
                if not stat.S_ISREG(os.stat(part, dir_fd=folder, follow_symlinks=False).st_mode):
                    raise BadInputError(f"the staged result {files.where / name} holds {part!r}, not a file")
                rel = stage.part_rel(index)
                with store_errors(output, "write", rel):
                    pafs.copy_files(source, output.path(rel), source_filesystem=local,
                                    destination_filesystem=output.filesystem())
                stage.add(rel, os.stat(part, dir_fd=folder).st_size, pq.read_metadata(source).num_rows)
    finally:
        os.close(folder)


def _publish_from_arrow(catalog: Any, conn: Any, request: QueryRequest, output: Destination, folder: PinnedFolder,
                        files: RunFiles, name: str) -> tuple[int, dict[str, Any]]:
    """Register the rows as the catalog table (replacing the interval) and write the requested format."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from iox_planner.ingest import register
    from iox_planner.config import warehouse_root
    from iox_planner.output.publish import fd_path, staged
    from iox_planner.output.formats import arrow_for_parquet, finish_columns, write_text_output
    from iox_planner.output.store import staged_folder

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
    written: list[str] = []
    root = warehouse_root()
    try:
        result = register.register_interval(catalog, db, target.table, table, tags=target.tags,
                                       interval=(request.time_start, request.time_end), conn=conn,
                                       warehouse=root, written=written, owner=request.definition)
        if isinstance(output, Root):
            if request.format is OutputFormat.PARQUET:
                with staged_folder(output) as store_stage:
                    store_stage.put_table(arrow_for_parquet(table, ns_cols))
            else:
                write_text_output(table, ns_cols, request.format, output, io.StringIO())
        elif request.format is OutputFormat.PARQUET:
            with staged(output, folder=True, parent=folder) as stage:
                stage.result.mkdir()
                pq.write_table(arrow_for_parquet(table, ns_cols), stage.result / "part-00000.parquet")
        else:
            with staged(output, folder=False, parent=folder) as stage, \
                    open(stage.result, "w", encoding="utf-8", newline="") as fh:
                write_text_output(table, ns_cols, request.format, None, fh)
    except BaseException:
        for rel in written:  # the transaction will not commit: its files go too
            root.delete(rel)
        raise
    registered = {"db": db, "table": target.table, "files": len(result.files), "rows": result.rows,
                  "retired": result.retired, "interval_start": format_time(request.time_start),
                  "interval_end": format_time(request.time_end)}
    return table.num_rows, registered
