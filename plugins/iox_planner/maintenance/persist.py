"""Persist: ingester chunks become sorted, deduplicated Parquet files (one per partition), and which partitions
a scheduled persist should pick (those whose ingester chunks pile up). Files are written before their catalog
rows commit and removed again if the commit fails."""

from __future__ import annotations

import re
import stat
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import pyarrow.compute as pc
import sqlalchemy as sa

from iox_planner.catalog.names import check_name, excerpt
from iox_planner.catalog.schema import (databases, database_orders, ingester_chunks, parquet_files, partitions,
                                       tables)
from iox_planner.catalog.store import Catalog, ChunkRow
from iox_planner.config import warehouse as default_warehouse
from iox_planner.errors import BadInputError, CatalogError
from iox_planner.faults import kill_point
from iox_planner.ingest import files as storage
from iox_planner.ingest.write import Staged, chunk_path
from iox_planner.model import LOCAL_STORE, TIME, ChunkKind

DEFAULT_GRACE_SECONDS = 3600.0


# --- persist -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PersistResult:
    table: str
    partition: str
    chunks_in: int
    rows_in: int
    rows_out: int
    file_id: str
    order: int


def persist(
    catalog: Catalog,
    db: str,
    *,
    table: str | None = None,
    warehouse: Path | None = None,
    grace_seconds: float | None = None,
    after_read: Callable[[], None] | None = None,
) -> list[PersistResult]:
    """Turn each partition's ingester chunks into one deduplicated Parquet file sorted on the partition sort key.

    Per partition, in one transaction: lock the partition (another persist waits; writes go on), read its live
    ingester chunks, merge them, write the file, register it and retire exactly the chunks read. A write landing
    meanwhile is a chunk this persist did not read, so it stays. Retired files are deleted after a grace period.
    """
    root = warehouse or default_warehouse()
    if table is not None:
        check_name(table, "table name")
    with catalog.engine.connect() as conn:
        db_id = catalog.database_id(conn, db)
        if table is not None and table not in catalog.table_ids(conn, db_id):
            known = ", ".join(sorted(catalog.table_ids(conn, db_id))) or "none"
            raise CatalogError(f"table {excerpt(table)} does not exist in database {db!r} (tables: {known})")
        rows = catalog.chunk_rows(conn, db_id, table=table)
    by_partition: dict[int, list[ChunkRow]] = defaultdict(list)
    for row in rows:
        by_partition[row.partition_id].append(row)
    targets = [pid for pid, chunks in by_partition.items() if any(c.kind is ChunkKind.INGESTER for c in chunks)]
    # Refuse up front, before changing anything, where merging would reorder writes.
    for pid in targets:
        _check_mergeable(by_partition[pid])
    results = []
    for pid in sorted(targets, key=lambda p: (by_partition[p][0].table, by_partition[p][0].partition)):
        result = _persist_partition(catalog, db_id, pid, root, after_read)
        if result is not None:
            results.append(result)
    grace = DEFAULT_GRACE_SECONDS if grace_seconds is None else grace_seconds
    collect_garbage(catalog, root, grace)
    sweep_unreferenced(catalog, root, db_id, grace)
    sweep_compaction_strays(catalog, root, targets)
    return results


def _check_mergeable(chunks: Sequence[ChunkRow]) -> None:
    ingester = [c for c in chunks if c.kind is ChunkKind.INGESTER]
    parquet = [c for c in chunks if c.kind is ChunkKind.PARQUET]
    if not ingester or not parquet:
        return
    oldest = min(ingester, key=lambda c: c.order)
    newest_file = max(parquet, key=lambda c: c.order)
    if oldest.order < newest_file.order:
        raise CatalogError(
            f"cannot persist {oldest.table} partition {oldest.partition}: ingester chunk {oldest.display_id} "
            f"(order {oldest.order}) is older than Parquet file {newest_file.display_id} (order "
            f"{newest_file.order}); merging it into a new file would let it override newer data. This can only "
            "come from a scenario file: give the ingester chunks higher orders than the Parquet files"
        )


def _persist_partition(
    catalog: Catalog, db_id: int, partition_id: int, root: Path, after_read: Callable[[], None] | None
) -> PersistResult | None:
    staged = Staged(root)
    with staged.transaction(catalog) as conn:
        fixed_key = catalog.lock_partition(conn, partition_id)
        chunks = catalog.chunk_rows(conn, db_id, partition_id=partition_id)
        _check_mergeable(chunks)
        ingester = [c for c in chunks if c.kind is ChunkKind.INGESTER]
        if not ingester:
            return None
        if after_read is not None:
            after_read()
        first = ingester[0]
        table_columns = catalog.table_columns(conn, first.table_id)
        parts = [(c.order, storage.read_chunk(root / c.path, c.display_id)) for c in ingester]
        columns = {name: table_columns[name] for c in ingester for name in c.column_names}
        merged = storage.deduplicate(parts, columns)
        key = storage.partition_sort_key(fixed_key, columns, merged)
        if list(key) != list(fixed_key or []):
            catalog.set_sort_key(conn, partition_id, key)
        file_key = [c for c in key if c in columns]
        merged = storage.sort_table(merged, file_key)
        rel = chunk_path(db_id, first.table_id, partition_id)
        staged.paths.append(root / rel)
        size = storage.write_parquet_atomic(merged, root / rel, metadata={"iox.kind": "parquet"})
        order = max(c.order for c in ingester)
        mm = pc.min_max(merged[TIME]).as_py()
        file_id = catalog.insert_chunk(conn, ChunkKind.PARQUET, dict(
            object_id=Path(rel).stem, label=None, table_id=first.table_id, partition_id=partition_id,
            store=LOCAL_STORE, path=rel, min_time=mm["min"], max_time=mm["max"], row_count=merged.num_rows,
            file_size=size, column_names=storage.column_layout(columns),
            tag_ranges={k: list(v) for k, v in storage.tag_ranges(merged, columns).items()},
            chunk_order=order, sort_key=file_key,
        ))
        catalog.retire_chunks(conn, ChunkKind.INGESTER, [c.id for c in ingester])
        kill_point("persist.before_commit")
        return PersistResult(first.table, first.partition, len(ingester), sum(c.row_count for c in ingester),
                             merged.num_rows, f"P{file_id}", order)


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


# A chunk file is written before its catalog row commits (write.py, persist above), so a command killed between
# the two leaves a file no row names, and one killed inside `write_parquet_atomic` leaves its hidden temporary.
# Nothing else ever deletes those: this sweep does, for one database, once they are older than the grace period
# (a file younger than that may belong to a write still in flight). Only names iox-batch itself gives chunk
# files, in `<db id>/<table id>/<partition id>/` folders (ids: digits only), are candidates.
_CHUNK_FILE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.parquet")
_CHUNK_TEMP = re.compile(r"\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.parquet\.[0-9a-f]{32}\.tmp")


def sweep_unreferenced(catalog: Catalog, root: Path, db_id: int, grace_seconds: float) -> list[str]:
    """Delete database `db_id`'s chunk files (and chunk temporaries) that no catalog row names, live or retired,
    once older than `grace_seconds`, unless a write into the database is in flight; then its table and partition
    folders left empty, if they were older than `grace_seconds` too. Returns the deleted files' warehouse-relative
    paths. Dead bulk loads' staging folders (`_bulk/<load id>`, any database's: a load into a
    new database has no database id yet) go too, with the files they moved but never registered (`bulk.py`)."""
    from iox_planner.ingest.bulk import STAGING, sweep_bulk_loads

    loads = [f"{STAGING}/{load}" for load in sweep_bulk_loads(catalog, root, grace_seconds)]
    folder = root / str(db_id)
    if not folder.is_dir():
        return loads
    with catalog.engine.begin() as guard:
        # Every write holds its database's order row from its start to its commit (catalog.lock_orders). Locked
        # now: a write is in flight, and its chunk files (older than the grace period if it streams for long)
        # have no committed row yet: sweep another time. Held while sweeping, so no write starts meanwhile.
        if guard.execute(sa.select(database_orders.c.database_id).where(database_orders.c.database_id == db_id)
                         .with_for_update(skip_locked=True)).first() is None:
            return loads
        return loads + _sweep_unreferenced(catalog, root, db_id, grace_seconds, folder)


def _sweep_unreferenced(catalog: Catalog, root: Path, db_id: int, grace_seconds: float, folder: Path) -> list[str]:
    import time

    with catalog.engine.connect() as conn:
        known: set[str] = set()
        for ct in (parquet_files, ingester_chunks):
            rows = conn.execute(sa.select(ct.c.path).join(tables, ct.c.table_id == tables.c.id)
                                .where(tables.c.database_id == db_id))
            known.update(r.path for r in rows)
    cutoff = time.time() - grace_seconds
    removed = []
    # Every `<table id>/<partition id>/` folder, the catalog's or not: a write killed after creating its table or
    # partition leaves folders of ids its rolled-back transaction never committed (ids are never reused), and only
    # a sweep that visits them removes their files. No row can name a file there, and no write into the database
    # is in flight (the caller holds its order row), so what is old enough is a dead command's.
    for table_dir in folder.iterdir():
        if not _ID.fullmatch(table_dir.name) or table_dir.is_symlink() or not table_dir.is_dir():
            continue
        table_old = _older_than(table_dir, cutoff)
        for part_dir in table_dir.iterdir():
            if not _ID.fullmatch(part_dir.name) or part_dir.is_symlink() or not part_dir.is_dir():
                continue
            part_old = _older_than(part_dir, cutoff)  # before this sweep's own unlinks touch it
            for entry in part_dir.iterdir():
                rel = f"{db_id}/{table_dir.name}/{part_dir.name}/{entry.name}"
                if not (_CHUNK_FILE.fullmatch(entry.name) or _CHUNK_TEMP.fullmatch(entry.name)) or rel in known:
                    continue
                try:
                    st = entry.lstat()
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st.st_mode) or st.st_mtime > cutoff:
                    continue
                # Checked again just before deleting: a row committed since the listing above names it.
                if _referenced(catalog, rel):
                    continue
                entry.unlink(missing_ok=True)
                removed.append(rel)
            if part_old:
                _remove_if_empty(part_dir)
        if table_old:
            _remove_if_empty(table_dir)
    return removed


_ID = re.compile(r"[0-9]+")


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


def _referenced(catalog: Catalog, rel: str) -> bool:
    with catalog.engine.connect() as conn:
        return any(conn.execute(sa.select(ct.c.id).where(ct.c.path == rel).limit(1)).first() is not None
                   for ct in (parquet_files, ingester_chunks))


COMPACTED_SUFFIX = ".compacted.parquet"
"""Compaction names its outputs `<uuid>.compacted.parquet`, so a sweep knows a stray one from a write's or a
persist's file in flight (which it must never touch)."""
_STRAY = re.compile(r"^\.?[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.compacted\.parquet"
                    r"(\.[0-9a-f]{32}\.tmp)?$")


def sweep_compaction_strays(catalog: Catalog, root: Path, partition_ids: Sequence[int]) -> int:
    """Delete compaction outputs the catalog does not name (left by a compaction killed before its swap) in the
    given partitions' folders. Only under the partition's compaction lock: a compaction in flight holds it, so
    its staged outputs are never taken for strays; a partition whose lock is held is left for the next sweep."""
    removed = 0
    with catalog.engine.connect() as conn:
        for pid in partition_ids:
            if not catalog.try_lock_compaction(conn, pid):
                continue
            try:
                removed += sweep_locked_partition(catalog, conn, root, pid)
            finally:
                catalog.unlock_compaction(conn, pid)
                conn.commit()
    return removed


def sweep_locked_partition(catalog: Catalog, conn: sa.Connection, root: Path, partition_id: int) -> int:
    """The sweep of one partition whose compaction lock `conn` holds."""
    row = conn.execute(sa.select(partitions.c.table_id, tables.c.database_id)
                       .join_from(partitions, tables, partitions.c.table_id == tables.c.id)
                       .where(partitions.c.id == partition_id)).first()
    if row is None:
        return 0
    rel = f"{int(row.database_id)}/{int(row.table_id)}/{partition_id}"
    folder = root / rel
    if not folder.is_dir():
        return 0
    known = catalog.partition_paths(conn, partition_id)
    removed = 0
    for entry in folder.iterdir():
        if _STRAY.fullmatch(entry.name) and f"{rel}/{entry.name}" not in known and entry.is_file():
            entry.unlink(missing_ok=True)
            removed += 1
    return removed


# --- persisting on a schedule ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PileUp:
    """A partition holding at least the threshold's number of live ingester chunks."""

    db: str
    table: str
    partition: str
    chunks: int


def piled_up_partitions(catalog: Catalog, threshold: int, only: Sequence[str] = ()) -> list[PileUp]:
    """Partitions whose live ingester chunks number `threshold` or more, in the databases `only` names (default:
    every database)."""
    if threshold < 1:
        raise BadInputError(f"the persist threshold must be at least 1 chunk, not {threshold}")
    count = sa.func.count().label("chunks")
    query = (
        sa.select(databases.c.name.label("db"), tables.c.name.label("table_name"), partitions.c.partition_key, count)
        .select_from(ingester_chunks)
        .join(tables, ingester_chunks.c.table_id == tables.c.id)
        .join(databases, tables.c.database_id == databases.c.id)
        .join(partitions, ingester_chunks.c.partition_id == partitions.c.id)
        .where(ingester_chunks.c.to_delete.is_(None))
        .where(databases.c.name.in_(list(only)) if only else sa.true())
        .group_by(databases.c.name, tables.c.name, partitions.c.partition_key)
        .having(count >= threshold)
        .order_by(databases.c.name, tables.c.name, partitions.c.partition_key)
    )
    with catalog.engine.connect() as conn:
        return [PileUp(r.db, r.table_name, r.partition_key, int(r.chunks)) for r in conn.execute(query)]


def tables_to_persist(piles: Sequence[PileUp]) -> list[tuple[str, str]]:
    """The (db, table) pairs to persist, each once, in order."""
    seen: dict[tuple[str, str], None] = {}
    for pile in piles:
        seen.setdefault((pile.db, pile.table), None)
    return list(seen)
