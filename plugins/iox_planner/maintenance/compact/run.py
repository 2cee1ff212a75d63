"""A whole compaction run: plan, take each partition's compaction lock, sweep its strays, plan again under the
locks, run every slice as one Spark job, then swap each partition on its own."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Sequence

import sqlalchemy as sa

from iox_planner.catalog import locks
from iox_planner.catalog.store import Catalog
from iox_planner.faults import kill_point
from iox_planner import storage
from iox_planner.maintenance.compact.plan import PartitionPlan, Skip, check_target, find_work, without_rewrite
from iox_planner.maintenance.compact.report import Outcome, Report
from iox_planner.maintenance.compact.settings import CompactSettings
from iox_planner.maintenance.compact.slices import SliceResult, SliceRunner, slice_tasks
from iox_planner.maintenance.compact.swap import remove_outputs, swap
from iox_planner.objectstore import Root
from iox_planner.maintenance.sweeps import (DEFAULT_GRACE_SECONDS, collect_garbage, expire_partitions,
                                            sweep_locked_partition)


def compact(
    catalog: Catalog,
    db: str,
    run_slices: SliceRunner,
    *,
    table: str | None = None,
    partition: str | None = None,
    only: Sequence[int] | None = None,
    warehouse: Root | Path | None = None,
    settings: CompactSettings | None = None,
    progress: Callable[[str], None] | None = None,
    after_slices: Callable[[], None] | None = None,
    rewrites: bool = True,
) -> Report:
    """Compact every partition of `db` (or of `table`, or the one `partition`; `only`: these partition ids) that
    needs it. Each partition's compaction lock is taken first, for the whole run; a partition another compactor
    holds is skipped with a message. All slices of all locked partitions run as ONE call of `run_slices` (one
    Spark job), then each partition is swapped on its own. `rewrites=False`: promotions only, `run_slices` gets
    no slice (the `iox_compact` DAG's batch that starts no Spark job); a partition that needs a rewrite promotes
    what it can alone (`without_rewrite`) and its rewrite waits for a run that rewrites. Partitions past the
    database's retention are retired first, never compacted (`sweeps.expire_partitions`), and files retired longer
    ago than the grace period are deleted last (`sweeps.collect_garbage`)."""
    root = storage.warehouse_of(warehouse)
    settings = settings or CompactSettings.from_env()
    say = progress or (lambda _line: None)
    report = Report()
    with catalog.engine.connect() as lock_conn:
        db_id = check_target(catalog, lock_conn, db, table, partition)
        lock_conn.commit()
        expire_partitions(catalog, db_id)
        wanted = find_work(catalog, lock_conn, db_id, settings, table=table, partition=partition, only=only)
        lock_conn.commit()
        locked: list[int] = []
        session = locks.backend_pid(lock_conn)
        try:
            for item in wanted:
                if isinstance(item, Skip):
                    continue
                pid = item.partition_id
                if locks.try_lock(lock_conn, locks.compaction_key(pid)):
                    locked.append(pid)
                else:
                    report.outcomes.append(Outcome(item.table, item.partition, item.level, 0, 0, 0, 0,
                                                   skipped="skipped: another compaction of this partition is "
                                                           "running; it does the work"))
            lock_conn.commit()
            for item in wanted:
                if isinstance(item, Skip):
                    report.plans.append(item)
                    report.outcomes.append(Outcome(item.table, item.partition, 0, 0, 0, 0, 0,
                                                   skipped=f"skipped: {item.reason}"))
            # Planned again under the locks: a compactor that finished just before we locked changed the files.
            plans: list[PartitionPlan] = []
            for pid in locked:
                sweep_locked_partition(lock_conn, root, pid)
                for item in find_work(catalog, lock_conn, db_id, settings, only=[pid]):
                    if isinstance(item, PartitionPlan) and not rewrites:
                        item = without_rewrite(item)
                    report.plans.append(item)
                    if isinstance(item, PartitionPlan):
                        plans.append(item)
                    else:
                        report.outcomes.append(Outcome(item.table, item.partition, 0, 0, 0, 0, 0,
                                                       skipped=f"skipped: {item.reason}"))
            lock_conn.commit()
            tasks = {p.partition_id: slice_tasks(p) for p in plans}
            everything = [t for p in plans for t in tasks[p.partition_id]]
            if everything:
                say(f"compacting {len(plans)} partition(s) in {len(everything)} slice(s) on Spark")
            try:
                results = list(run_slices(everything, root)) if everything else []
                if after_slices is not None:
                    after_slices()
                kill_point("compact.before_swap")  # the outputs are put, no row names them yet
            except BaseException:
                remove_outputs(root, [SliceResult(t.partition_id, t.index, t.output, 0, 0, None, None, 0, {})
                               for t in everything])
                raise
            by_partition: dict[int, list[SliceResult]] = {}
            for r in results:
                by_partition.setdefault(r.partition_id, []).append(r)
            for i, p in enumerate(plans):
                outcome = swap(catalog, lock_conn, session, p, by_partition.get(p.partition_id, []), root)
                report.outcomes.append(outcome)
                what = outcome.skipped or (
                    f"L{p.level}: {outcome.files_in} file(s), {outcome.rows_in:,} rows -> {outcome.files_out} "
                    f"file(s), {outcome.rows_out:,} rows ({outcome.duplicates_removed:,} duplicates removed); "
                    f"{outcome.files_promoted} file(s), {outcome.rows_promoted:,} rows promoted in place"
                    + (f"; the rewrite waits: {outcome.waits}" if outcome.waits else ""))
                say(f"[{i + 1}/{len(plans)}] {p.table} {p.partition}: {what}")
        finally:
            # A session that died released its locks with it; its connection may not answer (or reconnect without
            # them): the unlock must not hide the run's own error.
            with contextlib.suppress(sa.exc.DBAPIError, sa.exc.InvalidRequestError):
                if lock_conn.in_transaction():
                    lock_conn.rollback()
                for pid in locked:
                    locks.unlock(lock_conn, locks.compaction_key(pid))
                lock_conn.commit()
    collect_garbage(catalog, root, DEFAULT_GRACE_SECONDS)
    return report
