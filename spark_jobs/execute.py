"""Execute an iox-batch plan on Spark.

Scan trees become DataFrames: ParquetExec and RecordBatchesExec read exactly their files, of a local warehouse
through Spark's Parquet reader (projection and predicate pushed into it), of an object store through pyarrow's
filesystem in Python workers (`store_read.py`: projection, row groups pruned by the time bounds); FilterExec and
ProjectionExec map to `where`/`select`, sort nodes are a cost model Spark plans its own way, and every
DeduplicateExec of a scan tree is evaluated by one aggregation over the union of their inputs: the planner only
splits dedups where keys cannot collide, so one `groupBy` over all of them gives the same rows with one shuffle, and
chunks outside any dedup never shuffle.

Each scan tree is registered as the view its `ScanInfo` names, with `time` converted at the edge from int64
nanoseconds to a Spark TIMESTAMP (the nanoseconds stay beside it, `model.time_ns_column`), and the query's SQL runs
over the views with its bound parameters, once the last gate (`gate.py`) has read it with Spark's own parser.
"""

from __future__ import annotations

import json
import time
import warnings
import weakref
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

# PySpark warns about pandas 3 on import of its testing helpers; iox-batch moves data as Arrow, not pandas.
warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F
from pyspark.sql import types as T

from iox_planner.config import DEDUP_STRATEGY
from iox_planner.errors import CatalogError
from iox_planner.model import CHUNK_ORDER, TIME, WRITE_ORDER, WRITE_SEQ, Chunk, ChunkKind, ColumnType, time_ns_column
from iox_planner.objectstore import Root
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
from iox_planner.planner.timebounds import Bounds, time_bounds
from spark_jobs.extract import checked_path, group_inputs
from spark_jobs.gate import check_query_text
from spark_jobs.store_read import file_refs, spread
from spark_jobs.transform import (
    chunk_order_column, deduplicate, deduplicate_window, file_type, q, to_view, union_all, write_order_column,
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


DEFAULT_STRATEGY = Strategy(DEDUP_STRATEGY.default)


def dedup_strategy(chosen: Strategy | str | None = None) -> Strategy:
    """`chosen` (a job's `--strategy`), else IOX_DEDUP_STRATEGY (whose declaration lists these strategies), else
    the default; anything else is a one-paragraph error."""
    if chosen is None:
        return Strategy(DEDUP_STRATEGY.read())
    return Strategy(DEDUP_STRATEGY.parse(str(chosen.value if isinstance(chosen, Strategy) else chosen),
                                         "--strategy"))


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

    def __init__(self, spark: SparkSession, warehouse: Root, columns: Mapping[str, ColumnType],
                 strategy: Strategy | str = DEFAULT_STRATEGY, analyze: bool = False) -> None:
        self.spark = spark
        self.warehouse = warehouse
        self.columns = dict(columns)
        self.strategy = Strategy(strategy)
        self.analyze = analyze
        self.metrics: dict[int, NodeMetrics] = {}

    def schema_for(self, names: Iterable[str]) -> T.StructType:
        # A column no scanned chunk has is NULL throughout; its type cannot matter beyond being nullable.
        return T.StructType([
            T.StructField(n, file_type(self.columns.get(n, ColumnType.STRING)) if n not in (CHUNK_ORDER, WRITE_ORDER)
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
            if not node.predicate:
                return self.read(node.files(), node.projection, None)
            return self.read(node.files(), node.projection, predicate_sql(node.predicate), time_bounds(node.predicate))
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
        for d in dedups:
            chunks, predicates = group_inputs(d.child)
            for chunk in chunks:
                checked_path(self.warehouse, chunk)
            # The bounds come from the parsed conjuncts (top-level ANDs only), never from the predicate text; a
            # time slice narrows them (the worker reads only rows inside, exactly: inclusive on both ends).
            low, high = time_bounds(predicates)
            if d.time_slice is not None:
                low = d.time_slice[0] if low is None else max(low, d.time_slice[0])
                high = d.time_slice[1] if high is None else min(high, d.time_slice[1])
            specs.append(json.dumps({"files": [ref.to_json() for ref in file_refs(chunks)], "bounds": [low, high]}))
            # Below a dedup only key columns are filtered, and such a filter commutes with the dedup: apply the
            # filters after the merge (the workers only use their time bounds to skip rows early).
            after.extend(p for p in predicates if p not in after)
        if needs is None:
            output = list(schema)
        else:
            wanted = set(needs) | columns_of(after)
            output = [c for c in schema if c in wanted]
        out_schema = self.schema_for(output)
        types = {n: ColumnType.INTEGER if n == WRITE_ORDER else self.columns.get(n, ColumnType.STRING)
                 for n in schema if n != CHUNK_ORDER}
        merge = _arrow_merger(self.warehouse.uri, specs, list(schema), list(keys),
                              {n: t.value for n, t in types.items()}, output)
        # One partition per group, made in the JVM (spark.range): the specs travel inside the function, so no
        # Python-side RDD and no shuffle stand between the plan and the workers.
        frame = self.spark.range(0, len(specs), 1, numPartitions=max(1, len(specs)))
        result = frame.mapInArrow(merge, out_schema)
        for conjunct in after:
            result = result.where(predicate_sql([conjunct]))
        return result

    def read(self, chunks: Sequence[Chunk], projection: Sequence[str], predicate: str | None,
             bounds: Bounds = (None, None)) -> DataFrame:
        """Read chunk files with the table's types; columns a file lacks come out NULL. A local warehouse is read
        by Spark's own Parquet reader, a store's through its filesystem in Python workers (`store_read`); `bounds`
        (the predicate's time bounds) prune row groups there as Spark's reader prunes them by the predicate."""
        if not self.warehouse.is_local:
            return self._read_store(chunks, projection, predicate, bounds)
        paths = [checked_path(self.warehouse, chunk) for chunk in chunks]
        virtual = (CHUNK_ORDER, WRITE_ORDER)
        stored = [c for c in projection if c not in virtual]
        needed = list(stored)
        filtered: frozenset[str] = frozenset()
        if predicate:
            from iox_planner.planner.predicate import parse_predicate, columns_of

            filtered = columns_of(parse_predicate(predicate))
            needed += sorted(c for c in filtered if c not in needed and c not in virtual)
        ingester = chunks[0].kind is ChunkKind.INGESTER
        schema = self.schema_for(needed)
        if ingester and CHUNK_ORDER in projection:
            schema = schema.add(T.StructField(WRITE_SEQ, T.LongType(), False))
        write_order = WRITE_ORDER in projection or WRITE_ORDER in filtered
        if write_order and not ingester:
            schema = schema.add(T.StructField(WRITE_ORDER, T.LongType(), True))  # NULL in files without it
        df = self.spark.read.schema(schema).parquet(*paths)
        if write_order:
            # Before the predicate, which may read it (a changes read's filter pushed into a scan).
            df = df.withColumn(WRITE_ORDER, write_order_column(chunks, ingester))
        if predicate:
            df = df.where(predicate)
        if CHUNK_ORDER in projection:
            df = df.withColumn(CHUNK_ORDER, chunk_order_column(chunks, ingester))
        return df.select(*[q(c) for c in projection])

    def _read_store(self, chunks: Sequence[Chunk], projection: Sequence[str], predicate: str | None,
                    bounds: Bounds) -> DataFrame:
        """`read` on an object store: the files spread over a few tasks by size, each task's Python worker reading
        its files (only the columns needed, only the row groups the time bounds leave) with the virtual columns
        computed per file from the chunk (no `_metadata.file_path` to map back from)."""
        virtual = (CHUNK_ORDER, WRITE_ORDER)
        wanted = list(projection)
        if predicate:
            from iox_planner.planner.predicate import parse_predicate

            wanted += sorted(columns_of(parse_predicate(predicate)))
        columns = list(dict.fromkeys(c for c in wanted if c not in virtual)) + [c for c in virtual if c in wanted]
        tasks = spread(file_refs(chunks), 2 * self.parallelism())
        types = {n: self.columns.get(n, ColumnType.STRING).value for n in columns if n not in virtual}
        reader = _store_reader(self.warehouse.uri, [[ref.to_json() for ref in task] for task in tasks], columns,
                               types, list(bounds))
        df = self.spark.range(0, len(tasks), 1, max(1, len(tasks))).mapInArrow(reader, self.schema_for(columns))
        if predicate:
            df = df.where(predicate)
        return df.select(*[q(c) for c in projection])

    def parallelism(self) -> int:
        """How many tasks the session runs at once, asked once per session (over Connect the asking is a job)."""
        known = _PARALLELISM.get(self.spark)
        if known is None:
            from spark_jobs.errors import default_parallelism

            known = _PARALLELISM[self.spark] = default_parallelism(self.spark)
        return known


_PARALLELISM: "weakref.WeakKeyDictionary[SparkSession, int]" = weakref.WeakKeyDictionary()


def _store_reader(root_uri: str, tasks: list[list[list[Any]]], columns: list[str], types: dict[str, str],
                  bounds: list[int | None]) -> Any:
    """The function a store scan's Python workers run for each batch of task ids (picklable: plain values only; the
    warehouse as its URI, never a credential)."""

    def read(batches: Iterator[Any]) -> Iterator[Any]:
        from spark_jobs.store_read import read_files

        yield from read_files(batches, root_uri, tasks, columns, types, bounds)

    return read


def _arrow_merger(root_uri: str, specs: list[str], schema: list[str], keys: list[str], types: dict[str, str],
                  output: list[str]) -> Any:
    """The function Spark runs in its Python workers for each batch of group ids (it must be picklable: it
    closes over plain lists and dicts only)."""

    def merge(batches: Iterator[Any]) -> Iterator[Any]:
        from spark_jobs.arrow_merge import merge_groups

        yield from merge_groups(batches, root_uri, specs, schema, keys, types, output)

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


def execute(spark: SparkSession, plan: QueryPlan, warehouse: Root | Path | None = None, *,
            strategy: Strategy | str | None = None, analyze: bool = False) -> Execution:
    """Register one view per scan tree and run the query's SQL over them, reading the chunk files under
    `warehouse` (a root, a local folder, or None: IOX_WAREHOUSE). The last gate runs first: a text it refuses
    leaves the session as it was (no view registered, no file read)."""
    from iox_planner.storage import warehouse_of

    root = warehouse_of(warehouse)
    check_plan_text(spark, plan)
    strategy = dedup_strategy(strategy)
    if analyze:
        # Per-node metrics need each node evaluated on its own; row counts do not depend on the strategy.
        strategy = Strategy.NODE
    scans = []
    metrics: dict[int, NodeMetrics] = {}
    for scan, tree in zip(plan.scans, plan.children):
        columns = {name: ctype for chunk in tree.scanned_chunks() for name, ctype in chunk.columns.items()}
        columns.update(scan.columns)
        builder = ScanBuilder(spark, root, columns, strategy=strategy, analyze=analyze)
        df = builder.build(tree)
        metrics.update(builder.metrics)
        scans.append(df)
        register_view(df, scan.view)
    return Execution(run_query_sql(spark, plan), scans, metrics)


def register_view(df: DataFrame, view: str) -> None:
    """A scan's rows as the view the query's SQL reads (`time` as a TIMESTAMP, its nanoseconds beside it)."""
    to_view(df, time_ns_column(view)).createOrReplaceTempView(view)


def check_plan_text(spark: SparkSession, plan: QueryPlan) -> None:
    """The last gate on every text of the plan that Spark will run (the query, and its naming twin)."""
    views = [scan.view for scan in plan.scans]
    columns = {name for scan in plan.scans for name, _ in scan.columns}
    for text in (plan.spark_sql, plan.naming_sql):
        if text is not None:
            check_query_text(spark, text, views, columns)


def run_query_sql(spark: SparkSession, plan: QueryPlan) -> DataFrame:
    """The query's SQL over the registered views, once the last gate (Spark's own parser on the exact text) let
    it through. With `naming_sql`, the result's columns take the names Spark gives the query as the user wrote it
    (a pinned clock's constant would otherwise name its column)."""
    args = dict(plan.params)
    check_plan_text(spark, plan)
    result = spark.sql(plan.spark_sql, args=args) if args else spark.sql(plan.spark_sql)
    if plan.naming_sql is not None:
        named = spark.sql(plan.naming_sql, args=args) if args else spark.sql(plan.naming_sql)
        result = result.toDF(*named.columns)
    return result
