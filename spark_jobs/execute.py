"""Execute an iox-batch plan on Spark.

Scan trees become DataFrames: ParquetExec and RecordBatchesExec read exactly their files through Spark's Parquet
reader (projection and predicate pushed into it), FilterExec and ProjectionExec map to `where`/`select`, sort
nodes are a cost model Spark plans its own way, and every DeduplicateExec of a scan tree is evaluated by one
aggregation over the union of their inputs: the planner only splits dedups where keys cannot collide, so one
`groupBy` over all of them gives the same rows with one shuffle, and chunks outside any dedup never shuffle.

Each scan tree is registered as the view its `ScanInfo` names, with `time` converted at the edge from int64
nanoseconds to a Spark TIMESTAMP (the nanoseconds stay in `__time_ns`), and the query's SQL runs over the views
with its bound parameters.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

# PySpark warns about pandas 3 on import of its testing helpers; iox-batch moves data as Arrow, not pandas.
warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F
from pyspark.sql import types as T

from iox_planner.errors import BadInputError, CatalogError
from iox_planner.model import CHUNK_ORDER, TIME, WRITE_SEQ, Chunk, ChunkKind, ColumnType
from iox_planner.planner.nodes import (
    DeduplicateExec,
    EmptyExec,
    FilterExec,
    ParquetExec,
    PlanNode,
    ProjectionExec,
    QueryPlan,
    RecordBatchesExec,
    SortExec,
    SortPreservingMergeExec,
    UnionExec,
)
from iox_planner.planner.predicate import Conjunct, columns_of, predicate_sql
from iox_planner.planner.timebounds import time_bounds
from iox_planner.slicing import Span, disjoint_base
from spark_jobs.extract import check_file, group_inputs, read_distinct, share_meeting
from spark_jobs.transform import (
    chunk_order_column, deduplicate, deduplicate_window, file_type, q, to_view, union_all,
)

# --- metrics (explain --analyze) ---------------------------------------------------------------------------------


@dataclass
class NodeMetrics:
    rows_out: int | None = None
    rows_in: int | None = None
    files: int | None = None
    seconds: float | None = None

    @property
    def duplicates_removed(self) -> int | None:
        if self.rows_in is None or self.rows_out is None:
            return None
        return self.rows_in - self.rows_out


@dataclass
class Execution:
    """What running a plan produced: the result DataFrame and, when analyzing, per-node metrics."""

    result: DataFrame
    scans: list[DataFrame]
    metrics: dict[int, NodeMetrics] = field(default_factory=dict)


# --- scan trees ----------------------------------------------------------------------------------------------------


class Strategy(str, Enum):
    """How DeduplicateExec runs on Spark (results never depend on it; `benchmarks/bench_spark.py` compares them).

    ARROW: every dedup group of a union merged inside Python workers (`mapInArrow`), one task per group reading
    its files with pyarrow and merging them vectorized: no shuffle. SHARED: one `groupBy` over the union of all
    dedup inputs (the planner splits dedups only where keys cannot collide). NODE: one `groupBy` per
    DeduplicateExec, the literal translation of the plan.
    """

    ARROW = "arrow"
    SHARED = "shared"
    WINDOW = "window"
    NODE = "node"


DEFAULT_STRATEGY = Strategy.ARROW


class PassThrough(str, Enum):
    """Whether the ARROW strategy splits a dedup group so that rows which cannot have a duplicate skip the Python
    workers (`ScanBuilder._pass_through_split`): AUTO when the late chunks hold at most 1/PASS_THROUGH_RATIO of
    the base files' rows and at most 1/PASS_THROUGH_RATIO of the largest base file's rows may meet them, ALWAYS
    whenever the group has both (the tests' setting: it exercises the split on every shape), OFF never.
    `IOX_DEDUP_PASS_THROUGH` sets it; results never depend on it."""

    AUTO = "auto"
    ALWAYS = "always"
    OFF = "off"


PASS_THROUGH_RATIO = 4
MAX_LATE_VALUES = 256  # per tag: a longer IN list costs Spark more than the rows it keeps out of the workers


def _dedup_chain(node: PlanNode) -> tuple[list[PlanNode], DeduplicateExec] | None:
    """A DeduplicateExec under a chain of projections and filters: (the chain, top first; the dedup)."""
    chain: list[PlanNode] = []
    while isinstance(node, (ProjectionExec, FilterExec)):
        chain.append(node)
        node = node.child
    if isinstance(node, DeduplicateExec):
        return chain, node
    return None


def _signature(chain: Sequence[PlanNode], dedup: DeduplicateExec) -> tuple[object, ...]:
    """Dedups evaluated as one step must agree on the chain above them AND on their own columns: two groups
    under the same projection may read different columns (one partition's chunks lack a tag the other's have),
    and merging them with the first one's columns would drop the other's tag from its key (rows lost)."""
    above = tuple((n.columns if isinstance(n, ProjectionExec)
                   else n.predicate) for n in chain)  # type: ignore[attr-defined]
    return (above, tuple(dedup.schema))


class ScanBuilder:
    """Turns one scan tree into a DataFrame of its output columns (time as int64 ns)."""

    def __init__(self, spark: SparkSession, warehouse: Path, columns: Mapping[str, ColumnType],
                 strategy: Strategy | str = DEFAULT_STRATEGY, analyze: bool = False,
                 pass_through: PassThrough | str = PassThrough.AUTO) -> None:
        self.spark = spark
        self.warehouse = warehouse
        self.columns = dict(columns)
        self.strategy = Strategy(strategy)
        self.analyze = analyze
        self.pass_through = PassThrough(pass_through)
        self.metrics: dict[int, NodeMetrics] = {}
        self._late_cache: dict[tuple[str | None, tuple[str, ...]], dict[str, set[str | None] | None]] = {}

    def schema_for(self, names: Iterable[str]) -> T.StructType:
        # A column no scanned chunk has is NULL throughout; its type cannot matter beyond being nullable.
        return T.StructType([
            T.StructField(n, file_type(self.columns.get(n, ColumnType.STRING)) if n != CHUNK_ORDER
                          else T.LongType(), n != TIME) for n in names
        ])

    def build(self, node: PlanNode) -> DataFrame:
        df = self._build(node)
        self._measure(node, df)
        return df

    def _measure(self, node: PlanNode, df: DataFrame, rows_in: DataFrame | None = None) -> None:
        if not self.analyze or (id(node) in self.metrics and rows_in is None):
            return
        started = time.perf_counter()
        metrics = self.metrics.setdefault(id(node), NodeMetrics())
        metrics.rows_out = df.count()
        if rows_in is not None:
            metrics.rows_in = rows_in.count()
        metrics.seconds = time.perf_counter() - started
        if isinstance(node, ParquetExec):
            metrics.files = len(node.files())
        elif isinstance(node, RecordBatchesExec):
            metrics.files = len(node.chunks)

    def _build(self, node: PlanNode) -> DataFrame:
        if isinstance(node, ProjectionExec):
            return self.build(node.child).select(*[F.col(q(c)) for c in node.columns])
        if isinstance(node, FilterExec):
            return self.build(node.child).where(predicate_sql(node.predicate))
        if isinstance(node, (SortExec, SortPreservingMergeExec)):
            # A cost model on Spark: no dedup strategy here depends on input order.
            return self.build(node.child)
        if isinstance(node, DeduplicateExec):
            return self._dedups([node])
        if isinstance(node, UnionExec):
            return self._union(node)
        if isinstance(node, ParquetExec):
            return self.read(node.files(), node.projection, predicate_sql(node.predicate) if node.predicate else None)
        if isinstance(node, RecordBatchesExec):
            return self.read(list(node.chunks), node.projection, None)
        if isinstance(node, EmptyExec):
            return self.spark.createDataFrame([], self.schema_for(node.columns))
        raise CatalogError(f"the Spark runner does not know plan node {node.name}")

    def _union(self, node: UnionExec) -> DataFrame:
        """Plain inputs as they are; inputs that are a dedup (under projections and filters) are evaluated
        together, one shared step per shape of the chain above them."""
        if self.strategy is Strategy.NODE:
            return union_all([self.build(c) for c in node.inputs])
        plain: list[DataFrame] = []
        shapes: dict[tuple[object, ...], list[tuple[list[PlanNode], DeduplicateExec]]] = {}
        for child in node.inputs:
            found = _dedup_chain(child)
            if found is None:
                plain.append(self.build(child))
            else:
                shapes.setdefault(_signature(*found), []).append(found)
        parts = []
        for members in shapes.values():
            df = self._dedups([dedup for _, dedup in members], _chain_needs(members[0][0]))
            for wrapper in reversed(members[0][0]):
                if isinstance(wrapper, ProjectionExec):
                    df = df.select(*[F.col(q(c)) for c in wrapper.columns])
                elif isinstance(wrapper, FilterExec):
                    df = df.where(predicate_sql(wrapper.predicate))
            parts.append(df)
        return union_all([*parts, *plain])

    def _dedups(self, dedups: Sequence[DeduplicateExec], needs: set[str] | None = None) -> DataFrame:
        """Several DeduplicateExec of one schema, evaluated as one step. Their keys never collide across them
        (the planner splits only by partition and by non-overlapping time), so one merge gives the same rows.
        `needs` names the columns the plan reads above them (None: all)."""
        keys: list[str] = []
        for d in dedups:
            keys.extend(s.column for s in d.sort_key if s.column not in keys)
        schema = dedups[0].schema
        if self.strategy is Strategy.ARROW:
            result = self._arrow_dedup(dedups, keys, needs)
            if self.analyze:
                rows_in = union_all([self._dedup_input(d) for d in dedups])
                self._measure(dedups[0], result, rows_in=rows_in)
            return result
        merged_input = union_all([self._dedup_input(d) for d in dedups])
        merge = deduplicate_window if self.strategy is Strategy.WINDOW else deduplicate
        result = merge(merged_input, keys).select(*[q(c) for c in schema])
        if self.analyze:
            self._measure(dedups[0], result, rows_in=merged_input)
        return result

    def _dedup_input(self, dedup: DeduplicateExec) -> DataFrame:
        """A dedup's input rows, only those inside its time slice when it has one (inclusive bounds)."""
        df = self.build(dedup.child)
        if dedup.time_slice is not None:
            start, end = dedup.time_slice
            df = df.where((F.col(TIME) >= F.lit(start)) & (F.col(TIME) <= F.lit(end)))
        return df

    def _arrow_dedup(self, dedups: Sequence[DeduplicateExec], keys: Sequence[str],
                     needs: set[str] | None = None) -> DataFrame:
        """One Spark task per dedup group: read its files with pyarrow, merge vectorized, emit Arrow batches of
        the columns read above (plus those the filters after the merge read)."""
        schema = dedups[0].schema
        specs = []
        after: list[Conjunct] = []
        if needs is None:
            output = list(schema)
        else:
            wanted = set(needs) | columns_of([p for d in dedups for p in group_inputs(d.child)[1]])
            output = [c for c in schema if c in wanted]
        passing: list[DataFrame] = []
        for d in dedups:
            chunks, predicates = group_inputs(d.child)
            for chunk in chunks:
                if chunk.path is None:
                    raise CatalogError(f"chunk {chunk.id} has no file (metadata only); it cannot be read")
                check_file(self.warehouse / chunk.path, chunk.id)
            # The bounds come from the parsed conjuncts (top-level ANDs only), never from the predicate text; a
            # time slice narrows them (the worker reads only rows inside, exactly: inclusive on both ends).
            low, high = time_bounds(predicates)
            if d.time_slice is not None:
                low = d.time_slice[0] if low is None else max(low, d.time_slice[0])
                high = d.time_slice[1] if high is None else min(high, d.time_slice[1])
            spec: dict[str, Any] = {
                "files": [[str(self.warehouse / c.path), c.order, c.kind is ChunkKind.INGESTER] for c in chunks
                          if c.path is not None],
                "bounds": [low, high],
            }
            split = self._pass_through_split(chunks, keys)
            if split is not None:
                base, late_values = split
                spec.update(base=base, late_values=late_values)
                passing.append(self._passing_rows([chunks[i] for i in base], late_values, low, high, output))
            specs.append(json.dumps(spec))
            # Below a dedup only key columns are filtered, and such a filter commutes with the dedup: apply the
            # filters after the merge (the workers only use their time bounds to skip rows early).
            after.extend(p for p in predicates if p not in after)
        out_schema = self.schema_for(output)
        types = {n: self.columns.get(n, ColumnType.STRING) for n in schema if n != CHUNK_ORDER}
        merge = _arrow_merger(specs, list(schema), list(keys), {n: t.value for n, t in types.items()}, output)
        # One partition per group, made in the JVM (spark.range): the specs travel inside the function, so no
        # Python-side RDD and no shuffle stand between the plan and the workers.
        frame = self.spark.range(0, len(specs), 1, numPartitions=max(1, len(specs)))
        result = union_all([frame.mapInArrow(merge, out_schema), *passing])
        for conjunct in after:
            result = result.where(predicate_sql([conjunct]))
        return result

    def _pass_through_split(self, chunks: Sequence[Chunk], keys: Sequence[str]
                            ) -> tuple[list[int], dict[str, list[str | None]]] | None:
        """Whether to split a dedup group for pass-through, and how: (indices of its base files, the late chunks'
        values per tag), or None to merge every row in the workers.

        Base: Parquet files (duplicate-free) whose catalog time ranges pairwise share no nanosecond, the largest
        first (`slicing.disjoint_base`); late: every other chunk. A base row whose value in some tag the late
        chunks never hold shares its key with no row of the group, so it is its own merged row: Spark's scan emits
        it and no Python worker reads it out to the JVM again (`benchmarks/bench_wide_overlap.py`: a backfill of a
        few hosts over a day of many). The values are read from the late files here, once per file. Any set of
        tags may decide (a tag left out restricts nothing, which stays exact); one is used, below."""
        if self.pass_through is PassThrough.OFF or any(
                c.rows is None or c.time_min is None or c.time_max is None or c.path is None for c in chunks):
            return None
        tags = [k for k in keys if k != TIME]
        if not tags or any(self.columns.get(t) is not ColumnType.TAG for t in tags):
            return None
        candidates = [i for i, c in enumerate(chunks) if c.kind is ChunkKind.PARQUET]
        picked = disjoint_base([Span(chunks[i].time_min, chunks[i].time_max, chunks[i].rows)  # type: ignore[arg-type]
                                for i in candidates])
        base = [candidates[j] for j in picked]
        late = [c for i, c in enumerate(chunks) if i not in set(base)]
        if not base or not late:
            return None
        base_rows = sum(chunks[i].rows or 0 for i in base)
        late_rows = sum(c.rows or 0 for c in late)
        if self.pass_through is PassThrough.AUTO and late_rows * PASS_THROUGH_RATIO > base_rows:
            return None  # most rows would be merged anyway: not worth reading the late values first
        values: dict[str, set[str | None]] = {t: set() for t in tags}
        for chunk in late:
            for tag, found in self._late_values(chunk, tags).items():
                if tag in values:
                    if found is None or len(values[tag] | found) > MAX_LATE_VALUES:
                        del values[tag]  # too many to test: this tag cannot decide
                    else:
                        values[tag] |= found
        if not values:
            return None
        # One tag decides: every tag Spark tests is a string column its scan must decode for every row, which
        # costs more than the rows it keeps out of the workers. The one with the most late values is the likely
        # identity of the late series (a host name), where base rows differ from them most.
        tag = max(values, key=lambda t: (len(values[t]), t))
        late_values = {tag: sorted(values[tag], key=lambda x: (x is not None, x or ""))}
        if self.pass_through is PassThrough.AUTO:
            # Worth it only if most base rows pass: measured on the largest base file, by the workers' own test.
            sample = max(base, key=lambda i: chunks[i].rows or 0)
            path = self.warehouse / chunks[sample].path  # type: ignore[operator]
            if share_meeting(path, late_values) * PASS_THROUGH_RATIO > 1:
                return None
        return base, late_values

    def _late_values(self, chunk: Chunk, tags: Sequence[str]) -> dict[str, set[str | None] | None]:
        """Per tag, the values one late chunk holds (None in the set: NULL; a tag the file lacks is all NULL), or
        None for a tag with more than `MAX_LATE_VALUES`. Read once per file per plan."""
        key = (chunk.path, tuple(tags))
        if key not in self._late_cache:
            path = self.warehouse / chunk.path  # type: ignore[operator]
            check_file(path, chunk.id)
            self._late_cache[key] = read_distinct(path, tags, MAX_LATE_VALUES)
        return self._late_cache[key]

    def _passing_rows(self, base: Sequence[Chunk], late_values: Mapping[str, Sequence[str | None]],
                      low: int | None, high: int | None, output: Sequence[str]) -> DataFrame:
        """The base files' rows that meet no late row, inside the group's inclusive time bounds, read by Spark:
        exactly the rows `arrow_merge` leaves out (`dedup.may_meet` is the same test, row by row)."""
        needed = list(dict.fromkeys([*output, *late_values, TIME]))
        df = self.read(base, needed, None)
        if low is not None:
            df = df.where(F.col(TIME) >= F.lit(low))
        if high is not None:
            df = df.where(F.col(TIME) <= F.lit(high))
        return df.where(~may_meet_column(late_values)).select(*[q(c) for c in output])

    def read(self, chunks: Sequence[Chunk], projection: Sequence[str], predicate: str | None) -> DataFrame:
        """Read chunk files with the table's types; columns a file lacks come out NULL."""
        paths = []
        for chunk in chunks:
            if chunk.path is None:
                raise CatalogError(f"chunk {chunk.id} has no file (metadata only); it cannot be read")
            path = self.warehouse / chunk.path
            check_file(path, chunk.id)
            paths.append(str(path))
        stored = [c for c in projection if c != CHUNK_ORDER]
        needed = list(stored)
        if predicate:
            from iox_planner.planner.predicate import parse_predicate, columns_of

            needed += sorted(c for c in columns_of(parse_predicate(predicate)) if c not in needed)
        ingester = chunks[0].kind is ChunkKind.INGESTER
        schema = self.schema_for(needed)
        if ingester and CHUNK_ORDER in projection:
            schema = schema.add(T.StructField(WRITE_SEQ, T.LongType(), False))
        df = self.spark.read.schema(schema).parquet(*paths)
        if predicate:
            df = df.where(predicate)
        if CHUNK_ORDER in projection:
            df = df.withColumn(CHUNK_ORDER, chunk_order_column(chunks, ingester))
        return df.select(*[q(c) for c in projection])


def may_meet_column(late_values: Mapping[str, Sequence[str | None]]) -> Any:
    """`dedup.may_meet` as a Spark expression, never NULL: in every listed column the row's value is listed
    (None: NULL, equal only to NULL; `isin` compares strings byte for byte, as Arrow does)."""
    meets = F.lit(True)
    for name, values in late_values.items():
        listed = [v for v in values if v is not None]
        column = F.col(q(name))
        term = F.coalesce(column.isin(listed), F.lit(False)) if listed else F.lit(False)
        if len(listed) < len(values):
            term = column.isNull() | term
        meets = meets & term
    return meets


def _arrow_merger(specs: list[str], schema: list[str], keys: list[str], types: dict[str, str],
                  output: list[str]) -> Any:
    """The function Spark runs in its Python workers for each batch of group ids (it must be picklable: it
    closes over plain lists and dicts only)."""

    def merge(batches: Iterator[Any]) -> Iterator[Any]:
        from spark_jobs.arrow_merge import merge_groups

        yield from merge_groups(batches, specs, schema, keys, types, output)

    return merge


def _chain_needs(chain: Sequence[PlanNode]) -> set[str] | None:
    """The columns a chain of projections and filters (top first) reads from the dedup below it."""
    if not chain:
        return None
    needs = set(chain[0].schema)
    for node in chain:
        if isinstance(node, FilterExec):
            from iox_planner.planner.predicate import columns_of

            needs |= columns_of(node.predicate)
    return needs


# --- whole plans -----------------------------------------------------------------------------------------------------


def _setting(kind: type[Any], value: object, name: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        raise BadInputError(f"{name} is {str(value)[:40]!r}; it must be one of {choices}") from None


def execute(spark: SparkSession, plan: QueryPlan, warehouse: Path, *, strategy: Strategy | str | None = None,
            analyze: bool = False) -> Execution:
    """Register one view per scan tree and run the query's SQL over them."""
    strategy = _setting(Strategy, strategy or os.environ.get("IOX_DEDUP_STRATEGY") or DEFAULT_STRATEGY,
                        "IOX_DEDUP_STRATEGY")
    pass_through = _setting(PassThrough, os.environ.get("IOX_DEDUP_PASS_THROUGH") or PassThrough.AUTO,
                            "IOX_DEDUP_PASS_THROUGH")
    if analyze:
        # Per-node metrics need each node evaluated on its own; row counts do not depend on the strategy.
        strategy = Strategy.NODE
    scans = []
    metrics: dict[int, NodeMetrics] = {}
    for scan, tree in zip(plan.scans, plan.children):
        columns = {name: ctype for chunk in tree.scanned_chunks() for name, ctype in chunk.columns.items()}
        columns.update(scan.columns)
        builder = ScanBuilder(spark, warehouse, columns, strategy=strategy, analyze=analyze,
                              pass_through=pass_through)
        df = builder.build(tree)
        metrics.update(builder.metrics)
        scans.append(df)
        to_view(df).createOrReplaceTempView(scan.view)
    args = {k: v for k, v in plan.params.items()}
    result = spark.sql(plan.spark_sql, args=args) if args else spark.sql(plan.spark_sql)
    return Execution(result, scans, metrics)


