"""Persist: ingester chunks become sorted, deduplicated Parquet files (one per partition), and which partitions
a scheduled persist should pick (those whose ingester chunks pile up). Files are written before their catalog
rows commit and removed again if the commit fails; each persist then runs the sweeps (`sweeps.py`)."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa

from iox_planner import storage
from iox_planner.catalog import locks
from iox_planner.catalog.names import check_name, excerpt
from iox_planner.catalog.schema import databases, ingester_chunks, partitions, tables
from iox_planner.catalog.store import Catalog, ChunkRow
from iox_planner.errors import BadInputError, CatalogError, clip_message
from iox_planner.faults import kill_point
from iox_planner.ingest import files as chunk_files
from iox_planner.maintenance.sweeps import (DEFAULT_GRACE_SECONDS, collect_garbage, expire_partitions,
                                            sweep_compaction_strays, sweep_unreferenced)
from iox_planner.model import LOCAL_STORE, TIME, ChunkKind, ColumnType
from iox_planner.objectstore import Root

_log = logging.getLogger(__name__)


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
    partition_id: int


def persist(
    catalog: Catalog,
    db: str,
    *,
    table: str | None = None,
    warehouse: Root | Path | None = None,
    grace_seconds: float | None = None,
    after_read: Callable[[], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> list[PersistResult]:
    """Turn each partition's ingester chunks into one deduplicated Parquet file sorted on the partition sort key.

    Per partition, in one transaction: lock the partition (another persist waits; writes go on), read its live
    ingester chunks, merge them, write the file, register it and retire exactly the chunks read. A write landing
    meanwhile is a chunk this persist did not read, so it stays. Retired files are deleted after a grace period.
    Partitions past the database's retention are retired first (`sweeps.expire_partitions`), not persisted.
    The sweeps run last; their failure is passed to `warn` (default: the module's logger), never raised.
    """
    root = storage.warehouse_of(warehouse)
    if table is not None:
        check_name(table, "table name")
    with catalog.engine.connect() as conn:
        db_id = catalog.database_id(conn, db)
        if table is not None and table not in catalog.table_ids(conn, db_id):
            known = ", ".join(sorted(catalog.table_ids(conn, db_id))) or "none"
            raise CatalogError(f"table {excerpt(table)} does not exist in database {db!r} (tables: {known})")
    expire_partitions(catalog, db_id)
    with catalog.engine.connect() as conn:
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
    kill_point("persist.before_sweeps")
    try:
        collect_garbage(catalog, root, grace)
        sweep_unreferenced(catalog, root, db_id, grace)
        sweep_compaction_strays(catalog, root, targets)
    except Exception as err:  # noqa: BLE001 - the persist committed; a sweep left undone is the next one's
        # A command that changed the catalog must not end as failed: the sweeps only reclaim space, and every
        # later persist, compaction or maintenance run sweeps again.
        first = str(err).strip().splitlines()  # a driver's message runs to several lines: the first says it
        (warn or _log.warning)(
            f"the persist is committed, but cleaning up old files failed and is left for the next persist or "
            f"maintenance run: {clip_message(first[0]) if first else type(err).__name__}")
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
    catalog: Catalog, db_id: int, partition_id: int, root: Root, after_read: Callable[[], None] | None
) -> PersistResult | None:
    staged = storage.Staged(root)
    with staged.transaction(catalog) as conn:
        fixed_key = locks.lock_partition(conn, partition_id)
        chunks = catalog.chunk_rows(conn, db_id, partition_id=partition_id)
        _check_mergeable(chunks)
        ingester = [c for c in chunks if c.kind is ChunkKind.INGESTER]
        if not ingester:
            return None
        if after_read is not None:
            after_read()
        first = ingester[0]
        table_columns = catalog.table_columns(conn, first.table_id)
        columns = {name: table_columns[name] for c in ingester for name in c.column_names}
        # Tags read dictionary-encoded and kept so through the merge into the writer: strings are hashed once (by
        # the reader), not by the merge, the sort and the writer each (about half of persist's time, measured).
        tags = [name for name, ctype in columns.items() if ctype is ColumnType.TAG]
        parts = [(c.order, chunk_files.read_chunk(root, c.path, c.display_id, tags)) for c in ingester]
        # The key from the rows before the merge (the same tag values as after it), so the merge sorts on it.
        key = chunk_files.partition_sort_key(fixed_key, columns, pa.concat_tables(
            [t.select([g for g in tags if g in t.column_names]) for _, t in parts], promote_options="default"))
        if list(key) != list(fixed_key or []):
            catalog.set_sort_key(conn, partition_id, key)
        file_key = [c for c in key if c in columns]
        # Each row keeps the order of its key's newest write (a changes read's exact cut, catalog/changes.py).
        merged = chunk_files.deduplicate(parts, columns, sort_key=file_key, keep_dictionary=True, write_orders=True)
        rel = storage.chunk_path(db_id, first.table_id, partition_id)
        kill_point("persist.before_put")  # the chunks read and merged, the partition locked, nothing put yet
        # Without Arrow's schema the file reads back with plain string tags, as every other file.
        size = staged.write_parquet(merged, rel, metadata={"iox.kind": "parquet"}, store_schema=False)
        order = max(c.order for c in ingester)
        mm = pc.min_max(merged[TIME]).as_py()
        file_id = catalog.insert_chunk(conn, ChunkKind.PARQUET, dict(
            object_id=storage.object_id(rel), label=None, table_id=first.table_id, partition_id=partition_id,
            store=LOCAL_STORE, path=rel, min_time=mm["min"], max_time=mm["max"], row_count=merged.num_rows,
            file_size=size, column_names=chunk_files.column_layout(columns),
            tag_ranges={k: list(v) for k, v in chunk_files.tag_ranges(merged, columns).items()},
            chunk_order=order, sort_key=file_key,
        ))
        catalog.retire_chunks(conn, ChunkKind.INGESTER, [c.id for c in ingester])
        kill_point("persist.before_commit")
        return PersistResult(first.table, first.partition, len(ingester), sum(c.row_count for c in ingester),
                             merged.num_rows, f"P{file_id}", order, partition_id)


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
