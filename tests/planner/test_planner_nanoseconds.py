"""Time columns passed through keep their nanoseconds: the Spark SQL selects `__iox_ns_<name>` next to each one
(from the view's own nanosecond column `<view>__time_ns`, through hidden `__iox_tns_<k>` items of subqueries and
CTEs), an ORDER BY on one breaks ties inside a microsecond by the nanoseconds, and shapes where that is unsafe
fall back to microseconds. Everything else of the text is the user's, as written."""

from __future__ import annotations

import pytest
import sqlglot

from iox_planner.model import Chunk, ChunkKind, ColumnType, StaticSource
from iox_planner.planner import plan_query
from iox_planner.planner.predicate import SPARK

COLUMNS = {"state": ColumnType.TAG, "city": ColumnType.TAG, "temp": ColumnType.FLOAT, "time": ColumnType.TIME}
SOURCE = StaticSource((Chunk("F1", ChunkKind.PARQUET, "h2o", "2024-01-01", 1, 1, 10, COLUMNS),))


def spark_sql(sql: str, **params: object) -> tuple[str, list[str]]:
    plan = plan_query(sql, SOURCE, params=params or None, now_ns=0)
    sqlglot.parse_one(plan.spark_sql, dialect=SPARK)  # still one valid statement
    return plan.spark_sql, list(plan.time_columns)


def test_direct_table() -> None:
    assert spark_sql("SELECT city, time FROM h2o") == (
        "SELECT city, time, h2o.__iox_scan_0__time_ns AS __iox_ns_time FROM __iox_scan_0 AS h2o", ["time"])


def test_star_over_a_table() -> None:
    # The star reaches Spark as written but for the view's own nanosecond column, which it must not expand to.
    assert spark_sql("SELECT * FROM h2o") == (
        "SELECT * EXCEPT (__iox_scan_0__time_ns), h2o.__iox_scan_0__time_ns AS __iox_ns_time "
        "FROM __iox_scan_0 AS h2o", ["time"])


def test_alias_of_table_and_of_column() -> None:
    assert spark_sql("SELECT x.time AS t, x.city FROM h2o x") == (
        "SELECT x.time AS t, x.city, x.__iox_scan_0__time_ns AS __iox_ns_t FROM __iox_scan_0 x", ["t"])


def test_self_join_with_two_time_columns() -> None:
    assert spark_sql("SELECT a.time AS t1, b.time AS t2 FROM h2o a JOIN h2o b ON a.city = b.city") == (
        "SELECT a.time AS t1, b.time AS t2, a.__iox_scan_0__time_ns AS __iox_ns_t1, "
        "b.__iox_scan_1__time_ns AS __iox_ns_t2 FROM __iox_scan_0 a JOIN __iox_scan_1 b ON a.city = b.city",
        ["t1", "t2"])


def test_cte_pass_through() -> None:
    assert spark_sql("WITH x AS (SELECT time AS ts FROM h2o WHERE city = 'a') SELECT ts AS u FROM x") == (
        "WITH x AS (SELECT time AS ts, h2o.__iox_scan_0__time_ns AS __iox_tns_0 FROM __iox_scan_0 AS h2o "
        "WHERE city = 'a') "
        "SELECT ts AS u, x.__iox_tns_0 AS __iox_ns_u FROM x", ["u"])


def test_cte_read_twice_gets_one_hidden_item() -> None:
    assert spark_sql("WITH x AS (SELECT time FROM h2o) SELECT a.time, b.time AS t2 FROM x a JOIN x b "
                     "ON a.time = b.time") == (
        "WITH x AS (SELECT time, h2o.__iox_scan_0__time_ns AS __iox_tns_0 FROM __iox_scan_0 AS h2o) "
        "SELECT a.time, b.time AS t2, a.__iox_tns_0 AS __iox_ns_time, b.__iox_tns_0 AS __iox_ns_t2 "
        "FROM x a JOIN x b ON a.time = b.time", ["time", "t2"])


def test_subquery_pass_through() -> None:
    assert spark_sql("SELECT s.time FROM (SELECT time FROM h2o) s JOIN h2o b ON s.time = b.time") == (
        "SELECT s.time, s.__iox_tns_0 AS __iox_ns_time FROM (SELECT time, h2o.__iox_scan_1__time_ns AS __iox_tns_0 "
        "FROM __iox_scan_1 AS h2o) s JOIN __iox_scan_0 b ON s.time = b.time", ["time"])


def test_nested_stars_over_subqueries_pass_the_nanoseconds_through() -> None:
    # The stars reach Spark with EXCEPT (the hidden items), so they never expand to them.
    assert spark_sql("SELECT * FROM (SELECT * FROM (SELECT city, time FROM h2o) a) b") == (
        "SELECT * EXCEPT (__iox_tns_1), b.__iox_tns_1 AS __iox_ns_time FROM (SELECT * EXCEPT (__iox_tns_0), "
        "a.__iox_tns_0 AS __iox_tns_1 FROM (SELECT city, time, h2o.__iox_scan_0__time_ns AS __iox_tns_0 "
        "FROM __iox_scan_0 AS h2o) a) b", ["time"])


def test_subquery_without_alias_gets_one() -> None:
    sql, columns = spark_sql("SELECT time FROM (SELECT time, city FROM h2o)")
    assert sql == ("SELECT time, _0.__iox_tns_0 AS __iox_ns_time FROM (SELECT time, city, h2o.__iox_scan_0__time_ns "
                   "AS __iox_tns_0 FROM __iox_scan_0 AS h2o) AS _0")
    assert columns == ["time"]


def test_order_by_time_desc_breaks_ties_by_nanoseconds() -> None:
    assert spark_sql("SELECT city, time FROM h2o WHERE city = :c ORDER BY time DESC, city LIMIT 3", c="a") == (
        "SELECT city, time, h2o.__iox_scan_0__time_ns AS __iox_ns_time FROM __iox_scan_0 AS h2o WHERE city = :c "
        "ORDER BY time DESC, h2o.__iox_scan_0__time_ns DESC, city LIMIT 3", ["time"])


@pytest.mark.parametrize(("order", "tie"), [
    ("t", "x.__iox_scan_0__time_ns"),             # an output alias
    ("x.time DESC", "x.__iox_scan_0__time_ns DESC"),  # the column itself
    ("2 NULLS LAST", "x.__iox_scan_0__time_ns"),  # a position (time is never NULL: no NULLS order needed)
])
def test_order_by_forms(order: str, tie: str) -> None:
    sql, _ = spark_sql(f"SELECT city, time AS t FROM h2o x ORDER BY {order}")
    assert sql.endswith(f"ORDER BY {order}, {tie}")


def test_order_by_a_time_not_in_the_result_still_breaks_ties() -> None:
    sql, columns = spark_sql("SELECT city FROM h2o ORDER BY time")
    assert sql == "SELECT city FROM __iox_scan_0 AS h2o ORDER BY time, h2o.__iox_scan_0__time_ns"
    assert columns == []


def test_order_by_with_limit_inside_a_subquery() -> None:
    sql, columns = spark_sql("SELECT t FROM (SELECT time AS t FROM h2o ORDER BY time DESC LIMIT 3) s ORDER BY t")
    assert sql == ("SELECT t, s.__iox_tns_0 AS __iox_ns_t FROM (SELECT time AS t, h2o.__iox_scan_0__time_ns AS "
                   "__iox_tns_0 FROM __iox_scan_0 AS h2o ORDER BY time DESC, h2o.__iox_scan_0__time_ns DESC LIMIT 3) "
                   "s ORDER BY t, s.__iox_tns_0")
    assert columns == ["t"]


@pytest.mark.parametrize("sql", [
    "SELECT time FROM h2o UNION ALL SELECT time FROM h2o ORDER BY time",
    "SELECT time FROM h2o UNION SELECT time FROM h2o",
    "SELECT time FROM h2o INTERSECT SELECT time FROM h2o",
    "SELECT time FROM h2o EXCEPT SELECT time FROM h2o",
    "SELECT DISTINCT time FROM h2o ORDER BY time",
    "SELECT time, count(*) AS c FROM h2o GROUP BY time ORDER BY time",
    "SELECT time, max(temp) OVER (PARTITION BY city) AS m FROM h2o ORDER BY time",
    "SELECT max(time) AS time FROM h2o",
    "SELECT t FROM (SELECT DISTINCT time AS t FROM h2o) s",
    "SELECT t FROM (SELECT time AS t FROM h2o UNION ALL SELECT time AS t FROM h2o) s",
    "SELECT time + INTERVAL 1 HOUR AS time FROM h2o",
])
def test_unsafe_shapes_fall_back_to_microseconds(sql: str) -> None:
    rewritten, columns = spark_sql(sql)
    assert columns == []
    assert "__iox_ns_" not in rewritten and "__time_ns" not in rewritten and "__iox_tns_" not in rewritten
    assert rewritten.replace("__iox_scan_0 AS h2o", "h2o").replace("__iox_scan_1 AS h2o", "h2o") == sql


def test_union_fallback_leaves_the_sql_as_written() -> None:
    assert spark_sql("SELECT time FROM h2o UNION ALL SELECT time FROM h2o ORDER BY time DESC") == (
        "SELECT time FROM __iox_scan_0 AS h2o UNION ALL SELECT time FROM __iox_scan_1 AS h2o ORDER BY time DESC",
        [])


@pytest.mark.parametrize("sql", [
    # a hidden item would change what these see: an IN subquery's single column, a DISTINCT over a star,
    # column lists, a function of a star, a NATURAL join's common columns
    "WITH x AS (SELECT time FROM h2o) SELECT time FROM x WHERE time IN (SELECT * FROM x)",
    "WITH x AS (SELECT time, temp FROM h2o) SELECT a.time FROM x a JOIN (SELECT DISTINCT * FROM x) d "
    "ON a.temp = d.temp",
    "WITH x AS (SELECT time FROM h2o), y AS (SELECT * FROM x) SELECT time FROM x WHERE time IN (SELECT * FROM y)",
    "SELECT t FROM (SELECT time, city FROM h2o) AS s(t, c)",
    "WITH x(t) AS (SELECT time FROM h2o) SELECT t FROM x",
    "SELECT to_json(struct(*)) AS j, time FROM (SELECT time, temp FROM h2o) s",
    "WITH x AS (SELECT time, city FROM h2o) SELECT a.time FROM x a NATURAL JOIN x b",
    "SELECT s.time FROM (SELECT time, city, temp FROM h2o) s PIVOT (sum(temp) FOR city IN ('a', 'b'))",
])
def test_subqueries_whose_columns_others_see_stay_as_written(sql: str) -> None:
    rewritten, columns = spark_sql(sql)
    assert columns == []
    assert "__iox_tns_" not in rewritten


def test_other_readers_of_a_cte_do_not_block_it() -> None:
    sql, columns = spark_sql("WITH x AS (SELECT time, city FROM h2o) SELECT time FROM x "
                             "WHERE city IN (SELECT city FROM x)")
    assert columns == ["time"]
    assert sql == ("WITH x AS (SELECT time, city, h2o.__iox_scan_0__time_ns AS __iox_tns_0 FROM __iox_scan_0 AS h2o) "
                   "SELECT time, x.__iox_tns_0 AS __iox_ns_time FROM x WHERE city IN (SELECT city FROM x)")


def test_aggregate_in_a_nested_query_does_not_block_the_outer_one() -> None:
    sql, columns = spark_sql("SELECT time FROM h2o WHERE temp > (SELECT avg(temp) FROM h2o)")
    assert columns == ["time"]
    assert sql.startswith("SELECT time, h2o.__iox_scan_0__time_ns AS __iox_ns_time FROM __iox_scan_0 AS h2o WHERE")


def test_quoted_result_name() -> None:
    assert spark_sql("SELECT `time` AS `my time` FROM h2o") == (
        "SELECT `time` AS `my time`, h2o.__iox_scan_0__time_ns AS `__iox_ns_my time` FROM __iox_scan_0 AS h2o",
        ["my time"])
