"""Writes: line protocol (or an Arrow table) becomes ingester chunks; maintenance/persist.py turns them into Parquet
files. Files are written before their catalog rows commit and removed again if the commit fails, so a
failed command leaves catalog and warehouse as they were."""

from __future__ import annotations

import os
import tempfile
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator, Mapping, Sequence, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sqlalchemy.engine import Connection

from iox_planner import config, storage
from iox_planner.catalog import locks
from iox_planner.catalog.freshness import WriteEvent, record_writes
from iox_planner.catalog.limits import WriteGuard, WriteShape, check_write
from iox_planner.catalog.names import check_db_name
from iox_planner.catalog.store import Catalog
from iox_planner.errors import BadInputError
from iox_planner.faults import kill_point
from iox_planner.ingest import files as chunk_files
from iox_planner.ingest.arrow_np import from_numpy
from iox_planner.ingest.blocks import Block, text_blocks
from iox_planner.ingest.lineprotocol import LineError, Point, Precision, StreamParser, describe_errors
from iox_planner.ingest.lineprotocol.vectorized import Piece, parse_block
from iox_planner.model import LOCAL_STORE, MAX_WRITE_POSITION, TIME, WRITE_SEQ, ChunkKind, ColumnType
from iox_planner.timeutil import NS_PER_DAY, now_ns, partition_of
from iox_planner.objectstore import Root

@dataclass(frozen=True)
class WrittenChunk:
    id: str
    table: str
    partition: str
    rows: int
    order: int
    min_time: int = 0
    max_time: int = 0

    def event(self) -> WriteEvent:
        return WriteEvent(self.table, self.partition, self.min_time, self.max_time, self.rows)


@dataclass(frozen=True)
class WriteResult:
    chunks: tuple[WrittenChunk, ...]
    rejected: tuple[LineError, ...] = ()

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.chunks)


def _errors_paragraph(errors: Sequence[LineError], what: str) -> str:
    # Bounded (IOX_LP_ERRORS_SHOWN lines, then "and K more"): a million bad lines must not make a million-line
    # message.
    return f"{what}: {describe_errors(errors)}"


def _check_against_catalog(columns_of: Callable[[str], Mapping[str, ColumnType]],
                           points: Sequence[Point]) -> list[LineError]:
    """Points whose tag/field kinds or field types conflict with the catalog's columns (`columns_of(table)`, {}
    for a table the catalog does not hold), as line errors."""
    errors: list[LineError] = []
    for point in points:
        known = columns_of(point.measurement)
        if not known:
            continue
        problem = _conflict(point, known)
        if problem:
            errors.append(LineError(point.line, 1, problem))
    return errors


def _conflict(point: Point, known: Mapping[str, ColumnType]) -> str | None:
    for tag in point.tags:
        if tag in known and known[tag] is not ColumnType.TAG:
            return (f"{point.measurement}.{tag} is a {known[tag].value} field in the catalog and cannot be "
                    "written as a tag")
    for name, (ctype, _) in point.fields.items():
        if name in known and known[name] is not ctype:
            what = "a tag" if known[name] is ColumnType.TAG else f"of type {known[name].value}"
            return (f"field {point.measurement}.{name} is {what} in the catalog, but this line writes it as "
                    f"{ctype.value}")
    return None


def write_points(
    catalog: Catalog,
    db: str,
    points: Sequence[Point],
    *,
    orders: Mapping[tuple[str, str], int] | None = None,
    labels: Mapping[tuple[str, str], str] | None = None,
    kind: ChunkKind = ChunkKind.INGESTER,
    sort_key: Sequence[str] | None = None,
    store: str = LOCAL_STORE,
    accept_partial: bool = False,
    conn: Connection | None = None,
    staged: storage.Staged | None = None,
    warehouse: Root | Path | None = None,
    log_writes: bool = True,
    check_limits: bool = True,
) -> WriteResult:
    """Store points as one chunk per (table, partition) and register them in one transaction.

    Ingester chunks keep rows exactly as written, with their write position. A Parquet chunk is deduplicated and
    sorted as a persisted file would be (scenario loads). Rows whose columns conflict with the catalog are
    rejected with their line: all of them fail the write, unless `accept_partial` drops just those lines.
    Each chunk is logged as new data (catalog/freshness.py) unless `log_writes` is false: a scenario load, whose
    explicit orders may lie below the counter, logs its chunks itself with a fresh order. The catalog limits
    (catalog/limits.py) are checked before anything is stored, unless `check_limits` is false (a scenario load
    checks them over all its chunks first).
    """
    root = storage.warehouse_of(warehouse)
    if conn is None:
        own_staged = storage.Staged(root)
        with own_staged.transaction(catalog) as own:
            result = write_points(catalog, db, points, orders=orders, labels=labels, kind=kind,
                                  sort_key=sort_key, store=store, accept_partial=accept_partial, conn=own,
                                  staged=own_staged, warehouse=root, log_writes=log_writes,
                                  check_limits=check_limits)
            kill_point("write.before_commit")
        return result
    assert staged is not None
    db_id = catalog.ensure_database(conn, db)
    locks.lock_orders(conn, db_id)
    guard = WriteGuard(catalog, conn, db, db_id)
    guard.prefetch({p.measurement for p in points})
    conflicts = _check_against_catalog(guard.columns, points)
    if conflicts and not accept_partial:
        raise BadInputError(_errors_paragraph(conflicts, f"nothing was written to {db!r}"))
    bad_lines = {e.line for e in conflicts}
    good = [p for p in points if p.line not in bad_lines]
    if not good:
        raise BadInputError(f"nothing to write to {db!r}: the input holds no valid point")

    groups: dict[tuple[str, str], list[Point]] = defaultdict(list)
    for point in good:
        groups[(point.measurement, partition_of(point.time))].append(point)
    keyed = [(key, chunk_files.chunk_columns(group), group) for key, group in sorted(groups.items())]
    if check_limits:
        for (table_name, partition_key), columns, _ in keyed:
            guard.admit(table_name, columns, partition_key)
        guard.refuse()

    chunks = ChunkStore(catalog, conn, staged, db_id, kind=kind, store=store, sort_key=sort_key)
    chunks.prepare([(t, p, columns, {pt.line for pt in group}) for (t, p), columns, group in keyed])
    for (table_name, partition_key), columns, group in keyed:
        chunks.write(table_name, partition_key, chunk_files.points_to_table(group, columns), columns,
                     order=(orders or {}).get((table_name, partition_key)),
                     label=(labels or {}).get((table_name, partition_key)), lines={p.line for p in group})
    written = chunks.register()
    if log_writes:
        # Each chunk's own order came from the counter in this transaction (no explicit orders on this path).
        assert orders is None, "explicit orders: the caller logs the write with a fresh order"
        record_writes(conn, db_id, [c.event() for c in written], orders=[c.order for c in written], source="write")
    return WriteResult(tuple(written), tuple(conflicts))


class ChunkStore:
    """Stores one write's chunks inside its transaction with a few catalog statements however many chunks:
    `prepare` finds or creates the tables, columns and partitions of a batch of (table, day)s at once, `write`
    writes one chunk's file (synced before the commit, `storage.Staged`), `register` takes every pending chunk's
    order and inserts all their rows in one statement. A write over thousands of days thus costs a few round
    trips, not several per day."""

    def __init__(self, catalog: Catalog, conn: Connection, staged: storage.Staged, db_id: int, *,
                 kind: ChunkKind, store: str = LOCAL_STORE, sort_key: Sequence[str] | None = None) -> None:
        self.catalog, self.conn, self.staged, self.db_id = catalog, conn, staged, db_id
        self.kind, self.store, self.sort_key = kind, store, sort_key
        self.table_ids: dict[str, int] = {}
        self.columns: dict[int, dict[str, ColumnType]] = {}
        """The catalog's columns of each table this write added to (after its additions)."""
        self.partition_ids: dict[tuple[str, str], int] = {}
        self._rows: list[tuple[dict[str, object], WrittenChunk]] = []

    def prepare(self, items: Sequence[tuple[str, str, Mapping[str, ColumnType], set[int] | None]]) -> None:
        """Make sure the tables, columns and partitions of `(table, day, columns, lines)` items exist; a column
        whose type conflicts with the catalog (a concurrent writer may have added the name first) is an error."""
        catalog, conn = self.catalog, self.conn
        new_tables = sorted({t for t, _, _, _ in items if t not in self.table_ids})
        if new_tables:
            self.table_ids.update(catalog.ensure_tables(conn, self.db_id, new_tables))
        wanted: dict[int, dict[str, ColumnType]] = {}
        for table, _, columns, _ in items:
            table_id = self.table_ids[table]
            known = self.columns.get(table_id)
            for name, ctype in columns.items():
                if known is None or name not in known:
                    wanted.setdefault(table_id, {}).setdefault(name, ctype)
        if wanted:
            self.columns.update(catalog.add_columns_of(conn, wanted))
        for table, _, columns, lines in items:
            current = self.columns[self.table_ids[table]]
            clashes = [f"{name} ({ctype.value}, but {current[name].value} in the catalog)"
                       for name, ctype in columns.items() if current.get(name) is not ctype]
            if clashes:
                where = f"lines {min(lines)}-{max(lines)}: " if lines else ""
                raise BadInputError(f"{where}{table}: column types conflict with the catalog: {', '.join(clashes)}")
        missing = sorted({(t, p) for t, p, _, _ in items if (t, p) not in self.partition_ids})
        if missing:
            found = catalog.ensure_partitions(conn, [(self.table_ids[t], p) for t, p in missing])
            for t, p in missing:
                self.partition_ids[(t, p)] = found[(self.table_ids[t], p)]

    def write(self, table_name: str, partition_key: str, data: pa.Table, columns: Mapping[str, ColumnType], *,
              order: int | None = None, label: str | None = None, lines: set[int] | None = None) -> None:
        """Write one chunk's file; its row waits for `register`. `data` has `columns` (and `__seq` for an
        ingester chunk); a Parquet chunk is deduplicated and sorted here as a persisted file would be."""
        self.prepare([(table_name, partition_key, columns, lines)])
        kind = self.kind
        table_id = self.table_ids[table_name]
        partition_id = self.partition_ids[(table_name, partition_key)]
        if kind is ChunkKind.INGESTER and data.num_rows > MAX_WRITE_POSITION + 1:
            # Write positions are the low 32 bits of the executor's packed (order, position) key.
            raise BadInputError(f"{table_name} {partition_key}: {data.num_rows} rows in one chunk; an ingester "
                                f"chunk holds at most {MAX_WRITE_POSITION + 1} rows: split the write")
        file_sort_key: list[str] = []
        if kind is ChunkKind.PARQUET:
            data, file_sort_key = _as_persisted(self.catalog, self.conn, partition_id, data, columns, self.sort_key)
        rel = storage.chunk_path(self.db_id, table_id, partition_id)
        size = self.staged.write_parquet(
            data, rel, metadata={"iox.kind": kind.value},
            dictionary=chunk_files.dictionary_columns(columns) if kind is ChunkKind.INGESTER else None)
        kill_point("write.chunk_put")  # a file is put, more may follow: the store may go away in between
        mm = pc.min_max(data[TIME]).as_py()
        values: dict[str, object] = dict(
            object_id=storage.object_id(rel), label=label, table_id=table_id, partition_id=partition_id,
            store=self.store, path=rel, min_time=mm["min"], max_time=mm["max"], row_count=data.num_rows,
            file_size=size, column_names=list(chunk_files.column_layout(columns)),
            tag_ranges={k: list(v) for k, v in chunk_files.tag_ranges(data, columns).items()}, chunk_order=order,
        )
        if kind is ChunkKind.PARQUET:
            values["sort_key"] = list(file_sort_key)
        self._rows.append((values, WrittenChunk(label or "", table_name, partition_key, data.num_rows, order or 0,
                                                mm["min"], mm["max"])))

    def register(self) -> list[WrittenChunk]:
        """Insert the rows of the chunks written since the last call, those without an order taking the next
        ones of the database's counter in the order they were written; the chunks as written."""
        rows, self._rows = self._rows, []
        need = [values for values, _ in rows if values["chunk_order"] is None]
        for values, order in zip(need, self.catalog.next_orders(self.conn, self.db_id, len(need)) if need else []):
            values["chunk_order"] = order
        ids = self.catalog.insert_chunks(self.conn, self.kind, [values for values, _ in rows])
        prefix = "P" if self.kind is ChunkKind.PARQUET else "I"
        return [replace(chunk, id=chunk.id or f"{prefix}{chunk_id}", order=int(cast(int, values["chunk_order"])))
                for (values, chunk), chunk_id in zip(rows, ids)]


def store_chunk(
    catalog: Catalog,
    conn: Connection,
    staged: storage.Staged,
    db_id: int,
    table_name: str,
    partition_key: str,
    data: pa.Table,
    columns: Mapping[str, ColumnType],
    *,
    kind: ChunkKind,
    order: int | None = None,
    label: str | None = None,
    sort_key: Sequence[str] | None = None,
    store: str = LOCAL_STORE,
    lines: set[int] | None = None,
) -> WrittenChunk:
    """Write one chunk of one (table, partition) and register it, inside the caller's transaction (`ChunkStore`
    for one chunk). Columns new to the table are added."""
    chunks = ChunkStore(catalog, conn, staged, db_id, kind=kind, store=store, sort_key=sort_key)
    chunks.write(table_name, partition_key, data, columns, order=order, label=label, lines=lines)
    return chunks.register()[0]


def write_table(
    catalog: Catalog,
    db: str,
    table_name: str,
    data: pa.Table,
    columns: Mapping[str, ColumnType],
    *,
    kind: ChunkKind = ChunkKind.PARQUET,
    warehouse: Root | Path | None = None,
) -> list[WrittenChunk]:
    """Store an Arrow table (int64 ns `time`) as chunks of `table_name`, one per day partition, in one
    transaction, within the catalog limits. For ingester chunks `data` must carry `__seq`; Parquet chunks are
    deduplicated and sorted."""
    staged = storage.Staged(storage.warehouse_of(warehouse))
    with staged.transaction(catalog) as conn:
        db_id = catalog.ensure_database(conn, db)
        locks.lock_orders(conn, db_id)
        days = np.floor_divide(data[TIME].to_numpy(), NS_PER_DAY)
        keys = [(int(day), partition_of(int(day) * NS_PER_DAY)) for day in np.unique(days)]
        check_write(catalog, conn, db, db_id, [(table_name, columns, key) for _, key in keys])
        chunks = ChunkStore(catalog, conn, staged, db_id, kind=kind)
        chunks.prepare([(table_name, key, columns, None) for _, key in keys])
        for day, key in keys:
            chunks.write(table_name, key, data.filter(pa.array(days == day)), columns)
        written = chunks.register()
        record_writes(conn, db_id, [c.event() for c in written], orders=[c.order for c in written],
                      source="write")
    return written


def _as_persisted(
    catalog: Catalog,
    conn: Connection,
    partition_id: int,
    data: pa.Table,
    columns: Mapping[str, ColumnType],
    override: Sequence[str] | None,
) -> tuple[pa.Table, list[str]]:
    """Deduplicate and sort a chunk as persist would; fix or extend the partition's sort key on the way."""
    deduped = chunk_files.deduplicate([(0, data)], columns)
    fixed = locks.lock_partition(conn, partition_id)
    partition_key = chunk_files.partition_sort_key(fixed, columns, deduped)
    if list(partition_key) != list(fixed or []):
        catalog.set_sort_key(conn, partition_id, partition_key)
    if override:
        unknown = [c for c in override if c not in columns]
        if unknown:
            raise BadInputError(f"sort_key names {', '.join(unknown)}, which the chunk does not have")
        file_key = list(override)
    else:
        file_key = [c for c in partition_key if c in columns]
    return chunk_files.sort_table(deduped, file_key), file_key


def write_chunk_rows(env: Mapping[str, str] | None = None) -> int:
    """`IOX_WRITE_CHUNK_ROWS`: the most rows one ingester chunk of a write holds (a larger write of one table and
    day becomes several chunks, newest last); it bounds what a write keeps in memory."""
    return config.WRITE_CHUNK_ROWS.read(env)


def write_line_protocol(
    catalog: Catalog,
    db: str,
    text: str,
    *,
    precision: Precision = Precision.NS,
    accept_partial: bool = False,
    source: str = "input",
    chunk_rows: int | None = None,
    warehouse: Root | Path | None = None,
) -> WriteResult:
    """`iox-batch write` over a text in memory (see `write_line_blocks`)."""
    return write_line_blocks(catalog, db, text_blocks(text, source), precision=precision, accept_partial=accept_partial,
                             source=source, chunk_rows=chunk_rows, warehouse=warehouse)


def write_line_blocks(
    catalog: Catalog,
    db: str,
    blocks: Iterable[Block],
    *,
    precision: Precision = Precision.NS,
    accept_partial: bool = False,
    source: str = "input",
    chunk_rows: int | None = None,
    warehouse: Root | Path | None = None,
) -> WriteResult:
    """`iox-batch write`, streaming: blocks of lines are parsed one at a time and their rows gathered per (table,
    day); a table and day holding `chunk_rows` rows is written out as one ingester chunk, the rest at the end, all
    registered in one transaction. A write with bad lines is rejected whole (nothing stored, every bad line
    counted) unless `accept_partial`, which stores the good lines and reports the bad ones; lines that conflict
    with the catalog's columns likewise."""
    check_db_name(db)
    limit = chunk_rows or write_chunk_rows()
    parser = StreamParser(precision=precision, default_time=now_ns())
    staged = storage.Staged(storage.warehouse_of(warehouse))
    # Staged.transaction, not engine.begin(): a failed COMMIT must keep its files (see there).
    with staged.transaction(catalog) as conn:
        result = _write_blocks(catalog, conn, staged, db, blocks, parser, accept_partial, source, limit)
        kill_point("write.before_commit")
    return result


def parse_blocks(blocks: Iterable[Block], parser: StreamParser,
                 catalog_columns: Callable[[str], Mapping[str, ColumnType]] | None = None,
                 ) -> Iterator[list[Piece] | list[Point]]:
    """Each block parsed: Arrow pieces from the vectorized path when it takes the whole block, else the exact
    parser's points (errors go to `parser.errors`)."""
    for block in blocks:
        pieces = parse_block(block.arrow(), parser, catalog_columns)
        yield pieces if pieces is not None else parser.feed(block.lines(), final=block.final)


class _SpillFile:
    """One write's spill file: rows waiting for their chunk while many tables or days arrive at once, as Arrow IPC
    streams (uncompressed: a write and a read of page cache), each read back once. One file for all of them (not
    one per (table, day): a write over a thousand days must not hold a thousand files open), with no name, so a
    killed write leaves nothing behind; emptied whenever nothing in it waits any more."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        """Where the spill file goes: beside a local warehouse (the same disk), else the system's temporary folder
        (a store's warehouse has no local folder)."""
        self._file: IO[bytes] | None = None
        self._waiting = 0

    def put(self, table: pa.Table) -> tuple[int, int]:
        """Store `table`; returns its (offset, length)."""
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        if self._file is None:
            if self.folder is not None:
                self.folder.mkdir(parents=True, exist_ok=True)
            self._file = tempfile.TemporaryFile(dir=self.folder)
        offset = self._file.seek(0, os.SEEK_END)
        self._file.write(sink.getvalue())
        self._waiting += 1
        return offset, self._file.tell() - offset

    def get(self, offset: int, length: int) -> pa.Table:
        """The table stored at `offset` (each is read back exactly once)."""
        assert self._file is not None
        self._file.seek(offset)
        table = pa.ipc.open_stream(self._file.read(length)).read_all()
        self._waiting -= 1
        if not self._waiting:
            self._file.truncate(0)
        return table

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class _Pending:
    """Rows of one (table, day) not yet written, in line order: spilled pieces first (in the write's spill file,
    when many tables or days at once would hold too many rows in memory), then Arrow pieces in memory, each with
    the columns it has. `take(limit)` hands out full chunks and keeps the rest, so the chunks of one (table, day)
    are all `limit` rows but the last."""

    __slots__ = ("pieces", "rows", "first_line", "last_line", "spilled", "spilled_rows", "_spill")

    def __init__(self, spill: _SpillFile | None = None) -> None:
        self.pieces: list[tuple[dict[str, ColumnType], pa.Table]] = []
        self.rows = 0
        """Rows in memory."""
        self.first_line = 0
        self.last_line = 0
        self.spilled: list[tuple[dict[str, ColumnType], int, int]] = []
        """(columns, offset, length) of each IPC stream in the spill file, in line order."""
        self.spilled_rows = 0
        self._spill = spill

    @property
    def total(self) -> int:
        return self.rows + self.spilled_rows

    def columns(self) -> dict[str, ColumnType]:
        """Every column of the rows pending (what `take` gives them)."""
        out: dict[str, ColumnType] = {}
        for spilled, *_ in self.spilled:
            out.update(spilled)
        for cols, _ in self.pieces:
            out.update(cols)
        return out

    def add(self, columns: dict[str, ColumnType], table: pa.Table, first_line: int, last_line: int) -> None:
        if not self.pieces and not self.spilled:
            self.first_line = first_line
        self.pieces.append((columns, table))
        self.rows += table.num_rows
        self.last_line = last_line

    def spill(self) -> None:
        """Move the rows in memory to the spill file, freeing their memory."""
        if not self.pieces:
            return
        assert self._spill is not None, "a _Pending without a spill file is never spilled"
        columns, table = _unify(self.pieces)
        self.spilled.append((columns, *self._spill.put(table)))
        self.spilled_rows += table.num_rows
        self.pieces, self.rows = [], 0

    def take(self, limit: int | None = None) -> tuple[dict[str, ColumnType], pa.Table, set[int]]:
        """The first `limit` rows (all if None) as one table in `arrow_schema` layout, `__seq` renumbered from 0;
        the rest stays pending, in memory (it always lies past the spilled rows, which are fewer than a chunk)."""
        pieces = list(self._read_spilled()) + self.pieces
        columns, data = _unify(pieces)
        lines = {self.first_line, self.last_line}
        self.spilled, self.spilled_rows = [], 0
        self.pieces, self.rows = [], 0
        if limit is not None and data.num_rows > limit:
            rest = data.slice(limit)
            data = data.slice(0, limit)
            self.pieces, self.rows = [(columns, rest)], rest.num_rows
            self.first_line = self.last_line  # approximate: only error messages name these lines
        data = data.set_column(data.num_columns - 1, data.schema.field(WRITE_SEQ),
                               from_numpy(np.arange(data.num_rows, dtype=np.int64)))
        return columns, data, lines

    def _read_spilled(self) -> Iterator[tuple[dict[str, ColumnType], pa.Table]]:
        for columns, offset, length in self.spilled:
            assert self._spill is not None
            yield columns, self._spill.get(offset, length)


def _unify(pieces: Sequence[tuple[Mapping[str, ColumnType], pa.Table]]) -> tuple[dict[str, ColumnType], pa.Table]:
    """Pieces as one table in `arrow_schema` layout of all their columns (absent ones null), chunked: no second
    copy of the rows."""
    columns: dict[str, ColumnType] = {}
    for cols, _ in pieces:
        columns.update(cols)
    schema = chunk_files.arrow_schema(columns, with_seq=True)
    tables = []
    for _, table in pieces:
        names = set(table.column_names)  # a set: a list per column would make a wide table quadratic
        arrays = [table[f.name] if f.name in names else pa.nulls(table.num_rows, f.type) for f in schema]
        tables.append(pa.Table.from_arrays(arrays, schema=schema))
    return columns, pa.concat_tables(tables)


def _write_blocks(catalog: Catalog, conn: Connection, staged: storage.Staged, db: str,
                  blocks: Iterable[Block], parser: StreamParser, accept_partial: bool, source: str,
                  limit: int, shape: WriteShape | None = None) -> WriteResult:
    """The streamed write inside the caller's transaction. `shape`: what earlier writes of the same transaction
    brought (the bulk load's plain fallback writes its files one after another): the catalog limits count them
    too, as one write."""
    spill = _SpillFile(staged.root.local_path if staged.root.is_local else None)
    try:
        return _write_spilling(catalog, conn, staged, db, blocks, parser, accept_partial, source, limit, spill,
                               shape)
    finally:
        spill.close()


def _write_spilling(catalog: Catalog, conn: Connection, staged: storage.Staged, db: str, blocks: Iterable[Block],
                    parser: StreamParser, accept_partial: bool, source: str, limit: int,
                    spill: _SpillFile, shape: WriteShape | None) -> WriteResult:
    db_id = catalog.ensure_database(conn, db)
    locks.lock_orders(conn, db_id)
    # Under the order lock: the limits are read and checked against what no other writer can change until this
    # write commits (catalog/limits.py). Each new table, column and partition is counted as it is first read, before
    # any row of it is stored; past a limit nothing more is stored, reading goes on only to count the whole write,
    # and the write is refused at the end (what it stored before rolls back with the transaction).
    guard = WriteGuard(catalog, conn, db, db_id, shape=shape)
    chunks = ChunkStore(catalog, conn, staged, db_id, kind=ChunkKind.INGESTER)
    pending: dict[tuple[str, str], _Pending] = {}
    conflicts: list[LineError] = []
    points_seen = 0
    good_seen = 0

    def flush(key: tuple[str, str], final: bool = False) -> None:
        """Write out the (table, day)'s full chunks; `final`: its last, partial one too."""
        entry = pending[key]
        while entry.total >= limit or (final and entry.total):
            columns, data, lines = entry.take(limit)
            chunks.write(key[0], key[1], data, columns, lines=lines)

    def relieve() -> None:
        # Many tables or days at once: bound the rows held in memory by spilling the largest's, so that each still
        # gets full chunks. Largest first from one sort, not a search per spill (quadratic over many days).
        held = sum(p.rows for p in pending.values())
        if held <= limit:
            return
        for key in sorted(pending, key=lambda k: pending[k].rows, reverse=True):
            held -= pending[key].rows
            pending[key].spill()
            if held <= limit:
                return

    def add(key: tuple[str, str], columns: dict[str, ColumnType], table: pa.Table, first: int, last: int) -> None:
        if not guard.admit(key[0], columns, key[1]):
            return  # over a limit: counted, never stored
        entry = pending.setdefault(key, _Pending(spill))
        entry.add(columns, table, first, last)
        if entry.total >= limit:
            flush(key)

    for parsed in parse_blocks(blocks, parser, guard.columns):
        if parsed and isinstance(parsed[0], Piece):
            pieces = [p for p in parsed if isinstance(p, Piece)]
            points_seen += sum(p.table.num_rows for p in pieces)
            if (parser.errors or conflicts) and not accept_partial:
                continue
            for piece in pieces:
                good_seen += piece.table.num_rows
                add((piece.measurement, piece.partition), piece.columns, piece.table, piece.first_line,
                    piece.last_line)
            relieve()
            continue
        points = cast(list[Point], parsed)
        points_seen += len(points)
        if (parser.errors and not accept_partial) or not points:
            continue  # the write fails at the end; keep reading only to report every bad line
        found = _check_against_catalog(guard.columns, points)
        if found:
            conflicts.extend(found)
            bad = {e.line for e in found}
            points = [p for p in points if p.line not in bad]
        if conflicts and not accept_partial:
            continue
        good_seen += len(points)
        groups: dict[tuple[str, str], list[Point]] = defaultdict(list)
        for point in points:
            groups[(point.measurement, partition_of(point.time))].append(point)
        for key, group in groups.items():
            columns = chunk_files.chunk_columns(group)
            add(key, columns, chunk_files.points_to_table(group, columns), group[0].line, group[-1].line)
        relieve()

    errors = parser.errors
    if errors and not accept_partial:
        raise BadInputError(_errors_paragraph(errors, f"nothing was written from {source}"))
    if not points_seen:
        if errors:
            raise BadInputError(_errors_paragraph(errors, f"nothing was written from {source}"))
        raise BadInputError(f"nothing to write: {source} holds no line protocol points")
    if conflicts and not accept_partial:
        raise BadInputError(_errors_paragraph(conflicts, f"nothing was written to {db!r}"))
    if not good_seen:
        raise BadInputError(f"nothing to write to {db!r}: the input holds no valid point")
    guard.refuse()
    final = sorted(k for k, p in pending.items() if p.total)
    # One batch for the catalog: the tables, columns and partitions of every (table, day) left, then their files.
    chunks.prepare([(k[0], k[1], pending[k].columns(), None) for k in final])
    for key in final:
        flush(key, final=True)
    written = chunks.register()
    # New data: logged in this transaction, so materialized intervals it lands in become stale (freshness.py).
    record_writes(conn, db_id, [c.event() for c in written], orders=[c.order for c in written], source="write")
    return WriteResult(tuple(written), tuple(sorted([*errors, *conflicts], key=lambda e: e.line)))
