"""Every sweep of the warehouse, in one place: partitions past their database's retention (`expire_partitions`,
which retires them), retired files past their grace period (`collect_garbage`), chunk files no catalog row names
(`sweep_unreferenced`), compaction outputs a killed compaction left (`sweep_compaction_strays`) and dead bulk
loads' staging (`sweep_bulk_loads`). Persist runs them all; a compaction expires partitions and sweeps its own
partitions' strays first and collects garbage last; the `iox_persist` DAG expires and collects every database
(`expire_databases`). Each deletes only names iox-batch gives (`storage.py`), only
what no catalog row names, and only under the lock that keeps the files' owner away."""

from __future__ import annotations

import contextlib
import json
import shutil
import stat
import time
from pathlib import Path
from typing import Sequence

import sqlalchemy as sa

from iox_planner import storage
from iox_planner import timeutil
from iox_planner.catalog import locks
from iox_planner.catalog.retention import ExpiredPartition, cutoff, expired_partitions, retention_of
from iox_planner.catalog.schema import databases, partitions, tables
from iox_planner.catalog.store import Catalog
from iox_planner.model import LOCAL_STORE, ChunkKind

DEFAULT_GRACE_SECONDS = 3600.0
"""How long a retired file stays readable (for queries planned before it was retired), and how old a file no row
names must be before a sweep takes it for a dead command's (a younger one may belong to a write in flight)."""


# --- retention ----------------------------------------------------------------------------------------------------


def expire_partitions(catalog: Catalog, db_id: int, now_ns: int | None = None) -> list[tuple[ExpiredPartition, int]]:
    """Retire every live chunk of the database's partitions that lie wholly past its retention at `now_ns`
    (default: now): the retire-then-delete path every retired file takes, so a query planned before keeps
    reading them for the grace period and `collect_garbage` deletes them after it. One transaction per
    partition, under its row lock (persists, compaction swaps and registrations of it wait). Returns each
    partition that had live chunks and how many were retired. Nothing is logged as written, so no materialized
    interval goes stale by an expiry (catalog/freshness.py)."""
    with catalog.engine.connect() as conn:
        retention = retention_of(conn, db_id)
        if retention is None:
            return []
        cut = cutoff(retention, timeutil.now_ns() if now_ns is None else now_ns)
        assert cut is not None
        expired = expired_partitions(conn, db_id, cut)
    retired = []
    for part in expired:
        with catalog.engine.begin() as conn:
            locks.lock_partition(conn, part.partition_id)
            count = catalog.retire_partition(conn, part.partition_id)
        if count:
            retired.append((part, count))
    return retired


def expire_databases(catalog: Catalog, root: Path, grace_seconds: float,
                     only: Sequence[str] = ()) -> list[tuple[str, ExpiredPartition, int]]:
    """The maintenance DAG's sweep: expire the partitions of every database with a retention (those `only` names,
    default all), then delete what was retired longer ago than the grace period. Returns what was retired."""
    query = sa.select(databases.c.id, databases.c.name).where(databases.c.retention_ns.is_not(None))
    if only:
        query = query.where(databases.c.name.in_(list(only)))
    with catalog.engine.connect() as conn:
        found = [(int(r.id), r.name) for r in conn.execute(query.order_by(databases.c.name))]
    done = [(name, part, count) for db_id, name in found for part, count in expire_partitions(catalog, db_id)]
    collect_garbage(catalog, root, grace_seconds)
    return done


# --- retired files ------------------------------------------------------------------------------------------------


def collect_garbage(catalog: Catalog, root: Path, grace_seconds: float) -> int:
    """Delete files retired longer ago than the grace period, then their rows. Returns how many."""
    with catalog.engine.begin() as conn:
        expired = catalog.expired_chunks(conn, grace_seconds)
        for kind in ChunkKind:
            ids = [cid for k, cid, _, _ in expired if k is kind]
            if ids:
                catalog.delete_chunk_rows(conn, kind, ids)
    # Rows go first: a crash between the two leaves an orphan file, never a row naming a missing file.
    for _, _, store, path in expired:
        if store == LOCAL_STORE:
            (root / path).unlink(missing_ok=True)
    return len(expired)


# --- unreferenced chunk files -------------------------------------------------------------------------------------

# A chunk file is written before its catalog row commits (ingest/write.py, persist), so a command killed between
# the two leaves a file no row names, and one killed inside `write_parquet_atomic` leaves its hidden temporary.
# Nothing else ever deletes those: this sweep does, for one database, once they are older than the grace period
# (a file younger than that may belong to a write still in flight). Only names iox-batch itself gives chunk
# files (`storage.CHUNK_FILE`, `storage.CHUNK_TEMP`), in `<db id>/<table id>/<partition id>/` folders (ids:
# digits only), are candidates.


def sweep_unreferenced(catalog: Catalog, root: Path, db_id: int, grace_seconds: float) -> list[str]:
    """Delete database `db_id`'s chunk files (and chunk temporaries) that no catalog row names, live or retired,
    once older than `grace_seconds`, unless a write into the database is in flight; then its table and partition
    folders left empty, if they were older than `grace_seconds` too. Returns the deleted files' warehouse-relative
    paths. Dead bulk loads' staging folders (`_bulk/<load id>`, any database's: a load into a
    new database has no database id yet) go too, with the files they moved but never registered."""
    loads = [f"{storage.BULK_STAGING}/{load}" for load in sweep_bulk_loads(catalog, root, grace_seconds)]
    folder = root / str(db_id)
    if not folder.is_dir():
        return loads
    with catalog.engine.begin() as guard:
        # Every write holds its database's order row from its start to its commit (locks.lock_orders). Locked
        # now: a write is in flight, and its chunk files (older than the grace period if it streams for long)
        # have no committed row yet: sweep another time. Held while sweeping, so no write starts meanwhile.
        if not locks.try_lock_orders(guard, db_id):
            return loads
        return loads + _sweep_unreferenced(catalog, root, db_id, grace_seconds, folder)


def _sweep_unreferenced(catalog: Catalog, root: Path, db_id: int, grace_seconds: float, folder: Path) -> list[str]:
    with catalog.engine.connect() as conn:
        known = storage.database_paths(conn, db_id)
    cutoff = time.time() - grace_seconds
    removed = []
    # Every `<table id>/<partition id>/` folder, the catalog's or not: a write killed after creating its table or
    # partition leaves folders of ids its rolled-back transaction never committed (ids are never reused), and only
    # a sweep that visits them removes their files. No row can name a file there, and no write into the database
    # is in flight (the caller holds its order row), so what is old enough is a dead command's.
    for table_dir in folder.iterdir():
        if not storage.ID_NAME.fullmatch(table_dir.name) or table_dir.is_symlink() or not table_dir.is_dir():
            continue
        table_old = _older_than(table_dir, cutoff)
        for part_dir in table_dir.iterdir():
            if not storage.ID_NAME.fullmatch(part_dir.name) or part_dir.is_symlink() or not part_dir.is_dir():
                continue
            part_old = _older_than(part_dir, cutoff)  # before this sweep's own unlinks touch it
            for entry in part_dir.iterdir():
                rel = f"{db_id}/{table_dir.name}/{part_dir.name}/{entry.name}"
                if not (storage.CHUNK_FILE.fullmatch(entry.name) or storage.CHUNK_TEMP.fullmatch(entry.name)) \
                        or rel in known:
                    continue
                try:
                    st = entry.lstat()
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st.st_mode) or st.st_mtime > cutoff:
                    continue
                # Checked again just before deleting: a row committed since the listing above names it.
                if storage.referenced(catalog, rel):
                    continue
                entry.unlink(missing_ok=True)
                removed.append(rel)
            if part_old:
                _remove_if_empty(part_dir)
        if table_old:
            _remove_if_empty(table_dir)
    return removed


def _older_than(path: Path, cutoff: float) -> bool:
    """Whether `path` was last changed (an entry added or removed) before `cutoff`: a folder a writer has just
    created, or just put a file in, is young."""
    try:
        return path.lstat().st_mtime <= cutoff
    except FileNotFoundError:
        return False


def _remove_if_empty(folder: Path) -> None:
    """rmdir: it removes only an empty folder, atomically, so a file put in meanwhile keeps it (never a recursive
    delete)."""
    try:
        folder.rmdir()
    except OSError:  # not empty (or gone already)
        pass


# --- compaction's strays ------------------------------------------------------------------------------------------


def sweep_compaction_strays(catalog: Catalog, root: Path, partition_ids: Sequence[int]) -> int:
    """Delete compaction outputs the catalog does not name (left by a compaction killed before its swap) in the
    given partitions' folders. Only under the partition's compaction lock: a compaction in flight holds it, so
    its staged outputs are never taken for strays; a partition whose lock is held is left for the next sweep."""
    removed = 0
    with catalog.engine.connect() as conn:
        for pid in partition_ids:
            if not locks.try_lock(conn, locks.compaction_key(pid)):
                continue
            try:
                removed += sweep_locked_partition(conn, root, pid)
            finally:
                locks.unlock(conn, locks.compaction_key(pid))
                conn.commit()
    return removed


def sweep_locked_partition(conn: sa.Connection, root: Path, partition_id: int) -> int:
    """The sweep of one partition whose compaction lock `conn` holds."""
    row = conn.execute(sa.select(partitions.c.table_id, tables.c.database_id)
                       .join_from(partitions, tables, partitions.c.table_id == tables.c.id)
                       .where(partitions.c.id == partition_id)).first()
    if row is None:
        return 0
    rel = storage.partition_folder(int(row.database_id), int(row.table_id), partition_id)
    folder = root / rel
    if not folder.is_dir():
        return 0
    known = storage.partition_paths(conn, partition_id)
    removed = 0
    for entry in folder.iterdir():
        if storage.COMPACTED_FILE.fullmatch(entry.name) and f"{rel}/{entry.name}" not in known and entry.is_file():
            entry.unlink(missing_ok=True)
            removed += 1
    return removed


# --- dead bulk loads ----------------------------------------------------------------------------------------------


def sweep_bulk_loads(catalog: Catalog, root: Path, grace_seconds: float) -> list[str]:
    """Remove what dead bulk loads left: a staging folder untouched for `grace_seconds` whose load lock is free
    (its driver is gone), with every file its manifest names that no catalog row names. Returns the removed
    load ids. A live load holds its lock, so it is never touched however long it runs."""
    base = root / storage.BULK_STAGING
    if not base.is_dir() or base.is_symlink():
        return []
    cutoff = time.time() - grace_seconds
    removed = []
    for entry in base.iterdir():
        if not storage.BULK_LOAD_ID.fullmatch(entry.name) or entry.is_symlink() or not entry.is_dir():
            continue
        if _newest_mtime(entry) > cutoff:
            continue
        key = locks.bulk_load_key(entry.name)
        with catalog.engine.connect() as conn:
            if not locks.try_lock(conn, key):
                continue  # the load is running
            try:
                for rel in _manifest(entry):
                    if not storage.referenced(catalog, rel):
                        (root / rel).unlink(missing_ok=True)
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry.name)
            finally:
                locks.unlock(conn, key)
                conn.commit()
    return removed


def _newest_mtime(folder: Path) -> float:
    newest = folder.lstat().st_mtime
    for child in folder.iterdir():
        with contextlib.suppress(FileNotFoundError):
            newest = max(newest, child.lstat().st_mtime)
    return newest


def _manifest(folder: Path) -> list[str]:
    """The final paths a load moved its files to; only well-formed chunk paths (the file is the load's own, but
    a path from it must never reach outside the warehouse's chunk layout)."""
    try:
        names = json.loads((folder / storage.BULK_MANIFEST).read_text())
    except (FileNotFoundError, ValueError):
        return []
    if not isinstance(names, list):
        return []
    return [n for n in names if isinstance(n, str) and storage.CHUNK_PATH.fullmatch(n)]
