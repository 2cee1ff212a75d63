"""What the catalog knows about tables and chunks, as the planner sees it. Plain immutable values."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from iox_planner.timeutil import check_range, format_time, partition_bounds

CHUNK_ORDER = "__chunk_order"
"""Virtual column carrying chunk order (and write position for ingester data) down to the dedup."""

WRITE_SEQ = "__seq"
"""Stored column of an ingester chunk: each row's write position inside its chunk (later wins)."""

TIME = "time"

DB_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # always with fullmatch: `$` would let a trailing newline through
"""A database's name (catalog/names.py `check_db_name`; the settings that list databases)."""

WRITE_ORDER = "__write_order"
"""Stored column of a persisted or compacted Parquet file: per row, the order of the newest write of its key (the
dedup keeps it as it keeps any never-null field). A file without it (an ingester chunk, a file of one write, a file
persisted before catalog migration 0008) has its own order on every row. A changes read filters on it, as a
virtual column the executor fills from the file or the chunk's order."""

# --- the one place for names iox-batch adds to what Spark sees, and for the chunk-order packing ---------------------

TIME_NS = "__time_ns"
"""Reserved, and the suffix of each view's nanosecond column (`time_ns_column`)."""
VIEW_PREFIX = "__iox_scan_"
"""Each scan tree is registered as the view `__iox_scan_<k>`."""
NS_PREFIX = "__iox_ns_"
"""A top-level result column `__iox_ns_<name>` holds the exact nanoseconds of the time column `<name>`."""
HIDDEN_PREFIX = "__iox_tns_"
"""A hidden item a subquery or CTE passes the nanoseconds of one of its time columns through as."""
INTERNAL_PREFIX = "__iox_"
"""Every name iox-batch adds to the SQL Spark runs starts so (views, nanosecond helpers), or is one of
`INTERNAL_NAMES`; a user's query may use none of them, in any spelling."""
INTERNAL_NAMES = frozenset({TIME_NS, CHUNK_ORDER, WRITE_SEQ, WRITE_ORDER})


def time_ns_column(view: str) -> str:
    """The column of view `view` holding each row's exact `time` in int64 nanoseconds (next to `time` as a
    microsecond TIMESTAMP). Named after its view, so two views never share it: a NATURAL JOIN of two views joins
    on the tables' own columns only, and a `* EXCEPT (...)` can name it unqualified."""
    return f"{view}{TIME_NS}"

ORDER_SHIFT = 32
"""`__chunk_order` = chunk order << 32 | write position: one int64 keeps Spark's dedup aggregation hashed."""
MAX_ORDER = 2**31 - 1
"""The highest chunk order: packed with ORDER_SHIFT it stays a positive int64."""
MAX_WRITE_POSITION = 2**32 - 1
"""The highest write position inside an ingester chunk (the low 32 bits of the packing)."""


def pack_order(order: int, position: int = 0) -> int:
    """The `__chunk_order` value of row `position` of a chunk of order `order` (later wins in the dedup)."""
    return (order << ORDER_SHIFT) | position


class ColumnType(str, enum.Enum):
    TAG = "tag"
    FLOAT = "float"
    INTEGER = "integer"
    UNSIGNED = "unsigned"
    BOOLEAN = "boolean"
    STRING = "string"
    TIME = "time"

    @property
    def is_field(self) -> bool:
        return self not in (ColumnType.TAG, ColumnType.TIME)

    @property
    def is_key(self) -> bool:
        return not self.is_field


SPARK_SQL_TYPES: Mapping[ColumnType, str] = {
    ColumnType.TAG: "STRING",
    ColumnType.STRING: "STRING",
    ColumnType.FLOAT: "DOUBLE",
    ColumnType.INTEGER: "BIGINT",
    # Spark reads Parquet UINT64 as DECIMAL(20, 0): the whole 0..2^64-1 range survives.
    ColumnType.UNSIGNED: "DECIMAL(20, 0)",
    ColumnType.BOOLEAN: "BOOLEAN",
    ColumnType.TIME: "TIMESTAMP",
}
"""THE map from catalog types to Spark SQL types, as a query's view shows them (`time` a TIMESTAMP). The files
hold `time` as int64 nanoseconds: spark_jobs/transform.py reads it as BIGINT and `to_view` converts it. The Arrow
map is ingest/files.py's (one per engine)."""


class ChunkKind(str, enum.Enum):
    PARQUET = "parquet"
    INGESTER = "ingester"


LOCAL_STORE = "file://"


@dataclass(frozen=True)
class Chunk:
    """One chunk: an ingester chunk (unsorted, may hold duplicates) or a persisted Parquet file (sorted, no dups).

    `time_min`/`time_max` are inclusive nanoseconds; None means unknown. `columns` maps each column the chunk has
    to its type. `tag_ranges` holds per-tag (min, max) where known. `sort_key` is the file's sort key (Parquet only).
    `path` is relative to the warehouse (None for metadata-only chunks); `file_size` is its size in bytes as the
    catalog recorded it (None: unknown), so a reader on object storage opens it without asking the store.
    """

    id: str
    kind: ChunkKind
    table: str
    partition: str
    order: int
    time_min: int | None
    time_max: int | None
    columns: Mapping[str, ColumnType]
    rows: int | None = None
    tag_ranges: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    sort_key: tuple[str, ...] = ()
    store: str = LOCAL_STORE
    path: str | None = None
    file_size: int | None = None

    @property
    def may_contain_pk_duplicates(self) -> bool:
        return self.kind is ChunkKind.INGESTER

    @property
    def has_time_range(self) -> bool:
        return self.time_min is not None and self.time_max is not None


@dataclass(frozen=True)
class TableSchema:
    """A table's columns (name -> type) and, per partition, its sort key where one is fixed."""

    name: str
    columns: Mapping[str, ColumnType]

    @property
    def tags(self) -> list[str]:
        return sorted(c for c, t in self.columns.items() if t is ColumnType.TAG)

    @property
    def fields(self) -> list[str]:
        return sorted(c for c, t in self.columns.items() if t.is_field)

    @property
    def star_columns(self) -> list[str]:
        """`SELECT *` order: tags, then fields, each by name, then time."""
        return [*self.tags, *self.fields, TIME]


@dataclass(frozen=True)
class ChangeWindow:
    """What a changes read returns: the current rows of the keys whose newest write has an order in `(since,
    until]`. `watermark` is `until` as the opaque text to pass as the next read's `since` (catalog/changes.py)."""

    since: int
    until: int
    watermark: str

    def __post_init__(self) -> None:
        if not 0 <= self.since <= self.until <= MAX_ORDER:
            raise ValueError(f"a change window needs 0 <= since <= until <= {MAX_ORDER}")


class ChunkSource(Protocol):
    """Where the planner gets tables and chunks: the Postgres catalog, or a scenario file's metadata alone."""

    def tables(self) -> Mapping[str, TableSchema]:
        """Every table of the database, by name."""
        ...

    def chunks(self, table: str, time_min: int | None, time_max: int | None) -> Sequence[Chunk]:
        """Live chunks of `table` whose time range may overlap the inclusive `[time_min, time_max]` (None: open).

        Chunks with unknown time range are always returned.
        """
        ...

    def sort_keys(self, table: str) -> Mapping[str, tuple[str, ...]]:
        """The partition sort key of each partition of `table` that has one fixed."""
        ...

    def retention(self) -> int | None:
        """The database's retention period in ns (None: data is kept forever)."""
        ...

    def written(self, table: str, since: int, until: int) -> Sequence[tuple[int, int]]:
        """Inclusive time ranges holding every key of `table` written with an order in `(since, until]`, sorted
        and disjoint (a superset is fine: a changes read's exact cut is the rows' write orders)."""
        ...


@dataclass(frozen=True)
class StaticSource:
    """A ChunkSource over chunks held in memory (scenario metadata, tests). Tables derive from their chunks
    unless given."""

    chunk_list: tuple[Chunk, ...]
    table_schemas: Mapping[str, TableSchema] = field(default_factory=dict)
    partition_sort_keys: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    retention_ns: int | None = None

    def tables(self) -> Mapping[str, TableSchema]:
        out: dict[str, dict[str, ColumnType]] = {}
        for chunk in self.chunk_list:
            out.setdefault(chunk.table, {}).update(chunk.columns)
        schemas = {name: TableSchema(name, cols) for name, cols in out.items()}
        schemas.update(self.table_schemas)
        return schemas

    def chunks(self, table: str, time_min: int | None, time_max: int | None) -> Sequence[Chunk]:
        def overlaps(c: Chunk) -> bool:
            if not c.has_time_range:
                return True
            assert c.time_min is not None and c.time_max is not None
            return (time_max is None or c.time_min <= time_max) and (time_min is None or c.time_max >= time_min)

        return [c for c in self.chunk_list if c.table == table and overlaps(c)]

    def sort_keys(self, table: str) -> Mapping[str, tuple[str, ...]]:
        return dict(self.partition_sort_keys.get(table, {}))

    def retention(self) -> int | None:
        return self.retention_ns

    def written(self, table: str, since: int, until: int) -> Sequence[tuple[int, int]]:
        """The time ranges of the chunks of `table` with an order in `(since, until]` (a chunk of unknown time
        range: its whole day), merged."""
        from iox_planner.timeutil import partition_bounds

        spans = []
        for c in self.chunk_list:
            if c.table == table and since < c.order <= until:
                spans.append((c.time_min, c.time_max) if c.time_min is not None and c.time_max is not None
                             else partition_bounds(c.partition))
        return merge_ranges(spans)


@dataclass(frozen=True)
class RunKey:
    """What a run lock protects: one definition's (or output's) half-open interval, in ns."""

    definition: str
    interval_start: int
    interval_end: int

    def __post_init__(self) -> None:
        if not self.definition:
            raise ValueError("a run key needs a definition")
        check_range(self.interval_start, self.interval_end)

    def describe(self) -> str:
        return f"{self.definition} [{format_time(self.interval_start)}, {format_time(self.interval_end)})"


def merge_ranges(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Inclusive ranges sorted and merged where they overlap or touch."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out
