"""What one write may add to the catalog: tables per database (`IOX_DB_MAX_TABLES`), columns per table
(`IOX_TABLE_MAX_COLUMNS`, tags, fields and time) and partitions one write touches (`IOX_WRITE_MAX_PARTITIONS`).
Line-level bounds (bytes, tags plus fields per line, names) are `ingest/lineprotocol/limits.py`'s.

Every way data enters (a streamed write, the bulk load, a scenario load, a `register_as` registration) opens a
`WriteGuard` once it holds the database's order lock (`locks.lock_orders`), which every writer into the database
takes before its first insert and keeps until its commit. The guard reads the catalog's live tables then, and a
table's columns the first time the write names it; `admit` adds what the write brings (a table's column names, a
partition) to its `WriteShape` and notes the first limit it passes. Counts are unions by name (what the catalog
holds plus what the write adds), so a second guard over a shape the same transaction already stored into counts
nothing twice. Since no other writer into the database can add a table or column between the guard's read and
the commit, two writers racing to a limit cannot both pass under it: the second reads what the first committed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from sqlalchemy.engine import Connection

from iox_planner import config
from iox_planner.catalog.names import excerpt
from iox_planner.catalog.store import Catalog
from iox_planner.errors import BadInputError
from iox_planner.model import ColumnType


@dataclass(frozen=True)
class CatalogLimits:
    max_tables: int = config.DB_MAX_TABLES.default
    max_columns: int = config.TABLE_MAX_COLUMNS.default
    max_partitions: int = config.WRITE_MAX_PARTITIONS.default

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CatalogLimits:
        return cls(config.DB_MAX_TABLES.read(env), config.TABLE_MAX_COLUMNS.read(env),
                   config.WRITE_MAX_PARTITIONS.read(env))


@dataclass
class WriteShape:
    """What a write adds, as far as it was read: per table its column names (seeded with those the catalog holds),
    and the (table, day) partitions it touches."""

    columns: dict[str, set[str]] = field(default_factory=dict)
    existing_columns: dict[str, int] = field(default_factory=dict)
    """Per table, how many columns the catalog held when the write first named it."""
    partitions: set[tuple[str, str]] = field(default_factory=set)


class WriteGuard:
    """The catalog limits of one write into one database, read under its order lock (see the module docstring).
    `columns(table)` serves the table's catalog columns (cached) to the writer's type checks too."""

    def __init__(self, catalog: Catalog, conn: Connection, db: str, db_id: int, *,
                 limits: CatalogLimits | None = None, shape: WriteShape | None = None) -> None:
        self.catalog, self.conn, self.db = catalog, conn, db
        self.limits = limits or CatalogLimits.from_env()
        self.shape = shape if shape is not None else WriteShape()
        self.table_ids = catalog.table_ids(conn, db_id)
        self.existing_tables = len(self.table_ids)
        self._names = set(self.table_ids) | set(self.shape.columns)
        self._catalog_columns: dict[str, dict[str, ColumnType]] = {}
        # The first limit the write passed, worded by `refuse` at the end (the counts keep growing until then).
        self._over: tuple[str, str | None] | None = None

    def columns(self, table: str) -> Mapping[str, ColumnType]:
        """The table's columns in the catalog ({} for a table it does not hold)."""
        found = self._catalog_columns.get(table)
        if found is None:
            table_id = self.table_ids.get(table)
            found = {} if table_id is None else self.catalog.table_columns(self.conn, table_id)
            self._catalog_columns[table] = found
        return found

    def prefetch(self, tables: Iterable[str]) -> None:
        """Read the catalog columns of every table of `tables` not read yet, in one query."""
        wanted = {self.table_ids[t]: t for t in set(tables) if t in self.table_ids and t not in self._catalog_columns}
        if wanted:
            found = self.catalog.columns_of(self.conn, list(wanted))
            for table_id, name in wanted.items():
                self._catalog_columns[name] = found.get(table_id, {})

    def admit(self, table: str, columns: Iterable[str], partition: str | None) -> bool:
        """Count what a piece of the write brings; False once the write is over a limit (it then stores nothing
        more, and `refuse` raises at the end, with the counts of the whole write)."""
        shape = self.shape
        known = shape.columns.get(table)
        if known is None:
            existing = self.columns(table)
            known = shape.columns[table] = set(existing)
            shape.existing_columns[table] = len(existing)
            if table not in self._names:
                self._names.add(table)
                if self._over is None and len(self._names) > self.limits.max_tables:
                    self._over = ("tables", None)
        known.update(columns)
        if self._over is None and len(known) > self.limits.max_columns:
            self._over = ("columns", table)
        if partition is not None:
            shape.partitions.add((table, partition))
            if self._over is None and len(shape.partitions) > self.limits.max_partitions:
                self._over = ("partitions", None)
        return self._over is None

    def refuse(self) -> None:
        """Raise the one paragraph for the first limit the write passed, if it passed one."""
        if self._over is None:
            return
        kind, table = self._over
        raise BadInputError(self._paragraph(kind, table))

    def _paragraph(self, kind: str, table: str | None) -> str:
        lim, shape, db = self.limits, self.shape, excerpt(self.db)
        if kind == "tables":
            new = sorted(self._names - set(self.table_ids))
            shown = ", ".join(excerpt(n) for n in new[:3]) + (", ..." if len(new) > 3 else "")
            return (f"nothing was written to {db}: the write would give the database {len(self._names):,} tables "
                    f"({self.existing_tables:,} it already has + {len(new):,} new: {shown}), and a database holds at "
                    f"most {lim.max_tables:,} (IOX_DB_MAX_TABLES; the catalog counts the tables the database "
                    "already has, dropped ones not). Write fewer measurements (a name that changes per line belongs "
                    "in a tag), drop tables no longer needed, or raise IOX_DB_MAX_TABLES")
        if kind == "columns":
            assert table is not None
            total, existing = len(shape.columns[table]), shape.existing_columns[table]
            return (f"nothing was written to {db}: the write would give table {excerpt(table)} {total:,} columns "
                    f"({existing:,} it already has + {total - existing:,} new; tags, fields and time count), and a "
                    f"table holds at most {lim.max_columns:,} (IOX_TABLE_MAX_COLUMNS; the catalog counts the "
                    "columns the table already has). Write fewer tag and field keys (a key that changes per line "
                    "belongs in a value), or raise IOX_TABLE_MAX_COLUMNS")
        return (f"nothing was written to {db}: the write touches {len(shape.partitions):,} partitions (one per "
                f"table and UTC day), and one write may touch at most {lim.max_partitions:,} "
                "(IOX_WRITE_MAX_PARTITIONS). Split the input by time into several writes, or raise "
                "IOX_WRITE_MAX_PARTITIONS")


def check_write(catalog: Catalog, conn: Connection, db: str, db_id: int,
                pieces: Iterable[tuple[str, Iterable[str], str | None]], *,
                shape: WriteShape | None = None) -> WriteGuard:
    """The limits of a write known whole before it stores anything (`(table, column names, partition)` pieces),
    checked under the database's order lock, which the caller holds; raises the one paragraph if it passes one.
    The catalog's columns of the tables named are read in one query."""
    pieces = list(pieces)
    guard = WriteGuard(catalog, conn, db, db_id, shape=shape)
    guard.prefetch(table for table, _, _ in pieces)
    for table, columns, partition in pieces:
        guard.admit(table, columns, partition)
    guard.refuse()
    return guard
