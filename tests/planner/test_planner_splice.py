"""The text Spark runs is the user's, byte for byte, with only the planner's edits spliced in (issue 21): table
references to their views, stars kept off the views' own columns, clocks fixed, nanoseconds for time columns.
Every expected text below is written by hand from the query as written."""

from __future__ import annotations

import re

import pytest

from iox_planner.errors import BadQueryError, IoxError
from iox_planner.model import Chunk, ChunkKind, ColumnType, StaticSource
from iox_planner.planner import plan_query

COLUMNS = {"state": ColumnType.TAG, "city": ColumnType.TAG, "temp": ColumnType.FLOAT, "time": ColumnType.TIME}
CPU = {"host": ColumnType.TAG, "usage": ColumnType.FLOAT, "time": ColumnType.TIME}
SOURCE = StaticSource((Chunk("F1", ChunkKind.PARQUET, "h2o", "2024-01-01", 1, 1, 10, COLUMNS),
                       Chunk("C1", ChunkKind.PARQUET, "sys.cpu", "2024-01-01", 2, 1, 10, CPU)))
NOW = 1_700_000_000_123_456_789


def spark_sql(sql: str) -> str:
    return plan_query(sql, SOURCE, now_ns=NOW).spark_sql


@pytest.mark.parametrize("sql", [
    # the re-printing changed these; the planner has nothing to edit in them, so Spark gets them as they are
    "SELECT percentile_cont(0.25) WITHIN GROUP (ORDER BY col) FROM VALUES (0), (10) AS tab(col)",
    "SELECT percentile_disc(0.25) WITHIN GROUP (ORDER BY col) FROM VALUES (0), (10) AS tab(col)",
    "SELECT listagg(col) FROM VALUES ('a'), ('b'), ('c') AS tab(col)",
    "SELECT string_agg(col) FROM VALUES ('a'), (NULL), ('b') AS tab(col)",
    "SELECT instr('abcabc', 'b', 1, 2)",
    "SELECT max_by(x, y, 2), min_by(x, y, 2) FROM VALUES ('a', 10), ('b', 50), ('c', 20) AS tab(x, y)",
    "SELECT to_char(12454, '99G999')",
    "SELECT unix_timestamp('2016-04-08', 'yyyy-MM-dd')",
    "SELECT variant_get(parse_json('{\"a\": 1}'), '$.a', 'int')",
    "SELECT make_timestamp(DATE'2014-12-28', TIME'6:30:45.887')",
    "SELECT * FROM VALUES 'a', 'b' AS t(c)",
    "SELECT x FROM t FETCH NEXT 1 ROWS WITH TIES".replace("t FETCH", "VALUES 1 AS t(x) FETCH"),
    # refused by the re-printing's function check although valid
    "SELECT true and true",
    "SELECT bitmap_count(X '1010'), X'F0'",
    "SELECT 4 >>> 1",
    "SELECT is_variant_null(parse_json(null))",
    "SELECT a, window.start, window.end, count(*) as cnt FROM VALUES ('A1', '2021-01-01 00:00:00') AS tab(a, b) "
    "GROUP by a, window(b, '5 minutes') ORDER BY a, window.start",
    "SELECT a, session_window.start, count(*) FROM VALUES ('A1', '2021-01-01 00:00:00') AS tab(a, b) "
    "GROUP BY a, session_window(b, '5 minutes')",
    "SELECT col FROM explode(array(1, 2))",
    # comments, case and spacing survive
    "select /* why */ 1 -- and a comment\n ,\t2",
    "SELECT '%SystemDrive%\\Users\\John' like '\\%SystemDrive\\%\\\\Users%'",
])
def test_a_query_without_tables_or_clocks_reaches_spark_byte_for_byte(sql: str) -> None:
    assert spark_sql(sql) == sql


@pytest.mark.parametrize(("sql", "expected"), [
    ("SELECT city FROM h2o", "SELECT city FROM __iox_scan_0 AS h2o"),
    ("select city from h2o x", "select city from __iox_scan_0 x"),
    ("SELECT city FROM h2o AS `x y`", "SELECT city FROM __iox_scan_0 AS `x y`"),
    ("SELECT usage FROM `sys.cpu`", "SELECT usage FROM __iox_scan_0 AS `sys.cpu`"),
    ("SELECT `c`.usage FROM `sys.cpu` c", "SELECT `c`.usage FROM __iox_scan_0 c"),
    # Spark reads a table's sample before its alias: the alias goes after it
    ("SELECT count(*) FROM h2o TABLESAMPLE (10 PERCENT)",
     "SELECT count(*) FROM __iox_scan_0 TABLESAMPLE (10 PERCENT) AS h2o"),
    ("SELECT count(*) FROM h2o TABLESAMPLE (10 ROWS) REPEATABLE (3) WHERE temp > 1",
     "SELECT count(*) FROM __iox_scan_0 TABLESAMPLE (10 ROWS) REPEATABLE (3) AS h2o WHERE temp > 1"),
    # a CTE of a table's name is the CTE, not the table
    ("WITH h2o AS (SELECT 1 AS x) SELECT x FROM h2o", "WITH h2o AS (SELECT 1 AS x) SELECT x FROM h2o"),
    # a PIVOT groups by every column it does not pivot: it pivots the view without its nanosecond column
    ("SELECT * FROM h2o PIVOT (max(temp) FOR city IN ('a'))",
     "SELECT * FROM (SELECT * EXCEPT (__iox_scan_0__time_ns) FROM __iox_scan_0) AS h2o "
     "PIVOT (max(temp) FOR city IN ('a'))"),
    # stars: EXCEPT the views' own columns, joined to the user's EXCEPT list when there is one
    ("SELECT count(*), city FROM h2o GROUP BY city", "SELECT count(*), city FROM __iox_scan_0 AS h2o GROUP BY city"),
    ("SELECT * EXCEPT (temp), 1 AS one FROM h2o",
     "SELECT * EXCEPT (temp, __iox_scan_0__time_ns), 1 AS one, h2o.__iox_scan_0__time_ns AS __iox_ns_time "
     "FROM __iox_scan_0 AS h2o"),
    ("SELECT to_json(struct(*)) AS j FROM h2o",
     "SELECT to_json(struct(* EXCEPT (__iox_scan_0__time_ns))) AS j FROM __iox_scan_0 AS h2o"),
    ("SELECT h.*, c.host FROM h2o h, `sys.cpu` c",
     "SELECT h.* EXCEPT (__iox_scan_0__time_ns), c.host, h.__iox_scan_0__time_ns AS __iox_ns_time "
     "FROM __iox_scan_0 h, __iox_scan_1 c"),
    # a NATURAL JOIN stays as written: the views' nanosecond columns have different names, never joined on
    ("SELECT city FROM h2o NATURAL JOIN h2o b", "SELECT city FROM __iox_scan_0 AS h2o NATURAL JOIN __iox_scan_1 b"),
    # clocks: constants of the same type
    ("SELECT city FROM h2o WHERE time > now() - INTERVAL 1 HOUR",
     "SELECT city FROM __iox_scan_0 AS h2o WHERE time > TIMESTAMP_MICROS(1700000000123456) - INTERVAL 1 HOUR"),
    ("SELECT current_date AS d, CURDATE() AS e, current_timestamp AS t, localtimestamp() AS l, "
     "unix_timestamp() AS u, unix_timestamp(time) AS v FROM h2o",
     "SELECT DATE_FROM_UNIX_DATE(19675) AS d, DATE_FROM_UNIX_DATE(19675) AS e, TIMESTAMP_MICROS(1700000000123456) "
     "AS t, TIMESTAMP_NTZ '2023-11-14 22:13:20.123456' AS l, unix_timestamp(TIMESTAMP_MICROS(1700000000123456)) "
     "AS u, unix_timestamp(time) AS v FROM __iox_scan_0 AS h2o"),
    # Spark resolves a bare `current_time` itself; it is not a timestamp the planner can pin
    ("SELECT current_time AS t FROM h2o", "SELECT current_time AS t FROM __iox_scan_0 AS h2o"),
])
def test_only_the_planners_edits_are_spliced_in(sql: str, expected: str) -> None:
    assert spark_sql(sql) == expected


def test_a_clock_in_an_unnamed_result_column_keeps_its_name_from_the_text_without_the_edit() -> None:
    plan = plan_query("SELECT now(), now() AS t, count(*) FROM h2o", SOURCE, now_ns=NOW)
    assert plan.spark_sql == ("SELECT TIMESTAMP_MICROS(1700000000123456), TIMESTAMP_MICROS(1700000000123456) AS t, "
                              "count(*) FROM __iox_scan_0 AS h2o")
    assert plan.naming_sql == "SELECT now(), now() AS t, count(*) FROM __iox_scan_0 AS h2o"
    assert plan_query("SELECT now() AS t FROM h2o", SOURCE, now_ns=NOW).naming_sql is None


def test_a_column_named_like_a_bare_clock_must_be_qualified() -> None:
    source = StaticSource((Chunk("F1", ChunkKind.PARQUET, "m", "2024-01-01", 1, 1, 10,
                                 {"current_date": ColumnType.TAG, "time": ColumnType.TIME}),))
    with pytest.raises(BadQueryError, match="qualify the column"):
        plan_query("SELECT current_date FROM m", source, now_ns=NOW)
    assert plan_query("SELECT m.current_date FROM m", source, now_ns=NOW).spark_sql == \
        "SELECT m.current_date FROM __iox_scan_0 AS m"


def test_a_subquery_needing_an_alias_with_a_sample_is_refused_not_re_printed() -> None:
    with pytest.raises(IoxError, match="alias"):
        plan_query("SELECT time FROM (SELECT time FROM h2o) TABLESAMPLE (50 PERCENT)", SOURCE, now_ns=NOW)


def test_list_and_literal_limits() -> None:
    values = ", ".join("1" for _ in range(10_001))
    with pytest.raises(BadQueryError, match=r"IN list of 10,001 values.*IOX_MAX_SQL_LIST"):
        plan_query(f"SELECT city FROM h2o WHERE temp IN ({values})", SOURCE, now_ns=NOW)
    rows = ", ".join(f"({i})" for i in range(10_001))
    with pytest.raises(BadQueryError, match=r"VALUES list of 10,001 values"):
        plan_query(f"SELECT * FROM VALUES {rows} AS t(x)", SOURCE, now_ns=NOW)
    deep = "array<" * 70 + "int" + ">" * 70
    with pytest.raises(BadQueryError, match="nests brackets 70 levels deep"):
        plan_query(f"SELECT from_json('[]', '{deep}') FROM h2o", SOURCE, now_ns=NOW)
    json_text = "[" * 65 + "]" * 65
    with pytest.raises(BadQueryError, match="IOX_MAX_SQL_DEPTH"):
        plan_query(f"SELECT schema_of_json('{json_text}')", SOURCE, now_ns=NOW)
    at_the_limit = ", ".join("1" for _ in range(10_000))
    assert plan_query(f"SELECT city FROM h2o WHERE temp IN ({at_the_limit})", SOURCE, now_ns=NOW).scans


def test_allocation_limit_follows_its_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOX_MAX_SQL_ALLOC", "2000")
    with pytest.raises(BadQueryError, match="over the limit of 2,000"):
        plan_query("SELECT repeat(city, 2001) FROM h2o", SOURCE, now_ns=NOW)
    # a count that is not a constant is left to the query's time budget
    assert plan_query("SELECT repeat(city, 2000), repeat(city, temp) FROM h2o", SOURCE, now_ns=NOW).scans


@pytest.mark.parametrize("sql", [
    "SELECT /*+ REPARTITION(3) */ city FROM h2o",
    "SELECT /*+ REPARTITION(3, city), COALESCE(2) */ city FROM h2o",
    "SELECT /*+ REBALANCE, BROADCAST(h2o) */ city FROM h2o",
])
def test_partitioning_hints_pass_as_written(sql: str) -> None:
    assert spark_sql(sql) == sql.replace("FROM h2o", "FROM __iox_scan_0 AS h2o")


def test_a_table_name_with_padding_resolves_its_qualified_columns() -> None:
    source = StaticSource((Chunk("F2", ChunkKind.PARQUET, " lead", "2024-01-01", 1, 1, 10,
                                 {"trail ": ColumnType.TAG, "time": ColumnType.TIME}),))
    plan = plan_query("SELECT ` lead`.`trail ` FROM ` lead`", source, now_ns=NOW)
    assert plan.spark_sql == "SELECT ` lead`.`trail ` FROM __iox_scan_0 AS ` lead`"
    assert plan.scans[0].columns == (("trail ", ColumnType.TAG),)


@pytest.mark.parametrize(("sql", "needle"), [
    ("SELECT format_string('%n%2$s', 1)", "uses 2 argument(s) but the call gives 1"),
    ("SELECT printf('%s %s', city) FROM h2o", "uses 2 argument(s) but the call gives 1"),
    ("SELECT format_string('%q', 1)", "'%q', which Java's Formatter does not know"),
    ("SELECT format_string('100%')", "ends inside a specifier"),
    # a format from the data could ask for any width (issue 31)
    ("SELECT format_string(city, 1) FROM h2o", "must be one string literal"),
])
def test_a_constant_format_that_java_would_refuse_is_refused_when_planning(sql: str, needle: str) -> None:
    with pytest.raises(BadQueryError, match=re.escape(needle)):
        plan_query(sql, SOURCE, now_ns=NOW)


@pytest.mark.parametrize("sql", [
    "SELECT format_string('%2$s %1$s', 'a', 'b')",
    "SELECT format_string('%s %<s and 100%%%n', 'a')",
    "SELECT format_string('%-10.3f|%08X|%,d', 1.5, 255, 1000)",
    "SELECT printf('%tY-%<tm', time) FROM h2o",
])
def test_formats_java_takes_are_taken(sql: str) -> None:
    assert plan_query(sql, SOURCE, now_ns=NOW).spark_sql


def test_a_format_type_mismatch_from_spark_says_what_is_wrong() -> None:
    from spark_jobs.errors import sanitize_spark_message

    assert sanitize_spark_message("d != org.apache.spark.unsafe.types.UTF8String") == (
        "format_string/printf: the specifier %d does not fit its value, a string; cast the value or use %s")


def test_format_is_not_a_spark_function_and_is_not_turned_into_one() -> None:
    # The re-printing made FORMAT(...) into format_string(...), an error into a value; Spark 4.3 has no format().
    with pytest.raises(IoxError, match=re.escape("function format() is not in the allowed list")):
        plan_query("SELECT format('%s', 1)", SOURCE, now_ns=NOW)


def test_a_backquoted_function_name_is_the_name() -> None:
    assert spark_sql("SELECT `abs`(-1), `ABS`(2)") == "SELECT `abs`(-1), `ABS`(2)"
    with pytest.raises(IoxError, match=re.escape("function reflect() is not in the allowed list")):
        plan_query("SELECT `reflect`('a', 'b')", SOURCE, now_ns=NOW)
