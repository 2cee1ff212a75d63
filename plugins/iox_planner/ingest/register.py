"""How a result becomes a catalog table (`register_interval`): the rows are written a second time through the
catalog's own write path (catalog layout, int64 ns `time`, one partition per UTC day, sorted duplicate-free
Parquet files) and replace that interval's earlier files of the table, so rerunning an interval is idempotent
and a rollup of a rollup plans and runs like a query over any other table.

Imports neither Airflow nor Spark: the DAGs call these functions, the tests call them against a real Postgres.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from iox_planner import storage
from iox_planner.catalog import locks
from iox_planner.catalog.freshness import WriteEvent, fresh_order, record_writes
from iox_planner.catalog.limits import check_write
from iox_planner.catalog.names import excerpt, name_problem
from iox_planner.catalog.schema import tables
from iox_planner.catalog.store import Catalog, ChunkRow
from iox_planner.errors import BadInputError, CatalogError
from iox_planner.ingest import files as chunk_files
from iox_planner.ingest.lineprotocol import Precision
from iox_planner.model import LOCAL_STORE, TIME, ChunkKind, ColumnType
from iox_planner.timeutil import NS_PER_DAY, check_range, format_time, partition_bounds, partition_of
from iox_planner.objectstore import Root


# --- registering a result as a catalog table ----------------------------------------------------------------------

def catalog_columns(data: pa.Table, tags: Sequence[str]) -> tuple[pa.Table, dict[str, ColumnType]]:
    """A result as a catalog table would hold it: `tags` as tags, `time` as int64 ns, every other column a field
    of the catalog type its Arrow type maps to. Columns come out in file order (tags, fields, time)."""
    names = data.column_names
    if TIME not in names:
        raise BadInputError(
            "a result registered as a table needs a `time` column (the start of each row's bucket, say "
            "`date_trunc('hour', time) AS time`); the result has " + (", ".join(names) or "no columns")
        )
    if len(set(names)) != len(names):
        raise BadInputError(f"the result has two columns with one name ({', '.join(names)}); alias them apart")
    for tag in tags:
        if tag not in names:
            raise BadInputError(f"register_as names tag {tag!r}, which the result does not have (it has "
                                f"{', '.join(names)})")
        if tag == TIME:
            raise BadInputError("`time` cannot be a tag: it is the table's timestamp")
    columns: dict[str, ColumnType] = {}
    arrays: dict[str, pa.ChunkedArray] = {}
    for name in names:
        # The rule every write follows, so that the table's columns can be queried like any other's.
        problem = None if name == TIME else name_problem("tag" if name in tags else "field", name)
        if problem is not None:
            raise BadInputError(f"the result's column cannot be a column of a table: {problem}; alias it")
        column = data[name]
        kind = column.type
        if name == TIME:
            columns[name] = ColumnType.TIME
            arrays[name] = _time_ns(column)
        elif name in tags:
            if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_dictionary(kind)):
                raise BadInputError(f"tag {name!r} must be a string column; the result has it as {kind}")
            columns[name] = ColumnType.TAG
            arrays[name] = column.cast(pa.string())
        else:
            ctype, converted = _field(name, column)
            columns[name] = ctype
            arrays[name] = converted
    schema = chunk_files.arrow_schema(columns)
    return pa.Table.from_arrays([arrays[f.name] for f in schema], schema=schema), columns


def _time_ns(column: pa.ChunkedArray) -> pa.ChunkedArray:
    if column.null_count:
        raise BadInputError(f"`time` is NULL in {column.null_count} row(s) of the result; every row needs a time")
    kind = column.type
    if pa.types.is_timestamp(kind):
        factor = Precision(kind.unit).multiplier
        return pc.multiply_checked(column.cast(pa.int64()), pa.scalar(factor, pa.int64()))
    if pa.types.is_integer(kind):
        return column.cast(pa.int64())
    raise BadInputError(f"`time` must be a timestamp (or int64 nanoseconds); the result has it as {kind}")


def _field(name: str, column: pa.ChunkedArray) -> tuple[ColumnType, pa.ChunkedArray]:
    kind = column.type
    if pa.types.is_floating(kind):
        return ColumnType.FLOAT, column.cast(pa.float64())
    if pa.types.is_unsigned_integer(kind):
        return ColumnType.UNSIGNED, column.cast(pa.uint64())
    if pa.types.is_integer(kind):
        return ColumnType.INTEGER, column.cast(pa.int64())
    if pa.types.is_boolean(kind):
        return ColumnType.BOOLEAN, column
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return ColumnType.STRING, column.cast(pa.string())
    if pa.types.is_decimal(kind):
        # Spark reads unsigned fields as DECIMAL(20, 0): keep them unsigned; other decimals become floats.
        if kind.scale == 0 and kind.precision == 20:
            return ColumnType.UNSIGNED, column.cast(pa.uint64())
        return ColumnType.FLOAT, column.cast(pa.float64())
    raise BadInputError(
        f"column {name!r} has type {kind}, which a catalog table cannot hold (fields are float, integer, "
        "unsigned, boolean or string); cast it in the query, e.g. CAST(x AS DOUBLE)"
    )


@dataclass(frozen=True)
class RegisteredFile:
    partition: str
    file_id: int
    rows: int


@dataclass(frozen=True)
class RegisterResult:
    db: str
    table: str
    files: tuple[RegisteredFile, ...]
    retired: int
    """Earlier chunks of the table inside the interval, retired (their files go after the grace period)."""
    trimmed: int
    """Earlier chunks that reached outside the interval: rewritten without the interval's rows, then retired."""

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)


def register_interval(
    catalog: Catalog,
    db: str,
    table: str,
    data: pa.Table,
    *,
    tags: Sequence[str],
    interval: tuple[int, int],
    warehouse: Root | Path | None = None,
    conn: Connection | None = None,
    written: list[str] | None = None,
    owner: str | None = None,
) -> RegisterResult:
    """Write `data` (the result of one interval) as table `table` of database `db`, replacing whatever the table
    held inside the half-open `interval`: one sorted, duplicate-free Parquet file per UTC day, registered with a new
    chunk order, and the interval's earlier chunks retired, in one transaction (files are removed again if it does
    not commit). Every row must lie inside the interval. The database and table are created when missing; the
    result's columns must agree with the table's existing ones.

    `owner` is the materialized query registering (None for a registration no definition made): a table it
    creates is recorded as that query's, and an existing table must be that query's (checked in the transaction,
    so two definitions racing to the same new table cannot both register into it).

    With `conn`, the caller's transaction is used and `written` receives the paths of the files written, for the
    caller to remove should its transaction not commit."""
    start, end = interval
    check_range(start, end)
    problem = name_problem("measurement", table)
    if problem is not None:
        raise BadInputError(f"a result cannot be registered as this table: {problem}")
    data, columns = catalog_columns(data, tags)
    times = data[TIME].to_numpy()
    outside = int(np.count_nonzero((times < start) | (times >= end)))
    if outside:
        raise BadInputError(
            f"{outside} row(s) of the result for {db}.{table} lie outside the interval [{format_time(start)}, "
            f"{format_time(end)}); a result registered as a table may only hold rows of its own interval (filter "
            "on time, or bucket time no coarser than the schedule)"
        )
    root = storage.warehouse_of(warehouse)
    if conn is None:
        staged = storage.Staged(root)
        with staged.transaction(catalog) as own:
            return _register(catalog, own, staged, db, table, data, columns, start, end, owner)
    staged = storage.Staged(root)
    try:
        result = _register(catalog, conn, staged, db, table, data, columns, start, end, owner)
    except BaseException:
        staged.rollback()
        raise
    if written is not None:
        written.extend(staged.rels)
    return result


def _register(
    catalog: Catalog, conn: Connection, staged: storage.Staged, db: str, table: str, data: pa.Table,
    columns: Mapping[str, ColumnType], start: int, end: int, owner: str | None,
) -> RegisterResult:
    root = staged.root
    db_id = catalog.ensure_database(conn, db)
    locks.lock_orders(conn, db_id)  # before any insert, as every write does (locks.lock_orders: deadlocks)
    days = data[TIME].to_numpy() // NS_PER_DAY
    new_days = sorted({partition_of(int(d) * NS_PER_DAY) for d in np.unique(days)})
    # The catalog limits, under the order lock, before anything is added or written.
    check_write(catalog, conn, db, db_id, [(table, columns, key) for key in new_days] or [(table, columns, None)])
    table_id = catalog.ensure_table(conn, db_id, table, registered_by=owner)
    holder = conn.execute(sa.select(tables.c.registered_by).where(tables.c.id == table_id)).scalar_one()
    if holder != owner:
        by = f"materialized query {excerpt(holder)}" if holder is not None else "no materialized query"
        mine = f"materialized query {excerpt(owner)}" if owner is not None else "a registration of no definition"
        raise BadInputError(f"table {excerpt(table)} of database {db} belongs to {by}; {mine} may not replace its "
                            "rows, so nothing was registered: give register_as a table name of its own")
    current = catalog.add_columns(conn, table_id, columns)
    clashes = [f"{n} (the table has it as {current[n].value}, the result as {t.value})"
               for n, t in columns.items() if current.get(n) is not t]
    if clashes:
        raise BadInputError(f"the result does not fit table {db}.{table}: {'; '.join(clashes)}")

    first_day, last_day = partition_of(start), partition_of(end - 1)
    partition_ids = {r.partition_key: int(r.id) for r in catalog.partition_rows(conn, db_id, table)
                     if first_day <= r.partition_key <= last_day}
    for key in new_days:
        if key not in partition_ids:
            partition_ids[key] = catalog.ensure_partition(conn, table_id, key)
    # Lock every partition the interval touches, in id order (no deadlock with another registration or a
    # persist), before reading what they hold.
    sort_keys = {pid: locks.lock_partition(conn, pid) for pid in sorted(partition_ids.values())}

    old = catalog.chunk_rows(conn, db_id, table=table, time_min=start, time_max=end - 1)
    table_columns = catalog.table_columns(conn, table_id)
    retired = trimmed = 0
    for chunk in old:
        if not (start <= chunk.min_time and chunk.max_time < end):
            _trim(catalog, conn, staged, db_id, chunk, table_columns, start, end)
            trimmed += 1
        catalog.retire_chunks(conn, chunk.kind, [chunk.id])
        retired += 1

    files: list[RegisteredFile] = []
    file_orders: list[int] = []
    for key in new_days:
        lo, hi = partition_bounds(key)
        times = data[TIME]
        part = data.filter(pc.and_(pc.greater_equal(times, lo), pc.less_equal(times, hi)))
        deduped = chunk_files.deduplicate([(0, part)], columns)
        pid = partition_ids[key]
        fixed = sort_keys[pid]
        partition_key = (chunk_files.derive_sort_key(deduped, columns) if fixed is None
                         else chunk_files.extend_sort_key(fixed, columns, deduped))
        if list(partition_key) != list(fixed or []):
            catalog.set_sort_key(conn, pid, partition_key)
        file_key = [c for c in partition_key if c in columns]
        rows = chunk_files.sort_table(deduped, file_key)
        rel = storage.chunk_path(db_id, table_id, pid)
        size = staged.write_parquet(rows, rel, metadata={"iox.kind": ChunkKind.PARQUET.value})
        file_orders.append(catalog.next_orders(conn, db_id, 1)[0])
        mm = pc.min_max(rows[TIME]).as_py()
        file_id = catalog.insert_chunk(conn, ChunkKind.PARQUET, dict(
            object_id=storage.object_id(rel), label=None, table_id=table_id, partition_id=pid, store=LOCAL_STORE,
            path=rel, min_time=mm["min"], max_time=mm["max"], row_count=rows.num_rows, file_size=size,
            column_names=chunk_files.column_layout(columns),
            tag_ranges={k: list(v) for k, v in chunk_files.tag_ranges(rows, columns).items()},
            chunk_order=file_orders[-1], sort_key=file_key,
        ))
        files.append(RegisteredFile(key, file_id, rows.num_rows))
    # The interval's rows of this table changed (new ones, and any earlier ones retired): log one write event per
    # day of the interval, so rollups reading this table see their intervals go stale (catalog/freshness.py).
    events = []
    for key in _days(start, end):
        lo, hi = partition_bounds(key)
        here = [f for f in files if f.partition == key]
        events.append(WriteEvent(table, key, max(lo, start), min(hi, end - 1), sum(f.rows for f in here), len(here)))
    # The new files' orders came from the counter in this transaction; a result with no rows takes a fresh one.
    order = max(file_orders) if file_orders else fresh_order(conn, db_id)
    record_writes(conn, db_id, events, order=order, source="register")
    return RegisterResult(db, table, tuple(files), retired, trimmed)


def _days(start: int, end: int) -> list[str]:
    """The day partitions the half-open `[start, end)` touches."""
    first, last = start // NS_PER_DAY, (end - 1) // NS_PER_DAY
    return [partition_of(day * NS_PER_DAY) for day in range(first, last + 1)]


def _trim(
    catalog: Catalog, conn: Connection, staged: storage.Staged, db_id: int, chunk: ChunkRow,
    table_columns: Mapping[str, ColumnType], start: int, end: int,
) -> None:
    """Rewrite a chunk that reaches outside the interval without the interval's rows (same kind, order and sort
    key), so retiring it loses nothing outside the interval."""
    if chunk.store != LOCAL_STORE:
        raise CatalogError(f"chunk {chunk.display_id} of {chunk.table} lives in store {chunk.store!r} and reaches "
                           "outside the interval being replaced; only local files can be rewritten")
    root = staged.root
    rows = chunk_files.read_chunk(root, chunk.path, chunk.display_id)
    times = rows[TIME]
    keep = rows.filter(pc.or_(pc.less(times, start), pc.greater_equal(times, end)))
    if keep.num_rows == 0:
        return
    rel = storage.chunk_path(db_id, chunk.table_id, chunk.partition_id)
    size = staged.write_parquet(keep, rel, metadata={"iox.kind": chunk.kind.value})
    columns = {n: table_columns[n] for n in chunk.column_names if n in table_columns}
    mm = pc.min_max(keep[TIME]).as_py()
    values: dict[str, Any] = dict(
        object_id=storage.object_id(rel), label=chunk.label, table_id=chunk.table_id, partition_id=chunk.partition_id,
        store=chunk.store, path=rel, min_time=mm["min"], max_time=mm["max"], row_count=keep.num_rows,
        file_size=size, column_names=list(chunk.column_names),
        tag_ranges={k: list(v) for k, v in chunk_files.tag_ranges(keep, columns).items()}, chunk_order=chunk.order,
    )
    if chunk.kind is ChunkKind.PARQUET:
        values["sort_key"] = list(chunk.sort_key)
    catalog.insert_chunk(conn, chunk.kind, values)


