"""Plan nodes: frozen, typed values, validated at construction (an invalid node is a planner bug: InternalError).

A scan tree (one per table reference of the query) is built from the nodes of seed 000 and seed 001; the root of
a whole plan is `QueryPlan` (rendered as `QueryExec`). Every node knows its output `schema` (column names, in
order). Inside a scan tree every schema is a subsequence of the table's canonical order: `__chunk_order`, then
the tags, the fields and `time` (`SELECT *` order), so projections only ever select.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Iterable, Iterator, Mapping, Sequence, Union

from iox_planner.errors import InternalError
from iox_planner.model import CHUNK_ORDER, TIME, ChangeWindow, Chunk, ChunkKind, ColumnType
from iox_planner.planner.predicate import Conjunct, columns_of

if TYPE_CHECKING:
    from iox_planner.planner.settings import PlannerSettings

ParamValue = Union[str, int, float, bool, None]


def _fail(node: str, why: str) -> InternalError:
    return InternalError(f"invalid {node}: {why}")


@dataclass(frozen=True, slots=True)
class SortItem:
    """One sort expression. `nulls_first` defaults to DataFusion's default for ascending order."""

    column: str
    descending: bool = False
    nulls_first: bool = True


_SET = object.__setattr__
_SETS: dict[tuple[str, ...], frozenset[str]] = {}


def _as_set(columns: tuple[str, ...]) -> frozenset[str]:
    """The columns as a set, cached: plans share a handful of schema tuples across thousands of nodes."""
    found = _SETS.get(columns)
    if found is None:
        if len(_SETS) > 4096:
            _SETS.clear()
        found = _SETS[columns] = frozenset(columns)
    return found


def _check_columns(node: str, what: str, needed: Iterable[str], available: tuple[str, ...]) -> None:
    have = _as_set(available)
    missing = [c for c in needed if c not in have]
    if missing:
        raise _fail(node, f"{what} {sorted(missing)} not among its input columns {list(available)}")


def _check_unique(node: str, columns: tuple[str, ...]) -> None:
    if len(_as_set(columns)) != len(columns):
        raise _fail(node, f"duplicate columns in {list(columns)}")


class PlanNode:
    """Base of the scan-tree nodes. Subclasses are frozen dataclasses; change them by copy (`with_children`)."""

    __slots__ = ()
    name: ClassVar[str]

    @property
    def schema(self) -> tuple[str, ...]:
        raise NotImplementedError

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return ()

    def with_children(self, children: Sequence[PlanNode]) -> PlanNode:
        if children:
            raise _fail(self.name, "a leaf has no children")
        return self

    def walk(self) -> Iterator[PlanNode]:
        """This node and every node below it, parents first."""
        stack: list[PlanNode] = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def scanned_chunks(self) -> list[Chunk]:
        """Every chunk scanned at or below this node (scans and inner nodes say which)."""
        return []


class _Unary(PlanNode):
    __slots__ = ()
    child: PlanNode

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return (self.child,)

    def with_children(self, children: Sequence[PlanNode]) -> PlanNode:
        if len(children) != 1:
            raise _fail(self.name, f"takes one child, got {len(children)}")
        if children[0] is self.child:
            return self
        return self.with_child(children[0])

    def with_child(self, child: PlanNode) -> PlanNode:
        raise NotImplementedError

    def scanned_chunks(self) -> list[Chunk]:
        return self.child.scanned_chunks()


@dataclass(frozen=True, slots=True)
class ProjectionExec(_Unary):
    """Keeps `columns` of its input (never computes: seed 000's projections only select)."""

    name: ClassVar[str] = "ProjectionExec"
    columns: tuple[str, ...]
    child: PlanNode

    def __post_init__(self) -> None:
        _check_unique(self.name, self.columns)
        _check_columns(self.name, "columns", self.columns, self.child.schema)

    def with_child(self, child: PlanNode) -> PlanNode:
        return ProjectionExec(self.columns, child)

    @property
    def schema(self) -> tuple[str, ...]:
        return self.columns


@dataclass(frozen=True, slots=True)
class FilterExec(_Unary):
    """Keeps the rows for which every conjunct is true."""

    name: ClassVar[str] = "FilterExec"
    predicate: tuple[Conjunct, ...]
    child: PlanNode

    def __post_init__(self) -> None:
        if not self.predicate:
            raise _fail(self.name, "an empty predicate (drop the FilterExec instead)")
        _check_columns(self.name, "predicate columns", columns_of(self.predicate), self.child.schema)

    def with_child(self, child: PlanNode) -> PlanNode:
        return FilterExec(self.predicate, child)

    @property
    def schema(self) -> tuple[str, ...]:
        return self.child.schema


@dataclass(frozen=True, slots=True)
class DeduplicateExec(_Unary):
    """Merges rows with equal key (IOx semantics); needs its input sorted on (`sort_key`, `__chunk_order`).

    `time_slice`, when set, is an inclusive `(start, end)` range of `time`: the dedup reads and emits only its
    input rows inside it (the slicing pass cuts one wide group into several such dedups over the same chunks;
    rows with different times are never duplicates, so each slice merges alone)."""

    name: ClassVar[str] = "DeduplicateExec"
    sort_key: tuple[SortItem, ...]
    child: PlanNode
    time_slice: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if not self.sort_key:
            raise _fail(self.name, "an empty sort key")
        columns = tuple(s.column for s in self.sort_key)
        _check_unique(self.name, columns)
        _check_columns(self.name, "sort key", columns + (CHUNK_ORDER,), self.child.schema)
        if self.time_slice is not None:
            start, end = self.time_slice
            if (not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end)) or start > end
                    or TIME not in columns):
                raise _fail(self.name, f"time_slice {self.time_slice!r} must be two ordered integers on a key "
                                       "with time")

    def with_child(self, child: PlanNode) -> PlanNode:
        return DeduplicateExec(self.sort_key, child, self.time_slice)

    @property
    def schema(self) -> tuple[str, ...]:
        return self.child.schema

    @staticmethod
    def trusted(sort_key: tuple[SortItem, ...], child: PlanNode,
                time_slice: tuple[int, int] | None = None) -> DeduplicateExec:
        """Construction without validation, for the splits' hot path (thousands of groups): the key is derived
        from the child's own chunks. The final sanity check validates the finished plan."""
        node = object.__new__(DeduplicateExec)
        _SET(node, "sort_key", sort_key)
        _SET(node, "child", child)
        _SET(node, "time_slice", time_slice)
        return node

    @property
    def required_order(self) -> tuple[SortItem, ...]:
        """The order its input must have: the key, then `__chunk_order` (older rows first)."""
        return self.sort_key + (SortItem(CHUNK_ORDER),)


@dataclass(frozen=True, slots=True)
class UnionExec(PlanNode):
    """Concatenates inputs of one schema."""

    name: ClassVar[str] = "UnionExec"
    inputs: tuple[PlanNode, ...]

    def __post_init__(self) -> None:
        if not self.inputs:
            raise _fail(self.name, "no inputs")
        first = self.inputs[0].schema
        for other in self.inputs[1:]:
            schema = other.schema
            if schema is not first and schema != first:
                raise _fail(self.name, f"inputs differ in schema: {list(first)} and {list(other.schema)}")

    @property
    def schema(self) -> tuple[str, ...]:
        return self.inputs[0].schema

    @property
    def children(self) -> tuple[PlanNode, ...]:
        return self.inputs

    def with_children(self, children: Sequence[PlanNode]) -> PlanNode:
        if len(children) == len(self.inputs) and all(a is b for a, b in zip(children, self.inputs)):
            return self
        return UnionExec(tuple(children))

    def scanned_chunks(self) -> list[Chunk]:
        out: list[Chunk] = []
        for child in self.inputs:
            out.extend(child.scanned_chunks())
        return out


class _Sorting(_Unary):
    """What SortExec and SortPreservingMergeExec share: a non-empty sort over input columns, same schema."""

    __slots__ = ()
    sort: tuple[SortItem, ...]

    def __post_init__(self) -> None:
        if not self.sort:
            raise _fail(self.name, "no sort expressions")
        _check_columns(self.name, "sort columns", [s.column for s in self.sort], self.child.schema)

    def with_child(self, child: PlanNode) -> PlanNode:
        return type(self)(self.sort, child)  # type: ignore[call-arg]

    @property
    def schema(self) -> tuple[str, ...]:
        return self.child.schema


@dataclass(frozen=True, slots=True)
class SortExec(_Sorting):
    """Sorts all its input partitions into one sorted stream."""

    name: ClassVar[str] = "SortExec"
    sort: tuple[SortItem, ...]
    child: PlanNode


@dataclass(frozen=True, slots=True)
class SortPreservingMergeExec(_Sorting):
    """Merges input partitions that are each sorted on `sort` into one sorted stream."""

    name: ClassVar[str] = "SortPreservingMergeExec"
    sort: tuple[SortItem, ...]
    child: PlanNode


@dataclass(frozen=True, slots=True)
class EmptyExec(PlanNode):
    """No rows (every chunk of the table was pruned, or it has none)."""

    name: ClassVar[str] = "EmptyExec"
    columns: tuple[str, ...]

    def __post_init__(self) -> None:
        _check_unique(self.name, self.columns)

    @property
    def schema(self) -> tuple[str, ...]:
        return self.columns


@dataclass(frozen=True, slots=True)
class ParquetExec(PlanNode):
    """Scans Parquet files of one store: each file group is read in order as one partition.

    `predicate` may be evaluated while scanning (its columns need not be projected); `output_ordering`, when set,
    holds for every group, so only single-file groups may claim it (IOx issue #6125).
    """

    name: ClassVar[str] = "ParquetExec"
    store: str
    file_groups: tuple[tuple[Chunk, ...], ...]
    projection: tuple[str, ...]
    predicate: tuple[Conjunct, ...] = ()
    output_ordering: tuple[SortItem, ...] = ()

    def __post_init__(self) -> None:
        if not self.file_groups or not all(self.file_groups):
            raise _fail(self.name, "an empty file group")
        _check_unique(self.name, self.projection)
        table = self.file_groups[0][0].table
        parquet, store = ChunkKind.PARQUET, self.store
        for group in self.file_groups:
            for chunk in group:
                if chunk.kind is not parquet or chunk.store != store or chunk.table != table:
                    raise _fail(
                        self.name,
                        f"chunk {chunk.id} ({chunk.kind.value}, table {chunk.table}, store {chunk.store}) "
                        f"does not belong to a ParquetExec over table {table} in store {self.store}",
                    )
        if self.output_ordering:
            if any(len(g) > 1 for g in self.file_groups):
                raise _fail(self.name, "output_ordering with a group of several files (IOx issue #6125)")
            _check_columns(self.name, "output_ordering", [s.column for s in self.output_ordering], self.projection)

    @property
    def schema(self) -> tuple[str, ...]:
        return self.projection

    @staticmethod
    def single(chunk: Chunk, projection: tuple[str, ...]) -> ParquetExec:
        """A scan of one file, without re-validating (hot path of the splits; see DeduplicateExec.trusted)."""
        if chunk.kind is not ChunkKind.PARQUET:
            raise _fail("ParquetExec", f"chunk {chunk.id} is not a Parquet file")
        node = object.__new__(ParquetExec)
        _SET(node, "store", chunk.store)
        _SET(node, "file_groups", ((chunk,),))
        _SET(node, "projection", projection)
        _SET(node, "predicate", ())
        _SET(node, "output_ordering", ())
        return node

    def derive(self, *, file_groups: tuple[tuple[Chunk, ...], ...] | None = None,
               projection: tuple[str, ...] | None = None, predicate: tuple[Conjunct, ...] | None = None,
               output_ordering: tuple[SortItem, ...] | None = None) -> ParquetExec:
        """A copy with some attributes changed, validating only what changed (new file groups must hold the same
        files: scans of 100,000 files are copied by several passes)."""
        node = object.__new__(ParquetExec)
        groups = self.file_groups if file_groups is None else file_groups
        if groups is not self.file_groups:
            if not groups or not all(groups) or sum(map(len, groups)) != sum(map(len, self.file_groups)):
                raise _fail(self.name, "regrouped files must be the same files, in non-empty groups")
        _SET(node, "store", self.store)
        _SET(node, "file_groups", groups)
        _SET(node, "projection", self.projection if projection is None else projection)
        _SET(node, "predicate", self.predicate if predicate is None else predicate)
        _SET(node, "output_ordering", self.output_ordering if output_ordering is None else output_ordering)
        if projection is not None:
            _check_unique(self.name, projection)
        if node.output_ordering:
            if any(len(g) > 1 for g in node.file_groups):
                raise _fail(self.name, "output_ordering with a group of several files (IOx issue #6125)")
            _check_columns(self.name, "output_ordering", [s.column for s in node.output_ordering], node.projection)
        return node

    @staticmethod
    def merge(scans: Sequence[ParquetExec], file_groups: tuple[tuple[Chunk, ...], ...]) -> ParquetExec:
        """One scan over the files of several scans of one store, projection and table, none with a predicate or
        an ordering: their files were validated when they were built, so only the merge itself is checked."""
        first = scans[0]
        for scan in scans:
            if (scan.store != first.store or scan.projection != first.projection or scan.predicate
                    or scan.output_ordering or scan.file_groups[0][0].table != first.file_groups[0][0].table):
                raise _fail("ParquetExec", "only scans of one store and projection, without predicate or "
                                           "ordering, merge")
        return first.derive(file_groups=file_groups) if len(scans) == 1 else ParquetExec._merged(
            first, file_groups, sum(len(f) for s in scans for f in s.file_groups))

    @staticmethod
    def _merged(first: ParquetExec, file_groups: tuple[tuple[Chunk, ...], ...], files: int) -> ParquetExec:
        if not file_groups or not all(file_groups) or sum(map(len, file_groups)) != files:
            raise _fail("ParquetExec", "merged file groups must hold exactly the merged files")
        node = object.__new__(ParquetExec)
        _SET(node, "store", first.store)
        _SET(node, "file_groups", file_groups)
        _SET(node, "projection", first.projection)
        _SET(node, "predicate", ())
        _SET(node, "output_ordering", ())
        return node

    def files(self) -> list[Chunk]:
        if len(self.file_groups) == 1:
            return list(self.file_groups[0])
        return [c for g in self.file_groups for c in g]

    def scanned_chunks(self) -> list[Chunk]:
        return self.files()


@dataclass(frozen=True, slots=True)
class RecordBatchesExec(PlanNode):
    """Scans ingester chunks (unsorted, may hold duplicates); columns a chunk lacks come out NULL."""

    name: ClassVar[str] = "RecordBatchesExec"
    chunks: tuple[Chunk, ...]
    projection: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.chunks:
            raise _fail(self.name, "no chunks")
        _check_unique(self.name, self.projection)
        table = self.chunks[0].table
        for chunk in self.chunks:
            if chunk.kind is not ChunkKind.INGESTER or chunk.table != table:
                raise _fail(self.name, f"chunk {chunk.id} ({chunk.kind.value}) is not an ingester chunk of {table}")

    @property
    def schema(self) -> tuple[str, ...]:
        return self.projection

    def scanned_chunks(self) -> list[Chunk]:
        return list(self.chunks)


LEAVES = (ParquetExec, RecordBatchesExec)


def leaf_with_projection(leaf: PlanNode, projection: tuple[str, ...]) -> PlanNode:
    """A copy of a leaf reading `projection`; an output ordering keeps its prefix that is still projected."""
    if isinstance(leaf, RecordBatchesExec):
        return leaf if leaf.projection == projection else RecordBatchesExec(leaf.chunks, projection)
    if isinstance(leaf, ParquetExec):
        if leaf.projection == projection:
            return leaf
        ordering: list[SortItem] = []
        for item in leaf.output_ordering:
            if item.column not in projection:
                break
            ordering.append(item)
        return leaf.derive(projection=projection, output_ordering=tuple(ordering))
    raise InternalError(f"{leaf.name} is not a scan leaf")


# ----------------------------------------------------------------------------------------------------------------
# The root


@dataclass(frozen=True, slots=True)
class ScanInfo:
    """One table reference of the query and the Spark view its scan tree feeds (`SELECT ... FROM view AS alias`).

    `columns` are the view's columns in order with their types; `time` is int64 nanoseconds in the scan tree.
    """

    view: str
    table: str
    alias: str
    columns: tuple[tuple[str, ColumnType], ...]


@dataclass(frozen=True, slots=True)
class ScanPruning:
    """What pruning did for one scan, before planning."""

    view: str
    table: str
    partitions_considered: int
    partitions_pruned: int
    chunks_considered: int
    chunks_pruned: int
    pruned_by_partition: int = 0
    pruned_by_time: int = 0
    pruned_by_tag: int = 0
    time_min: int | None = None
    time_max: int | None = None
    pruned_by_retention: int = 0
    """Chunks wholly at or before the retention cutoff (a partition wholly past it: all its chunks)."""
    pruned_by_changes: int = 0
    """Chunks a changes read leaves out: none of their time lies where keys were written inside its window."""


@dataclass(frozen=True)
class QueryPlan:
    """The whole plan (rendered as `QueryExec`): the query, what the executor needs to run it on Spark, what
    pruning did, notes (why a limit stopped a split), and one scan tree per table reference as `children`.

    `spark_sql` is the user's query with the planner's edits spliced in (`planner/sql/splice.py`): each table
    reference replaced by its scan's view (`scans[i].view`, aliased as the reference was), stars kept off the
    views' internal columns, clocks fixed; bound parameters stay `:name` for `spark.sql(spark_sql, args=params)`.
    `time_columns` names the result columns that are a table's `time` passed through unchanged. `naming_sql`,
    when set, is `spark_sql` without the clock edits: the result's column names are taken from it.
    """

    name: ClassVar[str] = "QueryExec"
    sql: str
    spark_sql: str
    now: int
    params: Mapping[str, ParamValue]
    time_range: tuple[int | None, int | None]
    settings: PlannerSettings
    scans: tuple[ScanInfo, ...]
    time_columns: tuple[str, ...]
    pruning: tuple[ScanPruning, ...]
    notes: tuple[str, ...]
    children: tuple[PlanNode, ...] = field(default=())
    naming_sql: str | None = None
    retention: tuple[int, int] | None = None
    """(retention period, cutoff) in ns when the database has one: rows with `time <= cutoff` are excluded."""
    changes: ChangeWindow | None = None
    """A changes read's window: only keys whose newest write order lies in it (`model.WRITE_ORDER`)."""

    def __post_init__(self) -> None:
        if len(self.scans) != len(self.children) or len(self.pruning) != len(self.scans):
            raise _fail(self.name, f"{len(self.scans)} scans, {len(self.pruning)} pruning reports and "
                                   f"{len(self.children)} scan trees")
        for scan, tree in zip(self.scans, self.children):
            if tuple(c for c, _ in scan.columns) != tree.schema:
                raise _fail(self.name, f"scan {scan.view} promises columns {[c for c, _ in scan.columns]} but its "
                                       f"tree produces {list(tree.schema)}")

    def chunks(self) -> dict[str, Chunk]:
        """Every chunk the plan scans, by id."""
        out: dict[str, Chunk] = {}
        for tree in self.children:
            for chunk in tree.scanned_chunks():
                seen = out.setdefault(chunk.id, chunk)
                if seen is not chunk and seen != chunk:
                    raise InternalError(f"two different chunks share the id {chunk.id!r}")
        return out


QueryExec = QueryPlan


def output_order(node: PlanNode) -> tuple[int, tuple[SortItem, ...]]:
    """How a node's output comes: (number of partitions, the order each partition is sorted in, or ())."""
    if isinstance(node, ParquetExec):
        return len(node.file_groups), node.output_ordering
    if isinstance(node, RecordBatchesExec):
        return len(node.chunks), ()
    if isinstance(node, (SortExec, SortPreservingMergeExec)):
        return 1, node.sort
    if isinstance(node, DeduplicateExec):
        return 1, node.sort_key
    if isinstance(node, EmptyExec):
        return 1, ()
    if isinstance(node, FilterExec):
        return output_order(node.child)
    if isinstance(node, ProjectionExec):
        parts, ordering = output_order(node.child)
        kept: list[SortItem] = []
        for item in ordering:
            if item.column not in node.columns:
                break
            kept.append(item)
        return parts, tuple(kept)
    if isinstance(node, UnionExec):
        orders = [output_order(c) for c in node.inputs]
        common = orders[0][1]
        return sum(p for p, _ in orders), common if all(o == common for _, o in orders) else ()
    raise InternalError(f"no output order known for {node.name}")


def sorted_by(ordering: tuple[SortItem, ...], required: tuple[SortItem, ...]) -> bool:
    """Whether rows in `ordering` are also in `required` order (it is a prefix of `ordering`)."""
    return ordering[: len(required)] == required
