"""Writes: line protocol (or an Arrow table) becomes ingester chunks; persist.py turns them into Parquet files.
Files are written before their catalog rows commit and removed again if the commit fails, so a
failed command leaves catalog and warehouse as they were."""

from __future__ import annotations

import sys
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from sqlalchemy.engine import Connection

from iox_planner.ingest import files as storage
from iox_planner.catalog.freshness import WriteEvent, record_writes
from iox_planner.catalog.names import check_db_name
from iox_planner.catalog.store import Catalog
from iox_planner.config import warehouse as default_warehouse
from iox_planner.errors import BadInputError
from iox_planner.ingest.lineprotocol import LineError, Point, Precision, decode_utf8, describe_errors, parse
from iox_planner.model import LOCAL_STORE, MAX_WRITE_POSITION, TIME, ChunkKind, ColumnType
from iox_planner.timeutil import NS_PER_DAY, now_ns, partition_of

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


@dataclass
class Staged:
    """Files written during a command, removed if the catalog transaction does not commit."""

    root: Path
    paths: list[Path] = field(default_factory=list)

    def rollback(self) -> None:
        for path in self.paths:
            path.unlink(missing_ok=True)


def chunk_path(db_id: int, table_id: int, partition_id: int) -> str:
    """`<db id>/<table id>/<partition id>/<uuid>.parquet`: built from catalog ids, never from names."""
    return f"{db_id}/{table_id}/{partition_id}/{uuid.uuid4()}.parquet"


def _check_against_catalog(
    catalog: Catalog, conn: Connection, db_id: int | None, points: Sequence[Point]
) -> list[LineError]:
    """Points whose tag/field kinds or field types conflict with the catalog's columns, as line errors."""
    if db_id is None:
        return []
    known_tables = catalog.table_ids(conn, db_id)
    cache: dict[str, dict[str, ColumnType]] = {}
    errors: list[LineError] = []
    for point in points:
        table_id = known_tables.get(point.measurement)
        if table_id is None:
            continue
        if point.measurement not in cache:
            cache[point.measurement] = catalog.table_columns(conn, table_id)
        problem = _conflict(point, cache[point.measurement])
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
    staged: Staged | None = None,
    warehouse: Path | None = None,
    log_writes: bool = True,
) -> WriteResult:
    """Store points as one chunk per (table, partition) and register them in one transaction.

    Ingester chunks keep rows exactly as written, with their write position. A Parquet chunk is deduplicated and
    sorted as a persisted file would be (scenario loads). Rows whose columns conflict with the catalog are
    rejected with their line: all of them fail the write, unless `accept_partial` drops just those lines.
    Each chunk is logged as new data (catalog/freshness.py) unless `log_writes` is false: a scenario load, whose
    explicit orders may lie below the counter, logs its chunks itself with a fresh order.
    """
    root = warehouse or default_warehouse()
    if conn is None:
        own_staged = Staged(root)
        try:
            with catalog.engine.begin() as own:
                return write_points(catalog, db, points, orders=orders, labels=labels, kind=kind,
                                    sort_key=sort_key, store=store, accept_partial=accept_partial, conn=own,
                                    staged=own_staged, warehouse=root, log_writes=log_writes)
        except BaseException:
            own_staged.rollback()
            raise
    assert staged is not None
    db_id = catalog.ensure_database(conn, db)
    catalog.lock_orders(conn, db_id)
    conflicts = _check_against_catalog(catalog, conn, db_id, points)
    if conflicts and not accept_partial:
        raise BadInputError(_errors_paragraph(conflicts, f"nothing was written to {db!r}"))
    bad_lines = {e.line for e in conflicts}
    good = [p for p in points if p.line not in bad_lines]
    if not good:
        raise BadInputError(f"nothing to write to {db!r}: the input holds no valid point")

    groups: dict[tuple[str, str], list[Point]] = defaultdict(list)
    for point in good:
        groups[(point.measurement, partition_of(point.time))].append(point)

    written: list[WrittenChunk] = []
    for (table_name, partition_key), group in sorted(groups.items()):
        columns = storage.chunk_columns(group)
        written.append(store_chunk(
            catalog, conn, staged, db_id, table_name, partition_key, storage.points_to_table(group, columns),
            columns, kind=kind, order=(orders or {}).get((table_name, partition_key)),
            label=(labels or {}).get((table_name, partition_key)), sort_key=sort_key, store=store,
            lines={p.line for p in group},
        ))
    if log_writes:
        # Each chunk's own order came from the counter in this transaction (no explicit orders on this path).
        assert orders is None, "explicit orders: the caller logs the write with a fresh order"
        record_writes(conn, db_id, [c.event() for c in written], orders=[c.order for c in written], source="write")
    return WriteResult(tuple(written), tuple(conflicts))


def store_chunk(
    catalog: Catalog,
    conn: Connection,
    staged: Staged,
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
    """Write one chunk of one (table, partition) and register it, inside the caller's transaction.

    `data` has `columns` (and `__seq` for an ingester chunk); a Parquet chunk is deduplicated and sorted here as
    a persisted file would be. Columns new to the table are added; a type that conflicts with the catalog (a
    concurrent writer may have added the name first) is an error.
    """
    table_id = catalog.ensure_table(conn, db_id, table_name)
    current = catalog.add_columns(conn, table_id, columns)
    clashes = [f"{name} ({ctype.value}, but {current[name].value} in the catalog)"
               for name, ctype in columns.items() if current.get(name) is not ctype]
    if clashes:
        where = f"lines {min(lines)}-{max(lines)}: " if lines else ""
        raise BadInputError(f"{where}{table_name}: column types conflict with the catalog: {', '.join(clashes)}")
    partition_id = catalog.ensure_partition(conn, table_id, partition_key)
    if kind is ChunkKind.INGESTER and data.num_rows > MAX_WRITE_POSITION + 1:
        # Write positions are the low 32 bits of the executor's packed (order, position) key.
        raise BadInputError(f"{table_name} {partition_key}: {data.num_rows} rows in one chunk; an ingester chunk "
                            f"holds at most {MAX_WRITE_POSITION + 1} rows: split the write")
    order = order or catalog.next_orders(conn, db_id, 1)[0]
    file_sort_key: list[str] = []
    if kind is ChunkKind.PARQUET:
        data, file_sort_key = _as_persisted(catalog, conn, partition_id, data, columns, sort_key)
    rel = chunk_path(db_id, table_id, partition_id)
    path = staged.root / rel
    staged.paths.append(path)
    size = storage.write_parquet_atomic(data, path, metadata={"iox.kind": kind.value})
    mm = pc.min_max(data[TIME]).as_py()
    values = dict(
        object_id=path.stem, label=label, table_id=table_id, partition_id=partition_id, store=store,
        path=rel, min_time=mm["min"], max_time=mm["max"], row_count=data.num_rows, file_size=size,
        column_names=list(storage.column_layout(columns)),
        tag_ranges={k: list(v) for k, v in storage.tag_ranges(data, columns).items()}, chunk_order=order,
    )
    if kind is ChunkKind.PARQUET:
        values["sort_key"] = list(file_sort_key)
    chunk_id = catalog.insert_chunk(conn, kind, values)
    display = label or f"{'P' if kind is ChunkKind.PARQUET else 'I'}{chunk_id}"
    return WrittenChunk(display, table_name, partition_key, data.num_rows, order, mm["min"], mm["max"])


def write_table(
    catalog: Catalog,
    db: str,
    table_name: str,
    data: pa.Table,
    columns: Mapping[str, ColumnType],
    *,
    kind: ChunkKind = ChunkKind.PARQUET,
    warehouse: Path | None = None,
) -> list[WrittenChunk]:
    """Store an Arrow table (int64 ns `time`) as chunks of `table_name`, one per day partition, in one
    transaction. For ingester chunks `data` must carry `__seq`; Parquet chunks are deduplicated and sorted."""
    import numpy as np

    staged = Staged(warehouse or default_warehouse())
    try:
        with catalog.engine.begin() as conn:
            db_id = catalog.ensure_database(conn, db)
            days = np.floor_divide(data[TIME].to_numpy(), NS_PER_DAY)
            written = []
            for day in np.unique(days):
                part = data.filter(pa.array(days == day))
                written.append(store_chunk(catalog, conn, staged, db_id, table_name,
                                           partition_of(int(day) * NS_PER_DAY), part, columns, kind=kind))
            record_writes(conn, db_id, [c.event() for c in written], orders=[c.order for c in written],
                          source="write")
            return written
    except BaseException:
        staged.rollback()
        raise


def _as_persisted(
    catalog: Catalog,
    conn: Connection,
    partition_id: int,
    data: pa.Table,
    columns: Mapping[str, ColumnType],
    override: Sequence[str] | None,
) -> tuple[pa.Table, list[str]]:
    """Deduplicate and sort a chunk as persist would; fix or extend the partition's sort key on the way."""
    deduped = storage.deduplicate([(0, data)], columns)
    fixed = catalog.lock_partition(conn, partition_id)
    partition_key = storage.partition_sort_key(fixed, columns, deduped)
    if list(partition_key) != list(fixed or []):
        catalog.set_sort_key(conn, partition_id, partition_key)
    if override:
        unknown = [c for c in override if c not in columns]
        if unknown:
            raise BadInputError(f"sort_key names {', '.join(unknown)}, which the chunk does not have")
        file_key = list(override)
    else:
        file_key = [c for c in partition_key if c in columns]
    return storage.sort_table(deduped, file_key), file_key


def write_line_protocol(
    catalog: Catalog,
    db: str,
    text: str,
    *,
    precision: Precision = Precision.NS,
    accept_partial: bool = False,
    source: str = "input",
) -> WriteResult:
    """`iox-batch write`: parse everything first; a write with bad lines is rejected whole (nothing stored) unless
    `accept_partial`, which stores the good lines and reports the bad ones."""
    check_db_name(db)
    result = parse(text, precision=precision, default_time=now_ns())
    if result.errors and not accept_partial:
        raise BadInputError(_errors_paragraph(result.errors, f"nothing was written from {source}"))
    if not result.points:
        if result.errors:
            raise BadInputError(_errors_paragraph(result.errors, f"nothing was written from {source}"))
        raise BadInputError(f"nothing to write: {source} holds no line protocol points")
    written = write_points(catalog, db, result.points, accept_partial=accept_partial)
    return WriteResult(written.chunks, tuple(sorted([*result.errors, *written.rejected], key=lambda e: e.line)))


def read_input(source: str) -> tuple[str, str]:
    """The text of FILE or `-` (standard input), with a name for messages.

    Both are read as bytes and decoded here, strictly, by one path: text mode would turn a CR inside a string
    value into a newline and would treat invalid UTF-8 on standard input differently from a file."""
    name = "standard input" if source == "-" else source
    if source == "-":
        data = sys.stdin.buffer.read()
    else:
        try:
            data = Path(source).read_bytes()
        except FileNotFoundError as err:
            raise BadInputError(f"cannot read {source}: no such file") from err
        except IsADirectoryError as err:
            raise BadInputError(f"cannot read {source}: it is a folder, not a file") from err
        except PermissionError as err:
            raise BadInputError(f"cannot read {source}: permission denied") from err
    return decode_utf8(data, name), name
