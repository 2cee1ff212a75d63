"""The swap: one partition's staged outputs registered and its inputs retired (and its promotions made) in ONE
catalog transaction, on the session holding the partition's compaction lock, after re-checking everything the plan
assumed; otherwise nothing is registered and the staged outputs are deleted."""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import sqlalchemy as sa

from iox_planner import storage
from iox_planner.catalog import locks
from iox_planner.catalog.store import Catalog, ChunkRow
from iox_planner.errors import CatalogUnavailableError, StoreUnavailableError
from iox_planner.faults import kill_point
from iox_planner.ingest import files as chunk_files
from iox_planner.maintenance.compact.plan import PartitionPlan, close_inputs, overlaps
from iox_planner.maintenance.compact.report import Outcome
from iox_planner.maintenance.compact.slices import SliceResult
from iox_planner.model import LOCAL_STORE, ChunkKind
from iox_planner.objectstore import Root


def swap(catalog: Catalog, conn: sa.Connection, session: int, plan: PartitionPlan, results: Sequence[SliceResult],
         root: Root) -> Outcome:
    """Register the outputs and retire the inputs in ONE transaction on `conn`, the connection whose session
    `session` took the partition's compaction lock, after re-checking:

    - that this very session still holds the lock. The staged outputs are only safe from the stray sweep while it
      does: had the session died during the Spark job (Postgres then drops its locks), a persist could have taken
      the lock and swept them, and rows naming them would be live rows naming missing files. Checked inside the
      transaction, it holds until the COMMIT (the lock goes only with the session, and a session that dies before
      its COMMIT commits nothing);
    - under the partition's row lock (persist's lock: no persist of this partition runs meanwhile), that every
      input is still live and that no chunk now outside the compaction sits in the order trap;
    - that every output file is in place, last thing before the COMMIT (on a store one HEAD request each).

    On a failed check nothing is registered and the staged outputs are deleted."""
    written = [r for r in results if r.rows_out > 0]
    try:
        with _rollback_only(conn):
            if not locks.still_held(conn, session, locks.compaction_key(plan.partition_id)):
                raise _Changed("the catalog session holding the partition's compaction lock was lost during the "
                               "Spark job, so its staged outputs may have been swept")
            locks.lock_partition(conn, plan.partition_id)
            live = catalog.chunk_rows(conn, plan.db_id, partition_id=plan.partition_id)
            live_files = {c.id for c in live if c.kind is ChunkKind.PARQUET}
            gone = [c.display_id for c in plan.inputs if c.id not in live_files]
            if gone:
                raise _Changed(f"input file(s) {', '.join(gone[:5])} were retired meanwhile by another process")
            live_l0 = {c.id for c in live if c.kind is ChunkKind.PARQUET and c.level == 0}
            lost = [c.display_id for c in plan.promoted if c.id not in live_l0]
            if lost:
                raise _Changed(f"file(s) {', '.join(lost[:5])} to promote were retired or promoted meanwhile")
            _recheck_groups(plan, live)
            layout = chunk_files.column_layout(plan.columns)
            for r in sorted(written, key=lambda r: r.index):
                assert r.min_time is not None and r.max_time is not None
                catalog.insert_chunk(conn, ChunkKind.PARQUET, dict(
                    object_id=storage.object_id(r.output), label=None, table_id=plan.table_id,
                    partition_id=plan.partition_id, store=LOCAL_STORE, path=r.output, min_time=r.min_time,
                    max_time=r.max_time, row_count=r.rows_out, file_size=r.file_size, column_names=layout,
                    tag_ranges={k: list(v) for k, v in r.tag_ranges.items()}, chunk_order=plan.slice_order(r.index),
                    sort_key=[c for c in plan.sort_key if c in plan.columns], compaction_level=plan.level,
                ))
            if plan.inputs:
                catalog.retire_chunks(conn, ChunkKind.PARQUET, [c.id for c in plan.inputs])
            if plan.promoted and catalog.promote_files(conn, [c.id for c in plan.promoted], plan.level) \
                    != len(plan.promoted):
                raise _Changed("a file to promote changed meanwhile")
            missing = [r.output for r in written if not root.exists(r.output)]
            if missing:
                raise _Changed(f"staged output {missing[0]} is missing")
            kill_point("compact.before_commit")
    except _Changed as changed:
        remove_outputs(root, results)
        return Outcome(plan.table, plan.partition, plan.level, len(plan.inputs), 0, plan.rows_in, 0,
                       skipped=f"skipped: {changed}; nothing was changed, a later run will retry")
    except _CommitFailed as failed:
        raise CatalogUnavailableError(
            f"the catalog connection failed while committing the compaction of {plan.table} {plan.partition}; "
            "it either committed whole or changed nothing, and rerunning compact is safe") from failed
    except sa.exc.DBAPIError as err:
        remove_outputs(root, results)
        if not err.connection_invalidated:
            raise
        # The connection dropped before the COMMIT was sent: nothing committed. Every later swap of this run finds
        # the reconnected session without the lock and skips the same way.
        return Outcome(plan.table, plan.partition, plan.level, len(plan.inputs), 0, plan.rows_in, 0,
                       skipped="skipped: the catalog connection holding the partition's compaction lock dropped; "
                               "nothing was changed, a later run will retry")
    except BaseException:
        remove_outputs(root, results)
        raise
    return Outcome(plan.table, plan.partition, plan.level, len(plan.inputs), len(written),
                   sum(r.rows_in for r in results), sum(r.rows_out for r in results), None,
                   len(plan.promoted), plan.rows_promoted, plan.waits)


def _recheck_groups(plan: PartitionPlan, live: Sequence[ChunkRow]) -> None:
    """Inside the swap, on the live chunks: each rewrite group still closes to itself (no chunk in its order trap,
    no L1 file or file to promote in its time range appeared), and no live L1 or L2 file outside the rewrite
    overlaps a file to promote."""
    ids = {c.id for c in plan.inputs}
    promoted = {c.id for c in plan.promoted}
    view = [c._replace(level=plan.level) if c.kind is ChunkKind.PARQUET and c.id in promoted else c for c in live]
    for group in plan.input_groups():
        closed = close_inputs(group, view, plan.level)
        if isinstance(closed, str):
            raise _Changed(closed)
        if len(closed) != len(group):
            raise _Changed("a file that overlaps the inputs with an order between theirs (or that the outputs "
                           "would overlap) appeared meanwhile")
    for p in plan.promoted:
        for c in live:
            if (c.kind is ChunkKind.PARQUET and c.level > 0 and c.id not in ids and c.id != p.id
                    and overlaps(c, p.min_time, p.max_time)):
                raise _Changed(f"file {p.display_id} to promote now overlaps L{c.level} file {c.display_id}")


class _Changed(Exception):
    pass


class _CommitFailed(Exception):
    pass


@contextlib.contextmanager
def _rollback_only(conn: sa.Connection) -> Iterator[None]:
    """A transaction on `conn` whose failure BEFORE the commit propagates as is (the caller removes the staged
    outputs), while a failing COMMIT raises `_CommitFailed`: Postgres may have committed before the connection
    dropped, and a file a committed row names must never go. If it did not commit, the outputs are strays, which
    the next compaction or persist sweeps under the partition's lock (`sweeps.sweep_compaction_strays`)."""
    trans = conn.begin()
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):  # a dead connection cannot roll back
            trans.rollback()
        raise
    try:
        trans.commit()
    except Exception as err:
        raise _CommitFailed(str(err)) from err


def remove_outputs(root: Root, results: Sequence[SliceResult]) -> None:
    """Delete the outputs of a compaction that registered none of them. Best effort on a store: one that no
    longer answers keeps them as objects no row names, which the sweep removes after the grace period; the
    failure that brought us here is the one to report."""
    for r in results:
        try:
            root.delete(r.output)
        except StoreUnavailableError:
            return
