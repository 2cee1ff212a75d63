"""The executor's pure transforms (spark_jobs/transform.py) on small in-memory DataFrames, with
`pyspark.testing.assertDataFrameEqual`. Every expectation is written out by hand: IOx dedup keeps one row per
primary key, each other column its last non-null value in write order; NULL tag equals NULL tag; a later write
position inside one chunk wins; `to_view` floors `time` to microseconds and keeps the exact nanoseconds."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

pytestmark = pytest.mark.spark

C1, C2 = 1 << 32, 2 << 32  # __chunk_order of position 0 of chunk orders 1 and 2, written out


@pytest.fixture(scope="module")
def rows(spark: Any) -> Any:
    """(t, host) is the key; v and w are fields; __chunk_order is (chunk order << 32) | write position."""
    schema = "t string, host string, v double, w bigint, __chunk_order bigint"

    def make(data: list[tuple[Any, ...]]) -> Any:
        return spark.createDataFrame(data, schema)

    return make


@pytest.fixture(params=["deduplicate", "deduplicate_window"])
def dedup(request: pytest.FixtureRequest) -> Any:
    """Both dedup transforms promise the same semantics."""
    from spark_jobs import transform

    return getattr(transform, request.param)


def test_each_column_keeps_its_last_non_null_value(rows: Any, dedup: Any) -> None:
    from pyspark.testing import assertDataFrameEqual

    df = rows([
        ("a", "h1", 1.0, None, C1),
        ("a", "h1", None, 5, C2),       # newer chunk: w arrives, v is NULL so v=1.0 survives... until
        ("a", "h1", 3.0, None, C2 + 1),  # a later write position of the same chunk sets v
        ("b", "h1", 7.0, 8, C1),
    ])
    got = dedup(df, ["t", "host"])
    assertDataFrameEqual(got, rows([("a", "h1", 3.0, 5, C2 + 1), ("b", "h1", 7.0, 8, C1)]))


def test_a_null_tag_equals_a_null_tag(rows: Any, dedup: Any) -> None:
    from pyspark.testing import assertDataFrameEqual

    df = rows([
        (None, "h1", 1.0, 1, C1),
        (None, "h1", 2.0, None, C2),
        ("x", None, 4.0, 4, C1),
        ("x", None, None, 6, C1 + 3),
    ])
    got = dedup(df, ["t", "host"])
    assertDataFrameEqual(got, rows([(None, "h1", 2.0, 1, C2), ("x", None, 4.0, 6, C1 + 3)]))


def test_the_later_write_position_wins_inside_one_chunk(rows: Any, dedup: Any) -> None:
    from pyspark.testing import assertDataFrameEqual

    # Written in reverse on purpose: the row order of the input must not matter, only the position.
    df = rows([("a", "h", 9.0, 9, C1 + 2), ("a", "h", 1.0, 1, C1 + 1), ("a", "h", 0.0, 0, C1)])
    assertDataFrameEqual(dedup(df, ["t", "host"]), rows([("a", "h", 9.0, 9, C1 + 2)]))


def test_a_newer_chunk_beats_any_write_position_of_an_older_one(rows: Any, dedup: Any) -> None:
    from pyspark.testing import assertDataFrameEqual

    df = rows([("a", "h", 1.0, 1, C1 + 4_294_967_295), ("a", "h", 2.0, 2, C2)])
    assertDataFrameEqual(dedup(df, ["t", "host"]), rows([("a", "h", 2.0, 2, C2)]))


def test_to_view_floors_time_to_microseconds_and_keeps_the_nanoseconds(spark: Any) -> None:
    from pyspark.testing import assertDataFrameEqual

    from spark_jobs.transform import to_view

    df = spark.createDataFrame([("a", 1_700_000_000_123_456_789, 0), ("b", -1, 0)],
                               "host string, time bigint, __chunk_order bigint")
    utc = dt.timezone.utc
    expected = spark.createDataFrame([
        ("a", dt.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=utc), 1_700_000_000_123_456_789),
        ("b", dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=utc), -1),
    ], "host string, time timestamp, __iox_scan_3__time_ns bigint")
    assertDataFrameEqual(to_view(df, "__iox_scan_3__time_ns"), expected)


def test_the_chunk_order_column_packs_order_and_write_position(spark: Any) -> None:
    from pyspark.testing import assertDataFrameEqual

    from iox_planner.model import ChunkKind, ColumnType, Chunk, pack_order
    from spark_jobs.transform import chunk_order_column

    assert pack_order(3, 7) == 12_884_901_895  # 3 * 2**32 + 7
    chunk = Chunk("C3", ChunkKind.INGESTER, "m", "2024-01-01", 3, 0, 0, {"v": ColumnType.FLOAT}, path="1/1/1/c.parquet")
    df = spark.createDataFrame([(1.0, 0), (2.0, 7)], "v double, __seq bigint")
    ingester = df.select("v", chunk_order_column([chunk], True).alias("__chunk_order"))
    assertDataFrameEqual(ingester, spark.createDataFrame([(1.0, 12_884_901_888), (2.0, 12_884_901_895)],
                                                         "v double, __chunk_order bigint"))
    parquet = df.select("v", chunk_order_column([chunk], False).alias("__chunk_order"))
    assertDataFrameEqual(parquet, spark.createDataFrame([(1.0, 12_884_901_888), (2.0, 12_884_901_888)],
                                                        "v double, __chunk_order bigint"))


def test_union_all_matches_columns_by_name(spark: Any) -> None:
    from pyspark.testing import assertDataFrameEqual

    from spark_jobs.transform import union_all

    a = spark.createDataFrame([(1, "x")], "n bigint, s string")
    b = spark.createDataFrame([("y", 2)], "s string, n bigint")
    assertDataFrameEqual(union_all([a, b]), spark.createDataFrame([(1, "x"), (2, "y")], "n bigint, s string"))


def test_file_types_follow_the_one_spark_map(spark: Any) -> None:
    """Files are read as the view's types, except `time` (int64 nanoseconds until `to_view`)."""
    from pyspark.sql import types as T

    from iox_planner.model import ColumnType
    from spark_jobs.transform import file_type

    assert {c: file_type(c) for c in ColumnType} == {
        ColumnType.TAG: T.StringType(), ColumnType.STRING: T.StringType(), ColumnType.FLOAT: T.DoubleType(),
        ColumnType.INTEGER: T.LongType(), ColumnType.UNSIGNED: T.DecimalType(20, 0),
        ColumnType.BOOLEAN: T.BooleanType(), ColumnType.TIME: T.LongType(),
    }


def test_an_unknown_dedup_strategy_is_one_paragraph(monkeypatch: Any) -> None:
    from iox_planner.errors import BadInputError
    from spark_jobs.execute import Strategy, dedup_strategy

    monkeypatch.setenv("IOX_DEDUP_STRATEGY", "bogus")
    with pytest.raises(BadInputError, match="IOX_DEDUP_STRATEGY='bogus' is not allowed: IOX_DEDUP_STRATEGY takes "
                       "one of `arrow`"):
        dedup_strategy()
    assert dedup_strategy("window") is Strategy.WINDOW
    monkeypatch.setenv("IOX_DEDUP_STRATEGY", "shared")
    assert dedup_strategy() is Strategy.SHARED


def test_variants_become_their_json_text_wherever_they_are(spark: Any) -> None:
    """`variants_as_json`: each VARIANT, at the top or in an array, struct or map, as the text Spark's `to_json`
    writes (here written out by hand); an SQL NULL stays NULL, JSON null is the text null; columns of one name and
    every other value are kept as they are."""
    from pyspark.testing import assertDataFrameEqual

    from spark_jobs.transform import variants_as_json

    df = spark.sql("SELECT parse_json('{\"b\":2.50,\"a\":[1e3]}') AS v, array(parse_json('1'), NULL) AS arr, "
                   "named_struct('x', parse_json('\"s\"'), 'y', 3) AS st, map('k', parse_json('null')) AS m, "
                   "CAST(NULL AS VARIANT) AS n, CAST(NULL AS STRUCT<x: VARIANT>) AS ns, 7 AS v")
    want = spark.createDataFrame(
        [('{"a":[1000.0],"b":2.5}', ["1", None], ('"s"', 3), {"k": "null"}, None, None, 7)],
        "v string, arr array<string>, st struct<x: string, y: int>, m map<string, string>, n string, "
        "ns struct<x: string>, v int")
    assertDataFrameEqual(variants_as_json(df), want)
    plain = spark.createDataFrame([(1, "x")], "n bigint, s string")
    assert variants_as_json(plain) is plain
