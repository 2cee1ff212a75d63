"""The executor's pure transforms: DataFrame in, DataFrame out, no files read or written, so each is tested on
small in-memory DataFrames (tests/spark_jobs/test_transforms.py). Also the one map from catalog column types to
Spark types."""

from __future__ import annotations

from typing import Callable, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from iox_planner.model import CHUNK_ORDER, SPARK_SQL_TYPES, TIME, WRITE_ORDER, WRITE_SEQ, Chunk, ColumnType, pack_order

def file_type(ctype: ColumnType) -> T.DataType:
    """The Spark type a chunk file's column of catalog type `ctype` is read as: the view's type from
    model.SPARK_SQL_TYPES, except `time`, which files hold as int64 nanoseconds (`to_view` converts it)."""
    return T.LongType() if ctype is ColumnType.TIME else T.DataType.fromDDL(SPARK_SQL_TYPES[ctype])


def _per_file(chunks: Sequence[Chunk], value: Callable[[Chunk], int]) -> Column:
    """`value` of the chunk each row was read from, chosen per file by its path."""
    values = {value(chunk) for chunk in chunks}
    if len(values) == 1:
        return F.lit(next(iter(values)))
    mapping: list[Column] = []
    for chunk in chunks:
        mapping += [F.lit(chunk.path), F.lit(value(chunk))]
    # _metadata.file_path is a URI; the chunk's path is the warehouse-relative tail of it.
    rel = F.regexp_extract(F.col("_metadata.file_path"), r"([^/]+/[^/]+/[^/]+/[^/]+)$", 1)
    return F.create_map(*mapping)[rel]


def chunk_order_column(chunks: Sequence[Chunk], ingester: bool) -> Column:
    """(chunk order << 32) | write position, chosen per file by its path."""
    base = _per_file(chunks, lambda chunk: pack_order(chunk.order))
    if ingester:
        return (base + F.col(WRITE_SEQ)).cast("long")
    return base.cast("long")


def write_order_column(chunks: Sequence[Chunk], ingester: bool) -> Column:
    """Each row's `__write_order` (model.WRITE_ORDER): a persisted or compacted file's own column, else (an
    ingester chunk, a file of one write, a file persisted before the column existed) the chunk's order."""
    base = _per_file(chunks, lambda chunk: chunk.order).cast("long")
    if ingester:
        return base
    return F.coalesce(F.col(WRITE_ORDER), base)


def deduplicate(df: DataFrame, keys: Sequence[str]) -> DataFrame:
    """IOx dedup: one row per key (NULL equals NULL in grouping); every other column its last non-null value by
    `__chunk_order`. `max_by` over a packed long ordering that is NULL where the value is NULL keeps this a hash
    aggregation and skips NULLs."""
    values = [c for c in df.columns if c not in keys and c != CHUNK_ORDER]
    order = F.col(CHUNK_ORDER)
    aggs = [F.max_by(F.col(q(v)), F.when(F.col(q(v)).isNotNull(), order)).alias(v) for v in values]
    aggs.append(F.max(order).alias(CHUNK_ORDER))
    grouped = df.groupBy(*[F.col(q(k)) for k in keys]).agg(*aggs)
    return grouped.select(*[q(c) for c in df.columns])


def deduplicate_window(df: DataFrame, keys: Sequence[str]) -> DataFrame:
    """The same semantics with window functions: per key, ordered by write order, each value column's last
    non-null value over the whole key, one row kept."""
    from pyspark.sql import Window

    values = [c for c in df.columns if c not in keys and c != CHUNK_ORDER]
    by_key = Window.partitionBy(*[F.col(q(k)) for k in keys])
    whole = by_key.orderBy(F.col(CHUNK_ORDER)).rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    newest_first = by_key.orderBy(F.col(CHUNK_ORDER).desc())
    picked = df.select(
        *[F.col(q(k)) for k in keys],
        *[F.last(F.col(q(v)), ignorenulls=True).over(whole).alias(v) for v in values],
        F.col(CHUNK_ORDER),
        F.row_number().over(newest_first).alias("__rn"),
    )
    return picked.where("__rn = 1").select(*[q(c) for c in df.columns])


def union_all(parts: Sequence[DataFrame]) -> DataFrame:
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    return result


def q(name: str) -> str:
    return f"`{name.replace('`', '``')}`"


def to_view(df: DataFrame, ns_column: str) -> DataFrame:
    """The view a query sees: `time` as a UTC TIMESTAMP (microseconds, floored), its nanoseconds in `ns_column`
    (`model.time_ns_column` of the view)."""
    if TIME not in df.columns:
        return df
    cols = [F.col(q(c)) for c in df.columns if c not in (TIME, CHUNK_ORDER)]
    # Integer floor division: going through a double would lose the low bits of a nanosecond timestamp.
    micros = F.expr(f"({TIME} - pmod({TIME}, 1000)) div 1000")
    return df.select(*cols, F.timestamp_micros(micros).alias(TIME), F.col(TIME).alias(ns_column))


def has_variant(dtype: T.DataType) -> bool:
    """Whether `dtype` is VARIANT or holds one (in an array, a map, a struct)."""
    if isinstance(dtype, T.VariantType):
        return True
    if isinstance(dtype, T.ArrayType):
        return has_variant(dtype.elementType)
    if isinstance(dtype, T.MapType):
        return has_variant(dtype.keyType) or has_variant(dtype.valueType)
    if isinstance(dtype, T.StructType):
        return any(has_variant(f.dataType) for f in dtype.fields)
    return False


def variant_as_json(column: Column, dtype: T.DataType) -> Column:
    """`column` of type `dtype` with every VARIANT in it, however deep, as Spark's own `to_json` text: what a
    result's text formats print. Arrays, maps and structs keep their shape; only their variants become strings."""
    if not has_variant(dtype):
        return column
    if isinstance(dtype, T.VariantType):
        return F.to_json(column)
    if isinstance(dtype, T.ArrayType):
        return F.transform(column, lambda x: variant_as_json(x, dtype.elementType))
    if isinstance(dtype, T.MapType):
        keyed = (F.transform_keys(column, lambda k, _: variant_as_json(k, dtype.keyType))
                 if has_variant(dtype.keyType) else column)
        return F.transform_values(keyed, lambda _, v: variant_as_json(v, dtype.valueType))
    assert isinstance(dtype, T.StructType), dtype
    rebuilt = F.struct(*[variant_as_json(column.getField(f.name), f.dataType).alias(f.name) for f in dtype.fields])
    return F.when(column.isNull(), F.lit(None)).otherwise(rebuilt)


def variants_as_json(df: DataFrame) -> DataFrame:
    """`df` with every VARIANT value as JSON text (`variant_as_json`); `df` itself when it holds none."""
    fields = df.schema.fields
    if not any(has_variant(f.dataType) for f in fields):
        return df
    # Renamed by position first: a result may hold two columns of one name (`SELECT a.x, b.x`).
    slots = [f"_{i}" for i in range(len(fields))]
    converted = df.toDF(*slots).select(*[variant_as_json(F.col(s), f.dataType).alias(s)
                                         for s, f in zip(slots, fields)])
    return converted.toDF(*df.columns)
