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
import logging
import os
import re
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

# PySpark warns about pandas 3 on import of its testing helpers; iox-batch moves data as Arrow, not pandas.
warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")

from pyspark.sql import Column, DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F
from pyspark.sql import types as T

from iox_planner.errors import CatalogError
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

TIME_NS = "__time_ns"
NS_PREFIX = "__iox_ns_"
_ORDER_SHIFT = 32  # __chunk_order = chunk order << 32 | write position: one long keeps the aggregation hashed

SPARK_TYPES: Mapping[ColumnType, T.DataType] = {
    ColumnType.TAG: T.StringType(),
    ColumnType.FLOAT: T.DoubleType(),
    ColumnType.INTEGER: T.LongType(),
    # Spark reads Parquet UINT64 as DECIMAL(20, 0): the whole 0..2^64-1 range survives.
    ColumnType.UNSIGNED: T.DecimalType(20, 0),
    ColumnType.BOOLEAN: T.BooleanType(),
    ColumnType.STRING: T.StringType(),
    ColumnType.TIME: T.LongType(),
}

DEFAULT_CONF: Mapping[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.ansi.enabled": "true",
    "spark.sql.caseSensitive": "true",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.parquet.filterPushdown": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.driver.memory": "2g",
    # Parquet output: timestamps as UTC microsecond timestamps (Spark's default is the legacy INT96).
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # User SQL is data: Spark must not replace `${env:HOME}`, `${system:...}`, `${spark:...}` or `${hiveconf:...}`
    # in it (even inside string literals) with the service's environment, properties or settings.
    "spark.sql.variable.substitute": "false",
}


def parse_spark_conf(text: str | None) -> dict[str, str]:
    """IOX_SPARK_CONF: `key=value` pairs separated by commas, semicolons or newlines."""
    out: dict[str, str] = {}
    for item in (text or "").replace(";", "\n").replace(",", "\n").splitlines():
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            from iox_planner.errors import BadInputError

            raise BadInputError(f"IOX_SPARK_CONF entry {item!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


LOG4J = Path(__file__).resolve().with_name("log4j2.properties")


_FIXED_CONF: Mapping[str, str] = {"spark.sql.variable.substitute": "false"}


def session_conf(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    conf = dict(DEFAULT_CONF)
    conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{LOG4J}"
    conf["spark.executor.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{LOG4J}"
    conf.update(parse_spark_conf(os.environ.get("IOX_SPARK_CONF")))
    conf.update(extra or {})
    # Settings no configuration may change: with substitution on, a query's '${env:...}' reads the service's
    # environment (the security model says a query reads the catalog's data and nothing else).
    conf.update(_FIXED_CONF)
    return conf


def build_session(master: str | None = None, app: str = "iox-batch",
                  conf: Mapping[str, str] | None = None) -> SparkSession:
    master = master or os.environ.get("IOX_SPARK_MASTER") or "local[*]"
    if master.startswith("local"):
        # Only a local driver may bind to loopback: a cluster's executors must reach a client-mode driver.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must run this interpreter: it has pyarrow and the iox-batch packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app).master(master)
    for key, value in session_conf(conf).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # PySpark logs a failed query's context as JSON on standard error; iox-batch reports the error itself.
    logging.getLogger("SQLQueryContextLogger").disabled = True
    return spark


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


def _dedup_chain(node: PlanNode) -> tuple[list[PlanNode], DeduplicateExec] | None:
    """A DeduplicateExec under a chain of projections and filters: (the chain, top first; the dedup)."""
    chain: list[PlanNode] = []
    while isinstance(node, (ProjectionExec, FilterExec)):
        chain.append(node)
        node = node.child
    if isinstance(node, DeduplicateExec):
        return chain, node
    return None


def _signature(chain: Sequence[PlanNode]) -> tuple[object, ...]:
    return tuple((n.columns if isinstance(n, ProjectionExec) else n.predicate) for n in chain)  # type: ignore[attr-defined]


class ScanBuilder:
    """Turns one scan tree into a DataFrame of its output columns (time as int64 ns)."""

    def __init__(self, spark: SparkSession, warehouse: Path, columns: Mapping[str, ColumnType],
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
            T.StructField(n, SPARK_TYPES[self.columns.get(n, ColumnType.STRING)] if n != CHUNK_ORDER
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
            return self.build(node.child).select(*[F.col(_q(c)) for c in node.columns])
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
            return _union_all([self.build(c) for c in node.inputs])
        plain: list[DataFrame] = []
        shapes: dict[tuple[object, ...], list[tuple[list[PlanNode], DeduplicateExec]]] = {}
        for child in node.inputs:
            found = _dedup_chain(child)
            if found is None:
                plain.append(self.build(child))
            else:
                shapes.setdefault(_signature(found[0]), []).append(found)
        parts = []
        for members in shapes.values():
            df = self._dedups([dedup for _, dedup in members], _chain_needs(members[0][0]))
            for wrapper in reversed(members[0][0]):
                if isinstance(wrapper, ProjectionExec):
                    df = df.select(*[F.col(_q(c)) for c in wrapper.columns])
                elif isinstance(wrapper, FilterExec):
                    df = df.where(predicate_sql(wrapper.predicate))
            parts.append(df)
        return _union_all([*parts, *plain])

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
                rows_in = _union_all([self.build(d.child) for d in dedups])
                self._measure(dedups[0], result, rows_in=rows_in)
            return result
        merged_input = _union_all([self.build(d.child) for d in dedups])
        merge = deduplicate_window if self.strategy is Strategy.WINDOW else deduplicate
        result = merge(merged_input, keys).select(*[_q(c) for c in schema])
        if self.analyze:
            self._measure(dedups[0], result, rows_in=merged_input)
        return result

    def _arrow_dedup(self, dedups: Sequence[DeduplicateExec], keys: Sequence[str],
                     needs: set[str] | None = None) -> DataFrame:
        """One Spark task per dedup group: read its files with pyarrow, merge vectorized, emit Arrow batches of
        the columns read above (plus those the filters after the merge read)."""
        schema = dedups[0].schema
        specs = []
        after: list[Conjunct] = []
        for d in dedups:
            chunks, predicates = _group_inputs(d.child)
            for chunk in chunks:
                if chunk.path is None:
                    raise CatalogError(f"chunk {chunk.id} has no file (metadata only); it cannot be read")
                check_file(self.warehouse / chunk.path, chunk.id)
            # The bounds come from the parsed conjuncts (top-level ANDs only), never from the predicate text.
            specs.append(json.dumps({
                "files": [[str(self.warehouse / c.path), c.order, c.kind is ChunkKind.INGESTER] for c in chunks
                          if c.path is not None],
                "bounds": list(time_bounds(predicates)),
            }))
            # Below a dedup only key columns are filtered, and such a filter commutes with the dedup: apply the
            # filters after the merge (the workers only use their time bounds to skip rows early).
            after.extend(p for p in predicates if p not in after)
        if needs is None:
            output = list(schema)
        else:
            wanted = set(needs) | columns_of(after)
            output = [c for c in schema if c in wanted]
        out_schema = self.schema_for(output)
        types = {n: self.columns.get(n, ColumnType.STRING) for n in schema if n != CHUNK_ORDER}
        merge = _arrow_merger(specs, list(schema), list(keys), {n: t.value for n, t in types.items()}, output)
        # One partition per group, made in the JVM (spark.range): the specs travel inside the function, so no
        # Python-side RDD and no shuffle stand between the plan and the workers.
        frame = self.spark.range(0, len(specs), 1, numPartitions=max(1, len(specs)))
        result = frame.mapInArrow(merge, out_schema)
        for conjunct in after:
            result = result.where(predicate_sql([conjunct]))
        return result

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
            df = df.withColumn(CHUNK_ORDER, _chunk_order(chunks, ingester))
        return df.select(*[_q(c) for c in projection])


def check_file(path: Path, chunk_id: str) -> None:
    """Fail before Spark does, with the file and its chunk named (Spark's own error names neither clearly)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CatalogError(f"chunk {chunk_id}: its file {path} is missing from the warehouse") from None
    if size < 12:
        raise CatalogError(f"chunk {chunk_id}: its file {path} is not a Parquet file ({size} bytes)")
    with open(path, "rb") as fh:
        head = fh.read(4)
        fh.seek(-4, os.SEEK_END)
        tail = fh.read(4)
    if head != b"PAR1" or tail != b"PAR1":
        raise CatalogError(f"chunk {chunk_id}: its file {path} is corrupt (no Parquet magic bytes)")


def _group_inputs(node: PlanNode) -> tuple[list[Chunk], list[Conjunct]]:
    """The chunks under a dedup and the (key-only) conjuncts applied to them on the way, as values."""
    chunks: list[Chunk] = []
    conjuncts: list[Conjunct] = []
    for below in node.walk():
        if isinstance(below, FilterExec):
            conjuncts.extend(below.predicate)
        elif isinstance(below, ParquetExec):
            chunks.extend(below.files())
            conjuncts.extend(below.predicate or ())
        elif isinstance(below, RecordBatchesExec):
            chunks.extend(below.chunks)
        elif isinstance(below, (DeduplicateExec, EmptyExec)):
            raise CatalogError(f"the Spark runner cannot merge a {below.name} below a DeduplicateExec")
    return chunks, conjuncts


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


def _chunk_order(chunks: Sequence[Chunk], ingester: bool) -> Column:
    """(chunk order << 32) | write position, chosen per file by its path."""
    orders = {chunk.order for chunk in chunks}
    if len(orders) == 1:
        base: Column = F.lit(next(iter(orders)) << _ORDER_SHIFT)
    else:
        mapping: list[Column] = []
        for chunk in chunks:
            mapping += [F.lit(chunk.path), F.lit(chunk.order << _ORDER_SHIFT)]
        # _metadata.file_path is a URI; the chunk's path is the warehouse-relative tail of it.
        rel = F.regexp_extract(F.col("_metadata.file_path"), r"([^/]+/[^/]+/[^/]+/[^/]+)$", 1)
        base = F.create_map(*mapping)[rel]
    if ingester:
        return (base + F.col(WRITE_SEQ)).cast("long")
    return base.cast("long")


def deduplicate(df: DataFrame, keys: Sequence[str]) -> DataFrame:
    """IOx dedup: one row per key (NULL equals NULL in grouping); every other column its last non-null value by
    `__chunk_order`. `max_by` over a packed long ordering that is NULL where the value is NULL keeps this a hash
    aggregation and skips NULLs."""
    values = [c for c in df.columns if c not in keys and c != CHUNK_ORDER]
    order = F.col(CHUNK_ORDER)
    aggs = [F.max_by(F.col(_q(v)), F.when(F.col(_q(v)).isNotNull(), order)).alias(v) for v in values]
    aggs.append(F.max(order).alias(CHUNK_ORDER))
    grouped = df.groupBy(*[F.col(_q(k)) for k in keys]).agg(*aggs)
    return grouped.select(*[_q(c) for c in df.columns])


def deduplicate_window(df: DataFrame, keys: Sequence[str]) -> DataFrame:
    """The same semantics with window functions: per key, ordered by write order, each value column's last
    non-null value over the whole key, one row kept."""
    from pyspark.sql import Window

    values = [c for c in df.columns if c not in keys and c != CHUNK_ORDER]
    by_key = Window.partitionBy(*[F.col(_q(k)) for k in keys])
    whole = by_key.orderBy(F.col(CHUNK_ORDER)).rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    newest_first = by_key.orderBy(F.col(CHUNK_ORDER).desc())
    picked = df.select(
        *[F.col(_q(k)) for k in keys],
        *[F.last(F.col(_q(v)), ignorenulls=True).over(whole).alias(v) for v in values],
        F.col(CHUNK_ORDER),
        F.row_number().over(newest_first).alias("__rn"),
    )
    return picked.where("__rn = 1").select(*[_q(c) for c in df.columns])


def _union_all(parts: Sequence[DataFrame]) -> DataFrame:
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    return result


def _q(name: str) -> str:
    return f"`{name.replace('`', '``')}`"


# --- whole plans -----------------------------------------------------------------------------------------------------


def to_view(df: DataFrame) -> DataFrame:
    """The view a query sees: `time` as a UTC TIMESTAMP (microseconds, floored), its nanoseconds in `__time_ns`."""
    if TIME not in df.columns:
        return df
    cols = [F.col(_q(c)) for c in df.columns if c not in (TIME, CHUNK_ORDER)]
    # Integer floor division: going through a double would lose the low bits of a nanosecond timestamp.
    micros = F.expr(f"({TIME} - pmod({TIME}, 1000)) div 1000")
    return df.select(*cols, F.timestamp_micros(micros).alias(TIME), F.col(TIME).alias(TIME_NS))


def execute(spark: SparkSession, plan: QueryPlan, warehouse: Path, *, strategy: Strategy | str | None = None,
            analyze: bool = False) -> Execution:
    """Register one view per scan tree and run the query's SQL over them."""
    strategy = Strategy(strategy or os.environ.get("IOX_DEDUP_STRATEGY") or DEFAULT_STRATEGY)
    if analyze:
        # Per-node metrics need each node evaluated on its own; row counts do not depend on the strategy.
        strategy = Strategy.NODE
    scans = []
    metrics: dict[int, NodeMetrics] = {}
    for scan, tree in zip(plan.scans, plan.children):
        columns = {name: ctype for chunk in tree.scanned_chunks() for name, ctype in chunk.columns.items()}
        columns.update(scan.columns)
        builder = ScanBuilder(spark, warehouse, columns, strategy=strategy, analyze=analyze)
        df = builder.build(tree)
        metrics.update(builder.metrics)
        scans.append(df)
        to_view(df).createOrReplaceTempView(scan.view)
    args = {k: v for k, v in plan.params.items()}
    result = spark.sql(plan.spark_sql, args=args) if args else spark.sql(plan.spark_sql)
    return Execution(result, scans, metrics)


@contextmanager
def spark_errors(plan: QueryPlan | None = None) -> Iterator[None]:
    """Spark's exceptions as iox-batch errors: one paragraph naming what went wrong, in the user's terms.

    Spark's message is kept to its error class and first sentence (what follows is its plan, the query text with a
    caret, and suggestions, all in terms of iox-batch's internals); view names become the user's table names and
    internal columns (`__time_ns`, `__iox_ns_x`, ...) the columns they stand for."""
    from pyspark.errors import PySparkException

    from iox_planner.errors import BadQueryError, IoxError

    try:
        yield
    except IoxError:
        raise
    except PySparkException as err:
        condition = err.getCondition() if hasattr(err, "getCondition") else None
        text = sanitize_spark_message(str(err), plan)
        if condition and ("CANNOT_READ" in condition or "FILE" in condition or "PARQUET" in condition):
            raise CatalogError(f"reading a chunk file failed: {text}") from err
        raise BadQueryError(f"the query failed on Spark: {text}") from err
    except Exception as err:
        # py4j ships no type information; its error class is known by name.
        if type(err).__name__ != "Py4JJavaError" or os.environ.get("IOX_DEBUG"):
            raise
        # A JVM exception PySpark does not convert: its text is "An error occurred while calling oN.x.\n:
        # <java class>: <message>" followed by the Java stack. Keep the exception's own first line.
        lines = [line for line in str(err).splitlines() if line.strip()]
        java = lines[1].lstrip(": ").strip() if len(lines) > 1 else (lines[0] if lines else "")
        raise IoxError(f"the query failed on Spark: {sanitize_spark_message(java, plan)}") from err


_ERROR_CLASS = re.compile(r"^\s*(\[[A-Z0-9_.]+\])\s*")
_FIRST_SENTENCE = re.compile(r"^(.*?[.!?])(?=\s|$)")
_SCAN_VIEW = re.compile(r"`?__iox_scan_(\d+)`?")


def sanitize_spark_message(message: str, plan: QueryPlan | None = None) -> str:
    """Spark's error class and first sentence, on one line, with iox-batch's internal names mapped back."""
    first_line = message.strip().split("\n", 1)[0]
    match = _ERROR_CLASS.match(first_line)
    error_class = match.group(1) + " " if match else ""
    rest = first_line[match.end():] if match else first_line
    rest = re.split(r"\s*SQLSTATE:|;\s*line \d+ pos \d+|\s*== SQL", rest, maxsplit=1)[0]
    sentence = _FIRST_SENTENCE.match(rest)
    text = (sentence.group(1) if sentence else rest).strip()
    views = {scan.view: scan.table for scan in plan.scans} if plan is not None else {}

    def view_name(found: re.Match[str]) -> str:
        view = f"__iox_scan_{found.group(1)}"
        return f"`{views[view]}`" if view in views else "a table of the query"

    text = _SCAN_VIEW.sub(view_name, text)
    text = re.sub(r"__iox_ns_(\w+)", r"\1", text)
    text = re.sub(r"__iox_tns_\d+|__time_ns", "time", text)
    text = re.sub(r"__chunk_order|__seq|MapInArrow\w*|mapInArrow", "(internal)", text)
    if len(text) > 600:
        text = text[:600] + "..."
    return error_class + (text or "Spark gave no message")


# --- results -----------------------------------------------------------------------------------------------------


def result_to_arrow(result: DataFrame) -> Any:
    """The whole result on the driver as an Arrow table (for text formats and the terminal)."""
    return result.toArrow()


def materialize(result: DataFrame, fmt: str, output: Path | None, stdout: Any) -> int:
    """Write the result in `fmt` to `output` (atomically) or to `stdout`. Returns rows written."""
    from iox_planner.output.formats import OutputFormat, finish_columns, render_table, write_text_output

    kind = OutputFormat(fmt)
    if kind is OutputFormat.PARQUET:
        if output is None:
            from iox_planner.errors import BadInputError

            raise BadInputError("parquet output is a folder: give --output PATH")
        from iox_planner.output.formats import staged_folder

        # Only the planner's nanosecond helpers go: a user's own `__v` is a result column like any other.
        cols = [c for c in result.columns if not c.startswith(NS_PREFIX)]
        final = result.select(*[_q(c) for c in cols])
        with staged_folder(output) as tmp:
            final.write.parquet(str(tmp))
        return int(result.sparkSession.read.parquet(str(output)).count())
    table, ns_cols = finish_columns(result_to_arrow(result))
    if kind is OutputFormat.TABLE:
        if output is not None:
            from iox_planner.errors import BadInputError

            raise BadInputError("format table prints to the terminal; use csv, jsonl or parquet with --output")
        from rich.console import Console

        Console(file=stdout, highlight=False, width=None if stdout.isatty() else 1000).print(
            render_table(table, ns_cols))
        return int(table.num_rows)
    write_text_output(table, ns_cols, kind, output, stdout)
    return int(table.num_rows)
