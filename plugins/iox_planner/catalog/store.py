"""The Postgres catalog: migrations, and every read and write of catalog rows (SQLAlchemy 2 Core, bind
parameters only)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.engine import Connection, Engine

from iox_planner.catalog.freshness import TableRead, committed_order
from iox_planner.catalog.localpg import catalog_url
from iox_planner.catalog.names import check_db_name
from iox_planner.catalog import locks
from iox_planner.catalog.migrations import Migration, migration_files
from iox_planner.catalog.schema import (
    CHUNK_TABLES,
    columns,
    database_orders,
    databases,
    migrations_table,
    partitions,
    tables,
)
from iox_planner.errors import BadInputError, CatalogError, CatalogUnavailableError
from iox_planner.model import MAX_ORDER, ChangeWindow, Chunk, ChunkKind, ColumnType, TableSchema
from iox_planner.timeutil import NS_PER_DAY


def catalog_unavailable(error: BaseException) -> CatalogUnavailableError | None:
    """A lost or refused catalog connection (SQLAlchemy's OperationalError or InterfaceError, anywhere in the
    exception's chain) as the retryable error it is; None for anything else. The CLI's last line of defence and
    the DAGs' run steps both read a lost catalog this way."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, (sa.exc.OperationalError, sa.exc.InterfaceError)):
            first = str(getattr(seen, "orig", None) or seen).strip().splitlines()
            detail = first[0] if first else type(seen).__name__
            return CatalogUnavailableError(
                f"the catalog's Postgres was unreachable, dropped the connection or aborted the transaction ({detail}); "
                "the command "
                "changed all or nothing, each catalog change being one transaction. Run it again once Postgres is "
                "back (writing the same lines again is safe: a point written twice deduplicates to one)")
        seen = seen.__cause__ or seen.__context__
    return None


class ChunkRow(NamedTuple):
    """A catalog row of either chunk table, with its table and partition names. (A tuple: the planner reads
    thousands of these per query, and tuples build several times faster than frozen dataclasses.)"""

    kind: ChunkKind
    id: int
    label: str | None
    table: str
    table_id: int
    partition: str
    partition_id: int
    store: str
    path: str
    min_time: int
    max_time: int
    row_count: int
    file_size: int
    column_names: tuple[str, ...]
    tag_ranges: Mapping[str, tuple[str, str]]
    order: int
    sort_key: tuple[str, ...]
    level: int = 0  # compaction level of a Parquet file (migration 0005); 0 for an ingester chunk

    @property
    def display_id(self) -> str:
        return self.label or f"{'P' if self.kind is ChunkKind.PARQUET else 'I'}{self.id}"


class Catalog:
    """The catalog behind one SQLAlchemy engine."""

    def __init__(self, url: str | None = None) -> None:
        self.url = url or catalog_url()
        try:
            parsed = sa.engine.make_url(self.url)
            if parsed.get_backend_name() != "postgresql":
                raise BadInputError(f"the catalog URL names the {parsed.get_backend_name()[:40]!r} database "
                                    "system; the catalog is PostgreSQL: IOX_CATALOG_URL takes "
                                    "postgresql://user@host:port/database")
            self.engine: Engine = sa.create_engine(parsed, pool_pre_ping=True, future=True)
        except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ValueError) as err:
            raise BadInputError("the catalog URL is not one SQLAlchemy can use; IOX_CATALOG_URL takes "
                                "postgresql://user@host:port/database") from err

    def dispose(self) -> None:
        self.engine.dispose()

    # --- migrations -----------------------------------------------------------------------------------------

    def migrate(self, *, until: int | None = None) -> list[Migration]:
        """Apply the migrations not yet applied, in order, each in its own transaction. Returns those applied.
        `until` stops after that version (a catalog as an older release left it, for upgrade tests)."""
        applied: list[Migration] = []
        try:
            with self.engine.begin() as conn:
                locks.lock_migrations(conn)
                migrations_table.create(conn, checkfirst=True)
                done = {r.version: r for r in conn.execute(sa.select(migrations_table))}
                files = migration_files()
                for version, row in done.items():
                    match = [m for m in files if m.version == version]
                    if not match:
                        raise CatalogError(
                            f"the catalog has migration {version:04d} ({row.name}) which this checkout does not "
                            "know; upgrade iox-batch"
                        )
                    if match[0].checksum != row.checksum:
                        raise CatalogError(
                            f"catalog migration {version:04d}_{row.name}.sql was edited after it was applied; "
                            "shipped migrations are append-only: revert the edit and fix forward in a new file"
                        )
                for migration in files:
                    if migration.version in done or (until is not None and migration.version > until):
                        continue
                    with conn.begin_nested():
                        conn.exec_driver_sql(migration.sql)
                        conn.execute(migrations_table.insert().values(
                            version=migration.version, name=migration.name, checksum=migration.checksum,
                            applied_at=sa.func.now()))
                    applied.append(migration)
        except sa.exc.OperationalError as err:
            raise self._unreachable(err) from err
        return applied

    def _unreachable(self, err: sa.exc.OperationalError) -> CatalogUnavailableError:
        first = str(err.orig).strip().splitlines()
        return CatalogUnavailableError(f"cannot reach the catalog at {self._safe_url()}: "
                                       f"{first[0] if first else 'no answer'}; run the command again once it is up")

    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            if not sa.inspect(conn).has_table("iox_schema_migration"):
                return 0
            return int(conn.execute(sa.select(sa.func.coalesce(sa.func.max(migrations_table.c.version), 0))).scalar_one())

    def require_schema(self) -> None:
        """Commands other than `catalog migrate` bring the catalog up to date themselves (a fresh clone works)."""
        latest = len(migration_files())
        try:
            current = self.schema_version()
        except sa.exc.OperationalError as err:
            raise self._unreachable(err) from err
        if current < latest:
            self.migrate()

    def _safe_url(self) -> str:
        return sa.engine.make_url(self.url).render_as_string(hide_password=True)

    # --- databases, tables, columns, partitions ------------------------------------------------------------

    def database_names(self, conn: Connection) -> list[str]:
        return list(conn.execute(sa.select(databases.c.name).order_by(databases.c.name)).scalars())

    def database_id(self, conn: Connection, name: str) -> int:
        """The id of an existing database; an unknown one is an error naming the known ones."""
        check_db_name(name)
        found = conn.execute(sa.select(databases.c.id).where(databases.c.name == name)).scalar_one_or_none()
        if found is None:
            import difflib

            # Never the list of databases: in a shared catalog those are other users' names. One close match
            # at most, for the typo case.
            close = difflib.get_close_matches(name, self.database_names(conn), n=1, cutoff=0.8)
            hint = f"did you mean {close[0]!r}?" if close else "check the name"
            raise CatalogError(
                f"database {name!r} does not exist ({hint}); databases are created by the first "
                "`iox-batch write` or `iox-batch load` into them"
            )
        return int(found)

    def ensure_database(self, conn: Connection, name: str) -> int:
        check_db_name(name)
        conn.execute(pg.insert(databases).values(name=name).on_conflict_do_nothing(index_elements=["name"]))
        db_id = int(conn.execute(sa.select(databases.c.id).where(databases.c.name == name)).scalar_one())
        conn.execute(pg.insert(database_orders).values(database_id=db_id, last_order=0)
                     .on_conflict_do_nothing(index_elements=["database_id"]))
        return db_id

    def ensure_table(self, conn: Connection, db_id: int, name: str, *, registered_by: str | None = None) -> int:
        """The live table `name`, created when missing (a dropped table of that name stays dropped: a new id);
        `registered_by` is recorded only by the creating call."""
        conn.execute(pg.insert(tables).values(database_id=db_id, name=name, registered_by=registered_by)
                     .on_conflict_do_nothing())
        return int(conn.execute(sa.select(tables.c.id).where(
            tables.c.database_id == db_id, tables.c.name == name, tables.c.dropped_at.is_(None))).scalar_one())

    def ensure_tables(self, conn: Connection, db_id: int, names: Sequence[str]) -> dict[str, int]:
        """`ensure_table` for several names in two statements. (These batch inserts say RETURNING so that SQLAlchemy
        sends their rows as multi-row VALUES batches, not one statement per row as psycopg2's executemany does.)"""
        wanted = sorted(set(names))
        if not wanted:
            return {}
        conn.execute(pg.insert(tables).on_conflict_do_nothing().returning(tables.c.id),
                     [{"database_id": db_id, "name": n, "registered_by": None} for n in wanted])
        rows = conn.execute(sa.select(tables.c.name, tables.c.id).where(
            tables.c.database_id == db_id, tables.c.name.in_(wanted), tables.c.dropped_at.is_(None)))
        return {r.name: int(r.id) for r in rows}

    def table_ids(self, conn: Connection, db_id: int) -> dict[str, int]:
        """The live tables of a database (a dropped one keeps its row while its files wait out the grace period)."""
        rows = conn.execute(sa.select(tables.c.name, tables.c.id).where(tables.c.database_id == db_id,
                                                                         tables.c.dropped_at.is_(None)))
        return {r.name: int(r.id) for r in rows}

    def table_columns(self, conn: Connection, table_id: int) -> dict[str, ColumnType]:
        rows = conn.execute(sa.select(columns.c.name, columns.c.column_type).where(columns.c.table_id == table_id))
        return {r.name: ColumnType(r.column_type) for r in rows}

    def columns_of(self, conn: Connection, table_ids: Sequence[int]) -> dict[int, dict[str, ColumnType]]:
        """The columns of several tables, in one query."""
        out: dict[int, dict[str, ColumnType]] = {}
        rows = conn.execute(sa.select(columns.c.table_id, columns.c.name, columns.c.column_type)
                            .where(columns.c.table_id.in_(list(table_ids))))
        for r in rows:
            out.setdefault(int(r.table_id), {})[r.name] = ColumnType(r.column_type)
        return out

    def add_columns(self, conn: Connection, table_id: int, wanted: Mapping[str, ColumnType]) -> dict[str, ColumnType]:
        """Add missing columns; returns the table's columns afterwards. A concurrent writer adding the same name
        with another type wins the race cleanly: the caller compares types against what this returns."""
        return self.add_columns_of(conn, {table_id: wanted})[table_id]

    def add_columns_of(self, conn: Connection, wanted: Mapping[int, Mapping[str, ColumnType]]
                       ) -> dict[int, dict[str, ColumnType]]:
        """`add_columns` for several tables in three statements at most, however many tables and columns."""
        current = self.columns_of(conn, list(wanted))
        missing = [(table_id, n, t.value) for table_id, cols in wanted.items() for n, t in cols.items()
                   if n not in current.get(table_id, {})]
        if missing:
            conn.execute(pg.insert(columns).on_conflict_do_nothing().returning(columns.c.id),
                         [{"table_id": t, "name": n, "column_type": c} for t, n, c in missing])
            current.update(self.columns_of(conn, sorted({t for t, _, _ in missing})))
        return {table_id: current.get(table_id, {}) for table_id in wanted}

    def ensure_partitions(self, conn: Connection, wanted: Sequence[tuple[int, str]]) -> dict[tuple[int, str], int]:
        """The ids of (table id, partition key) pairs, created when missing: two statements however many (a write
        over many days would otherwise pay two round trips per day)."""
        pairs = sorted(set(wanted))
        if not pairs:
            return {}
        conn.execute(pg.insert(partitions).on_conflict_do_nothing().returning(partitions.c.id),
                     [{"table_id": t, "partition_key": k} for t, k in pairs])
        found = conn.execute(
            sa.select(partitions.c.table_id, partitions.c.partition_key, partitions.c.id)
            .where(partitions.c.table_id.in_(sorted({t for t, _ in pairs})),
                   partitions.c.partition_key.in_(sorted({k for _, k in pairs}))))
        ids = {(int(r.table_id), r.partition_key): int(r.id) for r in found}
        return {pair: ids[pair] for pair in pairs}

    def ensure_partition(self, conn: Connection, table_id: int, key: str) -> int:
        conn.execute(pg.insert(partitions).values(table_id=table_id, partition_key=key).on_conflict_do_nothing())
        return int(conn.execute(sa.select(partitions.c.id).where(
            partitions.c.table_id == table_id, partitions.c.partition_key == key)).scalar_one())

    # --- compaction's work ------------------------------------------------------------------------------------

    def compaction_candidates(self, conn: Connection, db_id: int, *, table: str | None = None,
                              partition: str | None = None) -> list[int]:
        """Partitions that may need compaction: one live L0 file or more, or two live L1 files or more (the plan
        decides). Counted on the (compaction_level, partition_id) index of migration 0005."""
        pf = CHUNK_TABLES[ChunkKind.PARQUET]
        level = pf.c.compaction_level
        l0 = sa.func.count().filter(level == 0)
        l1 = sa.func.count().filter(level == 1)
        query = (
            sa.select(pf.c.partition_id)
            .join_from(pf, partitions, pf.c.partition_id == partitions.c.id)
            .join(tables, partitions.c.table_id == tables.c.id)
            .where(tables.c.database_id == db_id, pf.c.to_delete.is_(None), level < 2)
            .group_by(pf.c.partition_id)
            .having(sa.or_(l0 >= 1, l1 >= 2))
            .order_by(pf.c.partition_id)
        )
        if table is not None:
            query = query.where(tables.c.name == table)
        if partition is not None:
            query = query.where(partitions.c.partition_key == partition)
        return [int(pid) for pid in conn.execute(query).scalars()]

    def partition_quiet_seconds(self, conn: Connection, partition_id: int) -> float:
        """Seconds since the newest live chunk of a partition was created (a partition with none: infinity)."""
        newest = None
        for ct in CHUNK_TABLES.values():
            value = conn.execute(sa.select(sa.func.max(ct.c.created_at))
                                 .where(ct.c.partition_id == partition_id, ct.c.to_delete.is_(None))).scalar_one()
            if value is not None and (newest is None or value > newest):
                newest = value
        if newest is None:
            return float("inf")
        return float(conn.execute(sa.select(sa.func.extract("epoch", sa.func.now() - newest))).scalar_one())

    def set_sort_key(self, conn: Connection, partition_id: int, sort_key: Sequence[str]) -> None:
        conn.execute(partitions.update().where(partitions.c.id == partition_id).values(sort_key=list(sort_key)))

    def next_orders(self, conn: Connection, db_id: int, count: int) -> list[int]:
        """The next `count` orders of one database. The UPDATE locks the database's counter row until the caller's
        transaction ends, so writes into one database commit in the order of their orders (issue 11); other
        databases are not involved."""
        take = (database_orders.update().where(database_orders.c.database_id == db_id,
                                               database_orders.c.last_order <= MAX_ORDER - count)
                .values(last_order=database_orders.c.last_order + count).returning(database_orders.c.last_order))
        last = conn.execute(take).scalar_one_or_none()
        if last is None and conn.execute(sa.select(database_orders.c.database_id)
                                         .where(database_orders.c.database_id == db_id)).first() is None:
            # A database made before its counter existed: it counts on from what it holds.
            conn.execute(pg.insert(database_orders).values(
                database_id=db_id, last_order=min(self.max_order(conn, db_id), MAX_ORDER))
                .on_conflict_do_nothing(index_elements=["database_id"]))
            last = conn.execute(take).scalar_one_or_none()
        if last is None:
            raise CatalogError(
                f"database id {db_id} has used every chunk order (they stay below 2^31 = {MAX_ORDER + 1}); "
                "persist and compact do not free orders: reload the data into a new database"
            )
        return list(range(int(last) - count + 1, int(last) + 1))

    def advance_orders(self, conn: Connection, db_id: int, at_least: int) -> None:
        """Move one database's order counter so that its next order is above `at_least` (scenario loads)."""
        if not 0 <= at_least <= MAX_ORDER:
            raise BadInputError(f"chunk order {at_least} is out of range; orders are 1 to {MAX_ORDER}")
        conn.execute(database_orders.update().where(database_orders.c.database_id == db_id)
                     .values(last_order=sa.func.greatest(database_orders.c.last_order, at_least)))

    def max_order(self, conn: Connection, db_id: int) -> int:
        """The highest chunk order the database holds (0 if none)."""
        best = 0
        for table in CHUNK_TABLES.values():
            value = conn.execute(
                sa.select(sa.func.max(table.c.chunk_order))
                .join_from(table, tables, table.c.table_id == tables.c.id)
                .where(tables.c.database_id == db_id)
            ).scalar_one()
            best = max(best, int(value or 0))
        return best

    # --- chunks ------------------------------------------------------------------------------------------------

    def insert_chunk(self, conn: Connection, kind: ChunkKind, values: Mapping[str, Any]) -> int:
        table = CHUNK_TABLES[kind]
        return int(conn.execute(table.insert().values(**values).returning(table.c.id)).scalar_one())

    def insert_chunks(self, conn: Connection, kind: ChunkKind, rows: Sequence[Mapping[str, Any]]) -> list[int]:
        """Insert several chunk rows in one round trip (per few thousand); their ids, in the order given."""
        if not rows:
            return []
        table = CHUNK_TABLES[kind]
        result = conn.execute(table.insert().returning(table.c.id, sort_by_parameter_order=True), list(rows))
        return [int(i) for i in result.scalars()]

    def retire_chunks(self, conn: Connection, kind: ChunkKind, ids: Sequence[int]) -> None:
        table = CHUNK_TABLES[kind]
        conn.execute(table.update().where(table.c.id.in_(list(ids)), table.c.to_delete.is_(None))
                     .values(to_delete=sa.func.now()))

    def retire_partition(self, conn: Connection, partition_id: int) -> int:
        """Retire every live chunk of a partition (retention expiry); how many."""
        return sum(int(conn.execute(ct.update().where(ct.c.partition_id == partition_id, ct.c.to_delete.is_(None))
                                    .values(to_delete=sa.func.now())).rowcount) for ct in CHUNK_TABLES.values())

    def promote_files(self, conn: Connection, ids: Sequence[int], level: int) -> int:
        """Raise live L0 Parquet files to `level` in place (compaction's promotion: same file, order and rows);
        the number of rows changed (a file retired or already promoted meanwhile is not)."""
        pf = CHUNK_TABLES[ChunkKind.PARQUET]
        return int(conn.execute(pf.update().where(pf.c.id.in_(list(ids)), pf.c.to_delete.is_(None),
                                                  pf.c.compaction_level == 0)
                                .values(compaction_level=level)).rowcount)

    def chunk_rows(
        self,
        conn: Connection,
        db_id: int,
        *,
        table: str | None = None,
        partition_id: int | None = None,
        time_min: int | None = None,
        time_max: int | None = None,
        kinds: Sequence[ChunkKind] = (ChunkKind.PARQUET, ChunkKind.INGESTER),
    ) -> list[ChunkRow]:
        """Live chunks, optionally of one table or partition, overlapping the inclusive `[time_min, time_max]`."""
        out: list[ChunkRow] = []
        for kind in kinds:
            ct = CHUNK_TABLES[kind]
            cols = [ct.c.id, ct.c.label, ct.c.table_id, tables.c.name.label("table_name"), ct.c.partition_id,
                    partitions.c.partition_key, ct.c.store, ct.c.path, ct.c.min_time, ct.c.max_time,
                    ct.c.row_count, ct.c.file_size, ct.c.column_names, ct.c.tag_ranges, ct.c.chunk_order]
            if kind is ChunkKind.PARQUET:
                cols += [ct.c.sort_key, ct.c.compaction_level]
            query = (
                sa.select(*cols)
                .join_from(ct, tables, ct.c.table_id == tables.c.id)
                .join(partitions, ct.c.partition_id == partitions.c.id)
                .where(tables.c.database_id == db_id, ct.c.to_delete.is_(None))
            )
            if table is not None:
                query = query.where(tables.c.name == table)
            if partition_id is not None:
                query = query.where(ct.c.partition_id == partition_id)
            if time_max is not None:
                query = query.where(ct.c.min_time <= time_max)
            if time_min is not None:
                # Chunks lie inside one day, so this bound keeps the scan on the (table_id, min_time) index tight.
                query = query.where(ct.c.max_time >= time_min, ct.c.min_time > time_min - NS_PER_DAY)
            parquet = kind is ChunkKind.PARQUET
            for r in conn.execute(query):
                out.append(ChunkRow(
                    kind, r[0], r[1], r[3], r[2], r[5], r[4], r[6], r[7], r[8], r[9], r[10], r[11],
                    tuple(r[12]), {k: (v[0], v[1]) for k, v in r[13].items()} if r[13] else {}, r[14],
                    tuple(r[15]) if parquet else (), int(r[16]) if parquet else 0,
                ))
        out.sort(key=lambda c: (c.table, c.partition, c.order, c.kind.value, c.id))
        return out

    def labels(self, conn: Connection, db_id: int) -> set[str]:
        found: set[str] = set()
        for ct in CHUNK_TABLES.values():
            found.update(conn.execute(
                sa.select(ct.c.label).join_from(ct, tables, ct.c.table_id == tables.c.id)
                .where(tables.c.database_id == db_id, ct.c.label.is_not(None), ct.c.to_delete.is_(None))
            ).scalars())
        return found

    def partition_rows(self, conn: Connection, db_id: int, table: str | None = None) -> list[sa.Row[Any]]:
        query = (
            sa.select(tables.c.name.label("table_name"), partitions.c.id, partitions.c.partition_key,
                      partitions.c.sort_key)
            .join_from(partitions, tables, partitions.c.table_id == tables.c.id)
            .where(tables.c.database_id == db_id, tables.c.dropped_at.is_(None))
            .order_by(tables.c.name, partitions.c.partition_key)
        )
        if table is not None:
            query = query.where(tables.c.name == table)
        return list(conn.execute(query))

    def expired_chunks(self, conn: Connection, grace_seconds: float) -> list[tuple[ChunkKind, int, str, str]]:
        """Retired chunks past their grace period: (kind, id, store, path)."""
        out: list[tuple[ChunkKind, int, str, str]] = []
        for kind, ct in CHUNK_TABLES.items():
            rows = conn.execute(sa.select(ct.c.id, ct.c.store, ct.c.path).where(
                ct.c.to_delete.is_not(None),
                ct.c.to_delete < sa.func.now() - sa.func.make_interval(0, 0, 0, 0, 0, 0, grace_seconds)))
            out.extend((kind, int(r.id), r.store, r.path) for r in rows)
        return out

    def delete_chunk_rows(self, conn: Connection, kind: ChunkKind, ids: Sequence[int]) -> None:
        ct = CHUNK_TABLES[kind]
        conn.execute(ct.delete().where(ct.c.id.in_(list(ids))))


@contextlib.contextmanager
def open_catalog(url: str | None = None, *, check_schema: bool = True) -> Iterator[Catalog]:
    """The configured catalog (or `url`'s), its schema brought up to date, disposed of when the block ends: the one
    way a command, a run step, a Spark job or a DAG task opens the catalog. `check_schema=False` leaves the schema
    check to the block, for a step that records its own failure even when that check fails (runs/commit.py)."""
    catalog = Catalog(url)
    try:
        if check_schema:
            catalog.require_schema()
        yield catalog
    finally:
        catalog.dispose()


def chunk_from_row(row: ChunkRow, table_columns: Mapping[str, ColumnType]) -> Chunk:
    """The planner's view of a catalog chunk."""
    return Chunk(
        id=row.display_id,
        kind=row.kind,
        table=row.table,
        partition=row.partition,
        order=row.order,
        time_min=row.min_time,
        time_max=row.max_time,
        columns={c: table_columns[c] for c in row.column_names if c in table_columns},
        rows=row.row_count,
        tag_ranges=dict(row.tag_ranges),
        sort_key=row.sort_key,
        store=row.store,
        path=row.path,
        file_size=row.file_size if row.path is not None else None,
    )


class CatalogSource:
    """The planner's ChunkSource over one database of the catalog (read in short transactions)."""

    def __init__(self, catalog: Catalog, db: str) -> None:
        from iox_planner.catalog.retention import retention_of

        self.catalog = catalog
        self.db = db
        with catalog.engine.connect() as conn:
            self.db_id = catalog.database_id(conn, db)
            self._tables = {
                name: TableSchema(name, catalog.table_columns(conn, tid))
                for name, tid in catalog.table_ids(conn, self.db_id).items()
            }
            self._retention = retention_of(conn, self.db_id)
        self.watermarks: dict[str, int] = {}

    def tables(self) -> Mapping[str, TableSchema]:
        return self._tables

    def retention(self) -> int | None:
        return self._retention

    def change_window(self, since: str) -> ChangeWindow:
        """The window of a changes read since the watermark text `since` (catalog/changes.py), validated; taken
        before any chunk list, so every write inside it is in every table's list."""
        from iox_planner.catalog.changes import change_window

        with self.catalog.engine.connect() as conn:
            return change_window(conn, self.db_id, self.db, since)

    def written(self, table: str, since: int, until: int) -> Sequence[tuple[int, int]]:
        """Where keys of `table` written in `(since, until]` lie (the write log); a table dropped in that window is
        an error (catalog/changes.py)."""
        from iox_planner.catalog.changes import check_not_dropped, written_ranges

        window = ChangeWindow(since, until, "")
        with self.catalog.engine.connect() as conn:
            check_not_dropped(conn, self.db_id, self.db, table, window)
            return written_ranges(conn, self.db_id, table, window)

    def reads(self) -> list[TableRead]:
        """What the planner read so far: per table, the committed order counter of its snapshot."""
        return [TableRead(self.db_id, self.db, t, w) for t, w in sorted(self.watermarks.items())]

    def chunks(self, table: str, time_min: int | None, time_max: int | None) -> Sequence[Chunk]:
        # One snapshot (REPEATABLE READ) for the chunk list and the database's committed order counter: every write
        # the list lacks has an order above that counter (catalog/freshness.py), which `watermarks` keeps per table
        # for a materialized run to record.
        with self.catalog.engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
            with conn.begin():
                mark = committed_order(conn, self.db_id)
                rows = self.catalog.chunk_rows(conn, self.db_id, table=table, time_min=time_min,
                                               time_max=time_max)
        self.watermarks[table] = min(mark, self.watermarks.get(table, mark))
        schema = self._tables[table].columns
        return [chunk_from_row(r, schema) for r in rows]

    def sort_keys(self, table: str) -> Mapping[str, tuple[str, ...]]:
        with self.catalog.engine.connect() as conn:
            rows = self.catalog.partition_rows(conn, self.db_id, table)
        return {r.partition_key: tuple(r.sort_key) for r in rows if r.sort_key is not None}

