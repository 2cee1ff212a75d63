"""Every sweep of the warehouse, in one place: partitions past their database's retention (`expire_partitions`,
which retires them), retired files past their grace period (`collect_garbage`), chunk files no catalog row names
(`sweep_unreferenced`), compaction outputs a killed compaction left (`sweep_compaction_strays`), dead bulk loads'
staging (`sweep_bulk_loads`) and what a dropped database left on a store that failed mid-drop
(`sweep_dropped_databases`). Persist runs them all; a compaction expires partitions and sweeps its own partitions'
strays first and collects garbage last; the `iox_persist` DAG expires and collects every database
(`expire_databases`). Each deletes only names iox-batch gives (`storage.py`), only what no catalog row names, and
only under the lock that keeps the files' owner away.

The warehouse is a local folder or a store (`objectstore.Root`) the sweeps can only list: they find candidates by
listing a database's (or a partition's, or `_bulk`'s) prefix, ask the catalog about them in batches
(`storage.named_paths`), and judge a file's age by its mtime (a store's last-modified time). A catalog error
keeps every file it leaves unanswered."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import sqlalchemy as sa

from iox_planner import storage
from iox_planner import timeutil
from iox_planner.catalog import locks
from iox_planner.catalog.retention import ExpiredPartition, cutoff, expired_partitions, retention_of
from iox_planner.catalog.schema import database_drops, databases, partitions, tables
from iox_planner.catalog.store import Catalog
from iox_planner.deletion import delete_files, delete_folder
from iox_planner.model import LOCAL_STORE, ChunkKind
from iox_planner.objectstore import ObjectInfo, Root, store_errors

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


def expire_databases(catalog: Catalog, root: Root | Path, grace_seconds: float,
                     only: Sequence[str] = ()) -> list[tuple[str, ExpiredPartition, int]]:
    """The maintenance DAG's sweep: expire the partitions of every database with a retention (those `only` names,
    default all), then delete what was retired longer ago than the grace period, and what dropped databases left.
    Returns what was retired."""
    query = sa.select(databases.c.id, databases.c.name).where(databases.c.retention_ns.is_not(None))
    if only:
        query = query.where(databases.c.name.in_(list(only)))
    with catalog.engine.connect() as conn:
        found = [(int(r.id), r.name) for r in conn.execute(query.order_by(databases.c.name))]
    done = [(name, part, count) for db_id, name in found for part, count in expire_partitions(catalog, db_id)]
    collect_garbage(catalog, root, grace_seconds)
    sweep_dropped_databases(catalog, root)
    return done


# --- listing and deleting -----------------------------------------------------------------------------------------


def _listing(root: Root, prefix: str, folders: dict[str, float] | None = None) -> Iterator[ObjectInfo]:
    """Every file under `prefix` (relative to the root). A local folder is walked without following a symbolic
    link (a link is never ours: a sweep must not reach outside the warehouse through one), and `folders` gets each
    folder found with its mtime (what `_remove_empty_folders` goes by); a store is listed (`Root.list`)."""
    if not root.is_local:
        yield from root.list(prefix)
        return
    base = str(root.local_path)  # strings, not Paths: a sweep lists every file of a database
    if prefix and os.path.islink(os.path.join(base, prefix)):
        return
    stack = [prefix]
    while stack:
        rel = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(base, rel) if rel else base))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            child = f"{rel}/{entry.name}" if rel else entry.name
            try:
                if entry.is_symlink():
                    continue
                if entry.is_dir(follow_symlinks=False):
                    stack.append(child)
                    if folders is not None:
                        folders[child] = entry.stat(follow_symlinks=False).st_mtime
                elif entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    yield ObjectInfo(child, st.st_size, st.st_mtime)
            except FileNotFoundError:  # removed meanwhile
                continue


def _delete_unnamed(catalog: Catalog, root: Root, rels: Sequence[str]) -> list[str]:
    """Delete those of `rels` no catalog row names, asking the catalog a batch at a time just before deleting the
    batch (a row committed since the listing keeps its file). A catalog error stops the sweep there: every file not
    yet answered for is kept. Returns the deleted paths."""
    removed: list[str] = []
    for start in range(0, len(rels), storage.NAMED_BATCH):
        batch = rels[start:start + storage.NAMED_BATCH]
        named = storage.named_paths(catalog, batch)
        gone = [rel for rel in batch if rel not in named]
        delete_files(root, gone)
        removed.extend(gone)
    return removed


# --- retired files ------------------------------------------------------------------------------------------------


def collect_garbage(catalog: Catalog, root: Root | Path, grace_seconds: float) -> int:
    """Delete files retired longer ago than the grace period, then their rows. Returns how many."""
    where = storage.warehouse_of(root)
    with catalog.engine.begin() as conn:
        expired = catalog.expired_chunks(conn, grace_seconds)
        for kind in ChunkKind:
            ids = [cid for k, cid, _, _ in expired if k is kind]
            if ids:
                catalog.delete_chunk_rows(conn, kind, ids)
    # Rows go first: a crash (or a store gone away) between the two leaves an orphan file, which
    # `sweep_unreferenced` takes, never a row naming a missing file.
    delete_files(where, [path for _, _, store, path in expired if store == LOCAL_STORE])
    return len(expired)


# --- unreferenced chunk files -------------------------------------------------------------------------------------

# A chunk file is written before its catalog row commits (ingest/write.py, persist), so a command killed between
# the two leaves a file no row names, and one killed inside `write_parquet_atomic` leaves its hidden temporary (a
# local warehouse's; a store's put leaves nothing or the whole object). Nothing else ever deletes those: this
# sweep does, for one database, once they are older than the grace period (a file younger than that may belong to
# a write still in flight). Only names iox-batch itself gives chunk files (`storage.CHUNK_FILE`,
# `storage.CHUNK_TEMP`), in `<db id>/<table id>/<partition id>/` folders (ids: digits only), are candidates.

_IN_PARTITION = re.compile(r"([0-9]+)/([0-9]+)/([0-9]+)/([^/]+)")


def _chunk_candidate(db_id: int, rel: str) -> bool:
    found = _IN_PARTITION.fullmatch(rel)
    return (found is not None and found.group(1) == str(db_id)
            and bool(storage.CHUNK_FILE.fullmatch(found.group(4)) or storage.CHUNK_TEMP.fullmatch(found.group(4))))


def sweep_unreferenced(catalog: Catalog, root: Root | Path, db_id: int, grace_seconds: float) -> list[str]:
    """Delete database `db_id`'s chunk files (and chunk temporaries) that no catalog row names, live or retired,
    once older than `grace_seconds`, unless a write into the database is in flight; then, in a local warehouse,
    its table and partition folders left empty, if they were older than `grace_seconds` too. Returns the deleted
    files' warehouse-relative paths. Dead bulk loads' staging (`_bulk/<load id>`, any database's: a load into a
    new database has no database id yet) goes too, with the files they moved but never registered."""
    where = storage.warehouse_of(root)
    loads = [f"{storage.BULK_STAGING}/{load}" for load in sweep_bulk_loads(catalog, where, grace_seconds)]
    if where.is_local and not (where.local_path / str(db_id)).is_dir():
        return loads
    with catalog.engine.begin() as guard:
        # Every write holds its database's order row from its start to its commit (locks.lock_orders). Locked
        # now: a write is in flight, and its chunk files (older than the grace period if it streams for long)
        # have no committed row yet: sweep another time. Held while sweeping, so no write starts meanwhile.
        if not locks.try_lock_orders(guard, db_id):
            return loads
        return loads + _sweep_unreferenced(catalog, where, db_id, grace_seconds)


def _sweep_unreferenced(catalog: Catalog, root: Root, db_id: int, grace_seconds: float) -> list[str]:
    cutoff = time.time() - grace_seconds
    folders: dict[str, float] = {}
    # Every `<table id>/<partition id>/` folder, the catalog's or not: a write killed after creating its table or
    # partition leaves files under ids its rolled-back transaction never committed (ids are never reused), and
    # only a sweep that lists them removes them. No write into the database is in flight (the caller holds its
    # order row), so what no row names and is old enough is a dead command's.
    old = sorted(o.rel for o in _listing(root, str(db_id), folders)
                 if o.mtime <= cutoff and _chunk_candidate(db_id, o.rel))
    removed = _delete_unnamed(catalog, root, old)
    if root.is_local:
        _remove_empty_folders(root.local_path, db_id, folders, cutoff)
    return removed


_TABLE_OR_PARTITION = re.compile(r"[0-9]+/[0-9]+(/[0-9]+)?")


def _remove_empty_folders(base: Path, db_id: int, folders: dict[str, float], cutoff: float) -> None:
    """rmdir the database's table and partition folders (ids only) that were older than `cutoff` when listed (a
    folder a writer has just created, or just put a file in, is young), partitions before their tables. rmdir
    removes only an empty folder, atomically, so a file put in meanwhile keeps it (never a recursive delete)."""
    prefix = f"{db_id}/"
    for rel in sorted(folders, key=lambda r: r.count("/"), reverse=True):
        if rel.startswith(prefix) and _TABLE_OR_PARTITION.fullmatch(rel) and folders[rel] <= cutoff:
            try:
                os.rmdir(os.path.join(base, rel))
            except OSError:  # not empty (or gone already)
                pass


# --- compaction's strays ------------------------------------------------------------------------------------------


def sweep_compaction_strays(catalog: Catalog, root: Root | Path, partition_ids: Sequence[int]) -> int:
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


def sweep_locked_partition(conn: sa.Connection, root: Root | Path, partition_id: int) -> int:
    """The sweep of one partition whose compaction lock `conn` holds."""
    where = storage.warehouse_of(root)
    row = conn.execute(sa.select(partitions.c.table_id, tables.c.database_id)
                       .join_from(partitions, tables, partitions.c.table_id == tables.c.id)
                       .where(partitions.c.id == partition_id)).first()
    if row is None:
        return 0
    folder = storage.partition_folder(int(row.database_id), int(row.table_id), partition_id)
    strays = [o.rel for o in _listing(where, folder)
              if o.rel.rpartition("/")[0] == folder and storage.COMPACTED_FILE.fullmatch(o.rel.rpartition("/")[2])]
    if not strays:
        return 0
    known = storage.partition_paths(conn, partition_id)
    strays = [rel for rel in strays if rel not in known]
    delete_files(where, strays)
    return len(strays)


# --- dead bulk loads ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _load_lock(catalog: Catalog, load_id: str) -> Iterator[bool]:
    """Whether the bulk load `load_id` is dead (its lock was free, and is held by this sweep until the block ends):
    a live load holds its lock from its first task to its COMMIT, so a sweep never touches one however long it
    runs."""
    key = locks.bulk_load_key(load_id)
    with catalog.engine.connect() as conn:
        if not locks.try_lock(conn, key):
            yield False
            return
        try:
            yield True
        finally:
            locks.unlock(conn, key)
            conn.commit()


def sweep_bulk_loads(catalog: Catalog, root: Root | Path, grace_seconds: float) -> list[str]:
    """Remove what dead bulk loads left: a staging folder untouched for `grace_seconds` whose load lock is free
    (its driver is gone), with every file its manifest names that no catalog row names. Returns the removed
    load ids. A live load holds its lock, so it is never touched however long it runs."""
    where = storage.warehouse_of(root)
    if where.is_local and (where.local_path / storage.BULK_STAGING).is_symlink():
        return []
    cutoff = time.time() - grace_seconds
    removed = []
    for load_id, (newest, staged) in sorted(_staged_loads(where).items()):
        if newest > cutoff:
            continue
        with _load_lock(catalog, load_id) as dead:
            if not dead:
                continue  # the load is running
            staging = f"{storage.BULK_STAGING}/{load_id}"
            _delete_unnamed(catalog, where, sorted(set(_manifest(where, staging))))
            if where.is_local:  # the folders too
                delete_folder(where, staging)
            else:
                delete_files(where, staged)
            removed.append(load_id)
    if not where.is_local:
        removed += _sweep_store_loads(catalog, where, cutoff)
    return removed


def _sweep_store_loads(catalog: Catalog, root: Root, cutoff: float) -> list[str]:
    """On a store a bulk load's chunks stay where its tasks put them (`_loads/<load id>/<uuid>.parquet`, the keys
    its rows name): a load that failed or was killed before its COMMIT leaves objects no row names. Each load
    folder whose newest object is older than the cutoff and whose load lock is free loses those; what rows name
    (a committed load's chunks) stays. Returns the load ids swept."""
    loads: dict[str, tuple[float, list[str]]] = {}
    for item in root.list(storage.BULK_LOADS):
        if not storage.BULK_CHUNK_PATH.fullmatch(item.rel):
            continue
        load_id = item.rel.split("/")[1]
        newest, files = loads.setdefault(load_id, (0.0, []))
        files.append(item.rel)
        loads[load_id] = (max(newest, item.mtime), files)
    swept = []
    for load_id, (newest, files) in sorted(loads.items()):
        if newest > cutoff:
            continue
        with _load_lock(catalog, load_id) as dead:
            if dead and _delete_unnamed(catalog, root, sorted(files)):
                swept.append(load_id)
    return swept


def _staged_loads(root: Root) -> dict[str, tuple[float, list[str]]]:
    """Each bulk load's staging under `_bulk/`: its newest mtime (a local folder's own counts: a file added or
    removed changes it) and its files."""
    folders: dict[str, float] = {}
    found: dict[str, tuple[float, list[str]]] = {}
    for item in _listing(root, storage.BULK_STAGING, folders):
        parts = item.rel.split("/")
        if len(parts) < 3 or not storage.BULK_LOAD_ID.fullmatch(parts[1]):
            continue
        newest, files = found.setdefault(parts[1], (0.0, []))
        files.append(item.rel)
        found[parts[1]] = (max(newest, item.mtime), files)
    for rel, mtime in folders.items():
        parts = rel.split("/")
        if len(parts) == 2 and storage.BULK_LOAD_ID.fullmatch(parts[1]):
            newest, files = found.get(parts[1], (0.0, []))
            found[parts[1]] = (max(newest, mtime), files)
    return found


def _manifest(root: Root, staging: str) -> list[str]:
    """The final paths a load moved its files to; only well-formed chunk paths (the file is the load's own, but
    a path from it must never reach outside the warehouse's chunk layout)."""
    try:
        names = json.loads(root.read_bytes(f"{staging}/{storage.BULK_MANIFEST}"))
    except (FileNotFoundError, ValueError):
        return []
    if not isinstance(names, list):
        return []
    return [n for n in names if isinstance(n, str) and storage.CHUNK_PATH.fullmatch(n)]


# --- dropped databases --------------------------------------------------------------------------------------------


def sweep_dropped_databases(catalog: Catalog, root: Root | Path) -> list[int]:
    """Delete what dropped databases left in the warehouse: `drop_database` deletes a database's files right
    after its catalog rows, and a store that failed meanwhile (or a killed command) leaves some. A dropped
    database's id is never used again, so every file under it is garbage at once. One listing of the warehouse's
    top level (not of every file) finds them. Returns the ids swept."""
    where = storage.warehouse_of(root)
    present = set(_top_level_ids(where))
    if not present:
        return []
    with catalog.engine.connect() as conn:
        dropped = set(conn.execute(sa.select(database_drops.c.database_id)
                                   .where(database_drops.c.database_id.in_(sorted(present)))).scalars())
    for db_id in sorted(dropped):
        delete_folder(where, str(db_id))
    return sorted(dropped)


def _top_level_ids(root: Root) -> Iterable[int]:
    """The database ids with a folder (a prefix) at the warehouse's top level."""
    if root.is_local:
        try:
            entries = list(os.scandir(root.local_path))
        except FileNotFoundError:
            return []
        return [int(e.name) for e in entries
                if storage.ID_NAME.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
    import pyarrow.fs as pafs

    with store_errors(root, "list", ""):
        found = root.filesystem().get_file_info(pafs.FileSelector(root.base, recursive=False, allow_not_found=True))
    names = [item.path.rpartition("/")[2] for item in found if item.type == pafs.FileType.Directory]
    return [int(name) for name in names if storage.ID_NAME.fullmatch(name)]
