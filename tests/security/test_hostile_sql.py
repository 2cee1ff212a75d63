"""Issue 8, the SQL half: a query may read the data and nothing else.

Most hostile queries are checked at the SQL front end (planning against a scenario's chunk metadata, as
`iox-batch explain --chunks` does, in this process): each must be refused with an error that names what it
refused. A sample runs through the real `iox-batch query` and `explain --analyze` against the test catalog, and
must leave nothing behind. Allowed functions must still plan and run on Spark.

`IOX_HOSTILE_FULL=1` adds every refused function in every spelling at every place in a query (a few thousand
cases); CI runs the fixed list.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from common_support import assert_one_paragraph_error, run_cli
from iox_planner.errors import IoxError
from iox_planner.planner import plan_query
from iox_planner.ingest.scenario import read_scenario, scenario_source

ROOT = Path(__file__).resolve().parents[2]
H2O = ROOT / "examples" / "h2o.yaml"


@pytest.fixture(scope="module")
def h2o_source() -> Any:
    return scenario_source(read_scenario(str(H2O)))


def refusal(sql: str, source: Any, **kw: Any) -> str:
    """The error planning `sql` raises (it must raise one of iox-batch's errors, nothing else)."""
    with pytest.raises(IoxError) as caught:
        plan_query(sql, source, now_ns=0, **kw)
    message = str(caught.value)
    assert "\n\n" not in message and len(message) <= 2_000, message[:300]
    return message


# ---------------------------------------------------------------------------------------------------------------
# Functions that reach outside the data, in every spelling and every place

# (the name as it appears in the error, the call)
CALLS = [
    ("reflect", "reflect('org.apache.spark.util.Utils', 'checkCommandAvailable', 'x; id > /tmp/iox_pwned')"),
    ("reflect", "`reflect`('org.apache.spark.util.Utils', 'checkCommandAvailable', 'x; id > /tmp/iox_pwned')"),
    ("REFLECT", "REFLECT('java.lang.System', 'getenv', 'HOME')"),
    ("ReFlEcT", "`ReFlEcT`('java.lang.System', 'getenv', 'HOME')"),
    ("java_method", "java_method('org.apache.spark.util.Utils', 'getPropertiesFromFile', '/etc/passwd')"),
    ("JAVA_METHOD", "`JAVA_METHOD`('org.apache.spark.util.Utils', 'getPropertiesFromFile', '/etc/passwd')"),
    ("Java_Method", "Java_Method('java.lang.System', 'getProperty', 'user.name')"),
    ("try_reflect", "try_reflect('java.lang.System', 'getenv', 'HOME')"),
    ("try_reflect", "`try_reflect`('java.lang.Runtime', 'getRuntime')"),
    ("input_file_name", "input_file_name()"),
    ("input_file_name", "`input_file_name`()"),
    ("input_file_block_start", "input_file_block_start()"),
    ("input_file_block_length", "INPUT_FILE_BLOCK_LENGTH()"),
    ("current_user", "current_user()"),
    ("current_user", "current_user"),
    ("session_user", "session_user()"),
    ("session_user", "session_user"),
    ("user", "user()"),
    ("version", "version()"),
    ("current_database", "current_database()"),
    ("current_schema", "current_schema()"),
    ("current_catalog", "current_catalog()"),
    ("current_timezone", "current_timezone()"),
    ("spark_partition_id", "spark_partition_id()"),
    ("monotonically_increasing_id", "monotonically_increasing_id()"),
    ("xpath_string", "xpath_string('<a>1</a>', 'a')"),
    ("from_xml", "from_xml('<a>1</a>', 'a INT')"),
    ("from_protobuf", "from_protobuf(city, 'M', '/etc/passwd')"),
    ("raise_error", "raise_error('boom')"),
    ("assert_true", "assert_true(false)"),
    ("identifier", "IDENTIFIER('__time_ns')"),
    ("identifier", "identifier('city')"),
    ("read_files", "read_files('/etc/passwd')"),
    ("http_request", "http_request('http://127.0.0.1/')"),
    ("secret", "secret('scope', 'key')"),
    ("my_udf", "my_udf(city)"),
    ("system.builtin.reflect", "`system.builtin.reflect`('a', 'b')"),
]
QUALIFIED = [
    "system.builtin.reflect('java.lang.System', 'getenv', 'HOME')",
    "`system`.`builtin`.`reflect`('java.lang.System', 'getenv', 'HOME')",
    "builtin.java_method('java.lang.System', 'getenv', 'HOME')",
    "SYSTEM.BUILTIN.ABS(1)",
    "spark_catalog.default.my_udf(city)",
    "`system`.`session`.`f`(city)",
]
# Where a call can hide: {f} is the call.
PLACES = [
    "SELECT {f} FROM h2o",
    "SELECT city FROM h2o WHERE {f} IS NOT NULL",
    "SELECT city, count(*) FROM h2o GROUP BY city HAVING max({f}) IS NOT NULL",
    "SELECT city FROM h2o ORDER BY {f}",
    "SELECT a.city FROM h2o a JOIN h2o b ON a.city = b.city AND {f} IS NULL",
    "WITH c AS (SELECT {f} AS x FROM h2o) SELECT x FROM c",
    "SELECT x FROM (SELECT {f} AS x FROM h2o) s",
    "SELECT city FROM h2o WHERE city IN (SELECT {f} FROM h2o)",
    "SELECT city, (SELECT max({f}) FROM h2o) AS m FROM h2o",
    "SELECT sum(max_temp) OVER (PARTITION BY {f}) FROM h2o",
    "SELECT city, x FROM h2o LATERAL VIEW explode(array({f})) t AS x",
    "SELECT coalesce(city, concat('a', {f})) FROM h2o",
    "SELECT CASE WHEN city = 'SF' THEN {f} ELSE 'x' END FROM h2o",
    "SELECT transform(array(1), v -> {f}) FROM h2o",
    "SELECT city FROM h2o GROUP BY city, {f}",
    "SELECT city FROM h2o UNION ALL SELECT {f} FROM h2o",
    "SELECT count(*) FILTER (WHERE {f} IS NULL) FROM h2o",
]

_FIXED_PLACES = [0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 13]


def _function_cases() -> list[tuple[str, str]]:
    """(sql, what the error must name). The fixed list: every call in the SELECT list, and the first two calls
    (`reflect`, quoted `reflect`) and a few others at every place."""
    cases: list[tuple[str, str]] = []
    for name, call in CALLS:
        cases.append((PLACES[0].format(f=call), name))
    for (name, call), place in itertools.product(CALLS[:2] + [CALLS[5], CALLS[8], CALLS[10]],
                                                 [PLACES[i] for i in _FIXED_PLACES[1:]]):
        cases.append((place.format(f=call), name))
    for call in QUALIFIED:
        cases.append((PLACES[0].format(f=call), "qualified"))
        cases.append((PLACES[1].format(f=call), "qualified"))
    if os.environ.get("IOX_HOSTILE_FULL"):
        for (name, call), place in itertools.product(CALLS, PLACES):
            cases.append((place.format(f=call), name))
        for call, place in itertools.product(QUALIFIED, PLACES):
            cases.append((place.format(f=call), "qualified"))
    seen: set[str] = set()
    return [c for c in cases if not (c[0] in seen or seen.add(c[0]))]  # type: ignore[func-returns-value]


FUNCTION_CASES = _function_cases()


@pytest.mark.parametrize("sql, name", FUNCTION_CASES, ids=[f"f{i:03d}" for i in range(len(FUNCTION_CASES))])
def test_a_function_outside_the_allowed_list_is_refused_by_name(h2o_source: Any, sql: str, name: str) -> None:
    message = refusal(sql, h2o_source)
    assert name.lower() in message.lower(), message
    if name != "qualified":
        assert "not in the allowed list" in message or "table function" in message, message


# ---------------------------------------------------------------------------------------------------------------
# Everything else that is not a SELECT over catalog tables

OTHER_CASES = [
    # script transforms
    ("SELECT TRANSFORM(city) USING 'cat' FROM h2o", "external script"),
    ("SELECT TRANSFORM(city, state) USING '/bin/sh -c id' AS (a, b) FROM h2o", "external script"),
    ("select transform(city) using \"cat\" from h2o", "external script"),
    ("SELECT MAP(city) USING 'cat' FROM h2o", "external script"),
    ("SELECT map(city, state) USING 'cat' AS (k, v) FROM h2o", "external script"),
    ("SELECT REDUCE(city) USING 'cat' FROM h2o", "external script"),
    ("SELECT x FROM (SELECT TRANSFORM(city) USING 'id' AS x FROM h2o) s", "external script"),
    ("FROM h2o SELECT TRANSFORM(city) USING 'cat'", "external script"),
    # paths and other sources as tables
    ("SELECT * FROM parquet.`/tmp/x.parquet`", "only catalog tables"),
    ("SELECT * FROM text.`/etc/passwd`", "only catalog tables"),
    ("SELECT * FROM csv.`/etc/passwd`", "only catalog tables"),
    ("SELECT * FROM json.`/etc/hostname`", "only catalog tables"),
    ("SELECT * FROM `parquet`.`/tmp/x`", "only catalog tables"),
    ("SELECT * FROM orc.`file:///etc/passwd`", "only catalog tables"),
    ("SELECT * FROM `/etc/passwd`", "path"),
    ("SELECT * FROM `file:///etc/passwd`", "path"),
    ("SELECT * FROM `..`", "unknown table"),
    ("SELECT * FROM `a.b`", "unknown table"),
    ("SELECT * FROM spark_catalog.default.h2o", "only catalog tables"),
    ("SELECT * FROM default.h2o", "only catalog tables"),
    ("SELECT * FROM global_temp.x", "only catalog tables"),
    ("SELECT * FROM h2o a JOIN text.`/etc/passwd` b ON true", "only catalog tables"),
    ("WITH c AS (SELECT * FROM text.`/etc/passwd`) SELECT * FROM c", "only catalog tables"),
    # table functions
    ("SELECT * FROM range(10)", "table function"),
    ("SELECT * FROM RANGE(0, 10, 1, 2)", "table function"),
    ("SELECT * FROM read_files('/etc/passwd')", "table function"),
    ("SELECT * FROM IDENTIFIER('h2o')", "table function"),
    ("SELECT * FROM sql_keywords()", "table function"),
    ("SELECT * FROM h2o, range(3)", "table function"),
    ("SELECT * FROM h2o LATERAL VIEW java_method('a', 'b') t AS x", "java_method"),
    ("SELECT * FROM h2o LATERAL VIEW OUTER reflect('a', 'b') t AS x", "reflect"),
    # variables Spark would substitute (bare, not in a string)
    ("SELECT ${env:HOME} FROM h2o", "variable"),
    ("SELECT city FROM h2o WHERE city = ${system:user.name}", "variable"),
    ("SELECT ${spark:spark.app.name} FROM h2o", "variable"),
    ("SELECT ${hiveconf:x} FROM h2o", "variable"),
    ("SELECT @@version FROM h2o", "variable"),
    # hints
    ("SELECT /*+ FOO(h2o) */ city FROM h2o", "hint"),
    ("SELECT /*+ REFLECT('a') */ city FROM h2o", "hint"),
    # not a SELECT
    ("SET spark.sql.variable.substitute=true", "SELECT"),
    ("SET x = 1", "SELECT"),
    ("ADD JAR /tmp/evil.jar", "SELECT"),
    ("ADD FILE /etc/passwd", "SELECT"),
    ("CACHE TABLE h2o", "SELECT"),
    ("REFRESH TABLE h2o", "SELECT"),
    ("CREATE TEMPORARY FUNCTION f AS 'org.example.Evil'", "SELECT"),
    ("INSERT OVERWRITE DIRECTORY '/tmp/iox_pwned' SELECT * FROM h2o", "SELECT"),
    ("DROP TABLE h2o", "SELECT"),
    ("LOAD DATA INPATH '/etc/passwd' INTO TABLE h2o", "SELECT"),
    ("SHOW FUNCTIONS", "SELECT"),
    ("DESCRIBE FUNCTION reflect", "SELECT"),
    ("USE other", "SELECT"),
    ("SELECT 1 FROM h2o; ADD JAR /tmp/evil.jar", "one SQL statement"),
    ("SELECT 1 FROM h2o; SELECT reflect('a', 'b')", "one SQL statement"),
    # internal columns
    ("SELECT __time_ns FROM h2o", "reserves"),
    ("SELECT __chunk_order FROM h2o", "reserves"),
    ("SELECT __seq FROM h2o", "reserves"),
    ("SELECT h2o.__iox_ns_time FROM h2o", "reserves"),
    ("SELECT city FROM h2o WHERE IDENTIFIER('__time_ns') > 0", "identifier"),
    # a bare name Spark would read as a call of a refused function, where sqlglot does not check columns
    ("SELECT city FROM h2o GROUP BY city HAVING max(user) > ''", "user()"),
    ("SELECT city FROM h2o QUALIFY current_schema = 'default'", "current_schema()"),
    ("SELECT city FROM h2o GROUP BY city HAVING max(`session_user`) = 'root'", "session_user()"),
    ("SELECT city FROM h2o ORDER BY user", "user()"),
    ("SELECT city FROM h2o GROUP BY city HAVING max(USER) = 'root'", "user()"),
    # pipes and FROM-first queries: sqlglot rebuilds them into shapes the edits cannot follow (probes S81-S98:
    # a star edit inside the FROM keyword, two views swapped, internal errors)
    ("FROM h2o |> UNION ALL (FROM h2o)", "pipe syntax"),
    ("(FROM h2o) |> UNION ALL (FROM h2o)", "pipe syntax"),
    ("/*abcdefgh*/FROM h2o |> UNION ALL (FROM h2o)", "pipe syntax"),
    ("-- c\nFROM h2o |> WHERE true |> UNION ALL (FROM h2o)", "pipe syntax"),
    ("SELECT * FROM h2o |> WHERE city = 'a'", "pipe syntax"),
    ("FROM h2o", "no SELECT list"),
    ("FROM h2o UNION ALL FROM h2o", "no SELECT list"),
    ("   (FROM h2o) UNION ALL (SELECT * FROM h2o)", "no SELECT list"),
    # text that is not text
    ("SELECT city FROM h2o WHERE city = 'a\x00b'", "NUL"),
    ("SELECT city\x00 FROM h2o", "NUL"),
    ("SELECT city FROM h2o WHERE city = '\udcff'", "not valid UTF-8"),
    ("SELECT '\ud800' FROM h2o", "not valid UTF-8"),
]


@pytest.mark.parametrize("sql, needle", OTHER_CASES, ids=[f"o{i:03d}" for i in range(len(OTHER_CASES))])
def test_anything_but_a_select_over_catalog_tables_is_refused(h2o_source: Any, sql: str, needle: str) -> None:
    message = refusal(sql, h2o_source)
    assert needle.lower() in message.lower(), message


# ---------------------------------------------------------------------------------------------------------------
# Unbounded inputs

DEEP_CASES = [
    ("SELECT " + "(" * 1000 + "1" + ")" * 1000 + " FROM h2o", "nests"),
    ("SELECT " + "abs(" * 1000 + "1" + ")" * 1000 + " FROM h2o", "nests"),
    ("SELECT " + "NOT " * 1000 + "true FROM h2o", "nests"),
    ("SELECT " + "- " * 1000 + "1 FROM h2o", "nests"),
    ("SELECT " + "CASE WHEN true THEN " * 500 + "1" + " END" * 500 + " FROM h2o", "nests"),
    ("SELECT * FROM " + "(SELECT * FROM " * 300 + "h2o" + ") s" * 300, "nests"),
    ("SELECT " + "array(" * 200 + "1" + ")" * 200 + " FROM h2o", "nests"),
    ("SELECT " + " + ".join(["1"] * 3000) + " FROM h2o", "nest"),
    ("SELECT city FROM h2o WHERE " + "(" * 65 + "true" + ")" * 65, "nests"),
]


@pytest.mark.parametrize("sql, needle", DEEP_CASES, ids=[f"d{i}" for i in range(len(DEEP_CASES))])
def test_deep_nesting_fails_fast_and_clearly(h2o_source: Any, sql: str, needle: str) -> None:
    started = time.perf_counter()
    message = refusal(sql, h2o_source)
    assert needle in message and "IOX_MAX_SQL_DEPTH" in message, message
    assert time.perf_counter() - started < 5


def test_a_column_named_like_a_refused_function_is_still_a_column() -> None:
    from iox_planner.ingest.scenario import parse_scenario

    source = scenario_source(parse_scenario({"chunks": [
        {"id": "F", "kind": "parquet", "table": "logins", "partition": "1970-01-01", "time": [1, 2], "rows": 1,
         "columns": {"user": "tag", "version": "float", "time": "time"}}]}))
    plan = plan_query("SELECT logins.user, max(version) AS v FROM logins GROUP BY logins.user "
                      "HAVING max(logins.user) > '' ORDER BY logins.user", source, now_ns=0)
    assert {"user", "version"} <= set(dict(plan.scans[0].columns))
    with pytest.raises(IoxError, match="(?i)session_user"):
        plan_query("SELECT logins.user FROM logins GROUP BY 1 HAVING max(session_user) > ''", source, now_ns=0)
    # `user` unqualified: Spark reads it as the session's user wherever its own block lacks the column (a
    # subquery's `user` even when the outer table has one: probe U04 printed `root`), so it must be qualified.
    for sql in ("SELECT user FROM logins",
                "SELECT (SELECT first(user) FROM logins) AS u FROM logins",
                "SELECT version FROM logins l WHERE l.user <> (SELECT max(`user`) FROM logins)",
                "SELECT max(version) AS v FROM logins GROUP BY ALL HAVING max(version) <> user"):
        with pytest.raises(IoxError, match=r"qualify it \(t\.user\)"):
            plan_query(sql, source, now_ns=0)


def test_nesting_up_to_the_limit_plans(h2o_source: Any) -> None:
    sql = "SELECT city FROM h2o WHERE " + "(" * 60 + "city = 'SF'" + ")" * 60
    plan_query(sql, h2o_source, now_ns=0)
    sql = "SELECT " + "abs(" * 60 + "min_temp" + ")" * 60 + " AS a FROM h2o"
    plan_query(sql, h2o_source, now_ns=0)


@pytest.mark.parametrize("shape", ["subquery", "function", "in"])
def test_nesting_up_to_the_highest_limit_plans(h2o_source: Any, monkeypatch: pytest.MonkeyPatch,
                                               shape: str) -> None:
    """At IOX_MAX_SQL_DEPTH=256 (the highest allowed), 250 levels plan: sqlglot's analysis recursed past
    Python's default stack at about 100."""
    monkeypatch.setenv("IOX_MAX_SQL_DEPTH", "256")
    d = 250
    sql = {"subquery": "SELECT city FROM " + "(SELECT city FROM " * d + "h2o" + ") s" * d,
           "function": "SELECT " + "abs(" * d + "min_temp" + ")" * d + " AS a FROM h2o",
           "in": "SELECT city FROM h2o WHERE " + "city IN (SELECT city FROM h2o WHERE " * 120 + "true" + ")" * 120,
           }[shape]
    plan_query(sql, h2o_source, now_ns=0)


def test_sql_over_the_size_limit_is_refused_before_parsing(h2o_source: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOX_MAX_SQL_BYTES", "1000")
    sql = "SELECT city FROM h2o WHERE city IN (" + ", ".join(f"'c{i}'" for i in range(500)) + ")"
    message = refusal(sql, h2o_source)
    assert "over the limit of 1,000" in message and "IOX_MAX_SQL_BYTES" in message, message
    assert len(message) < 300


def test_sql_over_the_node_limit_is_refused(h2o_source: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOX_MAX_SQL_NODES", "500")
    sql = "SELECT city FROM h2o WHERE city IN (" + ", ".join(f"'c{i}'" for i in range(500)) + ")"
    message = refusal(sql, h2o_source)
    assert "IOX_MAX_SQL_NODES" in message, message


@pytest.mark.parametrize("name, value", [("IOX_MAX_SQL_BYTES", "lots"), ("IOX_MAX_SQL_DEPTH", "100000"),
                                         ("IOX_MAX_SQL_NODES", "-1")])
def test_a_bad_limit_setting_is_an_error_naming_it(h2o_source: Any, monkeypatch: pytest.MonkeyPatch,
                                                  name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    assert name in refusal("SELECT city FROM h2o", h2o_source)


def _ors(n: int) -> str:
    return "SELECT city FROM h2o WHERE " + " OR ".join(f"city = 'c{i}'" for i in range(n))


def test_planning_many_ors_grows_near_linearly(h2o_source: Any) -> None:
    """2,000 ORs once planned in 3 s and 10,000 in over 5 minutes (quadratic). Compare 500 with 2,000 (4x the
    SQL): linear is 4x; quadratic was 16x; 8x is allowed. Measured in this process's CPU time, best of three taking
    turns: wall time on a machine shared with other test runs once made a linear planner look 10x."""
    plan_query(_ors(50), h2o_source, now_ns=0)  # warm up
    timings = {500: float("inf"), 2_000: float("inf")}
    for _ in range(3):
        for n in timings:
            started = time.process_time()
            plan = plan_query(_ors(n), h2o_source, now_ns=0)
            timings[n] = min(timings[n], time.process_time() - started)
            assert plan.spark_sql.count(" OR ") == n - 1
    assert timings[2_000] < 8 * timings[500] + 0.5, timings


@pytest.mark.skipif(not os.environ.get("IOX_HOSTILE_FULL"), reason="10,000 ORs take seconds: IOX_HOSTILE_FULL=1")
def test_ten_thousand_ors_plan_in_seconds(h2o_source: Any) -> None:
    started = time.perf_counter()
    plan_query(_ors(10_000), h2o_source, now_ns=0)
    assert time.perf_counter() - started < 60


def test_ands_and_ors_keep_their_meaning_when_rebalanced(h2o_source: Any) -> None:
    """A long AND chain pushes every conjunct, in order; a long OR stays one conjunct, operands in order."""
    ands = " AND ".join(f"city <> 'c{i}'" for i in range(50))
    plan = plan_query(f"SELECT city FROM h2o WHERE {ands}", h2o_source, now_ns=0)
    assert f"WHERE {ands}" in plan.spark_sql
    ors = " OR ".join(f"city = 'c{i}'" for i in range(50))
    plan = plan_query(f"SELECT city FROM h2o WHERE {ors}", h2o_source, now_ns=0)
    assert f"WHERE {ors}" in plan.spark_sql


def test_a_thousand_pushed_conjuncts_survive_the_plan_json(h2o_source: Any) -> None:
    """Each AND-conjunct is pushed into the scan; the plan JSON the Spark job reads parses them back (a left-deep
    chain of 1,000 ANDs once overflowed the stack there)."""
    from iox_planner.planner.serde import plan_from_json, plan_to_json

    ands = " AND ".join(f"city <> 'c{i}'" for i in range(1_000))
    plan = plan_query(f"SELECT city FROM h2o WHERE {ands}", h2o_source, now_ns=0)
    text = plan_to_json(plan)
    assert plan_to_json(plan_from_json(text)) == text
    assert text.count("<> 'c999'") >= 1


def test_an_error_quoting_a_huge_input_is_cut(h2o_source: Any) -> None:
    sql = "SELECT city FROM h2o WHERE city = " + "'" + "x" * 100_000 + "' AND nope_" + "y" * 100_000 + " = 1"
    message = refusal(sql, h2o_source)
    assert "message cut" in message and len(message) <= 2_000


def test_a_bad_parameter_value_is_one_paragraph(h2o_source: Any) -> None:
    sql = "SELECT city FROM h2o WHERE city = :c"
    assert "NUL" in refusal(sql, h2o_source, params={"c": "a\x00"})
    assert "not valid UTF-8" in refusal(sql, h2o_source, params={"c": "\udcff"})


# ---------------------------------------------------------------------------------------------------------------
# Allowed: ordinary functions plan (fast) and run (Spark)

ALLOWED_SQL = [
    "SELECT date_trunc('hour', time) AS h, count(*) AS n FROM h2o GROUP BY date_trunc('hour', time)",
    "SELECT coalesce(min_temp, max_temp, 0) AS t, round(max_temp, 1) AS r, ceil(max_temp) AS c FROM h2o",
    "SELECT concat(state, '/', city) AS k, upper(city) AS u, length(city) AS l, substring(city, 1, 2) AS s FROM h2o",
    "SELECT regexp_extract(city, '^(B)', 1) AS b, regexp_replace(city, 'o', '0') AS z, city RLIKE '^S' AS x FROM h2o",
    "SELECT state, percentile_approx(max_temp, 0.5) AS p, avg(max_temp) AS a, stddev(max_temp) AS sd FROM h2o "
    "GROUP BY state",
    "SELECT city, row_number() OVER (PARTITION BY state ORDER BY time, city) AS rn, "
    "lag(max_temp) OVER (PARTITION BY city ORDER BY time) AS prev FROM h2o",
    "SELECT city, sum(max_temp) OVER (PARTITION BY state ORDER BY time ROWS BETWEEN UNBOUNDED PRECEDING AND "
    "CURRENT ROW) AS run, rank() OVER (ORDER BY max_temp) AS rk, ntile(2) OVER (ORDER BY city) AS nt FROM h2o",
    "SELECT max_by(city, max_temp) AS hot, min_by(city, max_temp) AS cold, count_if(max_temp > 85) AS n, "
    "collect_set(state) AS states, approx_count_distinct(city) AS d FROM h2o",
    "SELECT cast(max_temp AS INT) AS i, try_cast(city AS INT) AS t, extract(YEAR FROM time) AS y, "
    "if(max_temp > 85, 'hot', 'ok') AS w, CASE WHEN area IS NULL THEN 0 ELSE 1 END AS a FROM h2o",
    "SELECT nvl(min_temp, -1) AS m, nullif(city, 'SF') AS c, greatest(min_temp, max_temp) AS g, "
    "least(min_temp, max_temp) AS l, abs(min_temp - max_temp) AS d FROM h2o",
    "SELECT date_format(time, 'yyyy-MM-dd') AS d, unix_micros(time) AS us, dayofweek(time) AS w, "
    "date_add(to_date(time), 1) AS n, timestamp_micros(0) AS z FROM h2o",
    "SELECT transform(array(min_temp, max_temp), v -> v * 2) AS arr, filter(array(1, 2, 3), v -> v > 1) AS f, "
    "aggregate(array(1, 2, 3), 0, (acc, v) -> acc + v) AS s, size(array(city, state)) AS n FROM h2o",
    "SELECT city, v FROM h2o LATERAL VIEW explode(array(min_temp, max_temp)) t AS v",
    "SELECT to_json(named_struct('c', city, 's', state)) AS j, md5(city) AS h, sha2(city, 256) AS h2, "
    "base64(city) AS b, hash(city) AS x FROM h2o",
    "SELECT get_json_object('{\"a\": 1}', '$.a') AS a, split(city, 'o')[0] AS p, lpad(city, 8, '*') AS l, "
    "format_number(max_temp, 1) AS f, now() AS t, current_date() AS d FROM h2o",
    "SELECT state, count(DISTINCT city) AS n, sum(max_temp) FILTER (WHERE city <> 'SF') AS s, "
    "first(city) AS f, any_value(city) AS a, max(time) AS latest FROM h2o GROUP BY state",
    "WITH w AS (SELECT city, max_temp, lead(max_temp) OVER (PARTITION BY city ORDER BY time) AS nxt FROM h2o) "
    "SELECT city, max(nxt - max_temp) AS rise FROM w GROUP BY city",
    "SELECT /*+ BROADCAST(b) */ a.city, b.state FROM h2o a JOIN h2o b ON a.city = b.city AND a.time = b.time",
    "SELECT '${env:HOME}' AS h, '${system:user.name}' AS u FROM h2o",
]


@pytest.mark.parametrize("sql", ALLOWED_SQL, ids=[f"a{i:02d}" for i in range(len(ALLOWED_SQL))])
def test_ordinary_functions_plan(h2o_source: Any, sql: str) -> None:
    plan_query(sql, h2o_source, now_ns=0)


H2O_CHUNKS = [
    {"id": "C4", "kind": "parquet", "lines": (
        "h2o,state=CA,city=SF min_temp=68.4,max_temp=85.7,area=500u 600\n"
        "h2o,state=CA,city=SJ min_temp=69.5,max_temp=89.2 600\n"
        "h2o,state=MA,city=Bedford max_temp=80.75,area=742u 400\n"
        "h2o,state=MA,city=Boston min_temp=65.40,max_temp=82.67 400\n")},
    {"id": "C5", "kind": "ingester", "lines": (
        "h2o,state=MA,city=Bedford max_temp=88.75,area=742u 600\n"
        "h2o,state=CA,city=SJ min_temp=75.5,max_temp=84.08 700\n")},
]


@pytest.fixture(scope="module")
def h2o_db(catalog: Any) -> str:
    import uuid

    from spark_support import load

    name = f"sec_{uuid.uuid4().hex[:10]}"
    load(catalog, name, H2O_CHUNKS)
    return name


@pytest.mark.spark
def test_ordinary_functions_run_on_spark(spark: Any, catalog: Any, h2o_db: str) -> None:
    from spark_support import run_jsonl

    for sql in ALLOWED_SQL:
        rows = run_jsonl(spark, catalog, h2o_db, sql)
        assert rows, sql
    rows = run_jsonl(spark, catalog, h2o_db, "SELECT round(max_temp, 0) AS r, upper(city) AS u, "
                     "regexp_extract(city, '^(S.)', 1) AS p FROM h2o WHERE city = 'SJ' ORDER BY time")
    assert rows == [{"r": 89.0, "u": "SJ", "p": "SJ"}, {"r": 84.0, "u": "SJ", "p": "SJ"}]


VARIABLES_SQL = ("SELECT '${env:HOME}' AS h, '${system:user.name}' AS u, '${spark:spark.app.name}' AS s, "
                 "'${hiveconf:x}' AS c, '${HOME}' AS b FROM h2o LIMIT 1")
VARIABLES_ROW = {"h": "${env:HOME}", "u": "${system:user.name}", "s": "${spark:spark.app.name}",
                 "c": "${hiveconf:x}", "b": "${HOME}"}


@pytest.mark.spark
def test_variable_substitution_is_off_in_process(spark: Any, catalog: Any, h2o_db: str) -> None:
    from spark_support import run_jsonl

    assert run_jsonl(spark, catalog, h2o_db, VARIABLES_SQL) == [VARIABLES_ROW]


@pytest.mark.spark
@pytest.mark.slow
def test_variable_substitution_is_off_through_spark_submit(catalog: Any, h2o_db: str) -> None:
    result = run_cli("query", "--db", h2o_db, VARIABLES_SQL, "--format", "jsonl",
                     env={"IOX_RUNNER": "spark-submit"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert [json.loads(line) for line in result.stdout.splitlines()] == [VARIABLES_ROW]


# ---------------------------------------------------------------------------------------------------------------
# Through the real CLI, against the real catalog: refused, one paragraph, nothing written anywhere

PWNED = Path("/tmp/iox_sec_pwned")
CLI_CASES = [
    (["query"], f"SELECT reflect('org.apache.spark.util.Utils', 'checkCommandAvailable', "
                f"'x; id > {PWNED}') FROM h2o", "reflect"),
    (["query"], f"SELECT `reflect`('org.apache.spark.util.Utils', 'checkCommandAvailable', "
                f"'x; touch {PWNED}') FROM h2o", "reflect"),
    (["query"], "SELECT `JAVA_METHOD`('org.apache.spark.util.Utils', 'getPropertiesFromFile', '/etc/passwd') "
                "FROM h2o", "JAVA_METHOD"),
    (["query"], f"SELECT `try_reflect`('org.apache.spark.util.Utils', 'checkCommandAvailable', "
                f"'x; id > {PWNED}') FROM h2o", "try_reflect"),
    (["query"], f"SELECT `system`.`builtin`.`reflect`('org.apache.spark.util.Utils', 'checkCommandAvailable', "
                f"'x; id > {PWNED}') FROM h2o", "qualified"),
    (["query"], "SELECT `input_file_name`() FROM h2o", "input_file_name"),
    (["query"], "SELECT ${env:HOME} FROM h2o", "variable"),
    (["query"], "SELECT MAP(city) USING 'id' FROM h2o", "external script"),
    (["query"], f"SELECT TRANSFORM(city) USING 'touch {PWNED}' FROM h2o", "external script"),
    (["query"], "SELECT * FROM text.`/etc/passwd`", "only catalog tables"),
    (["query"], "SELECT IDENTIFIER('__time_ns') FROM h2o", "IDENTIFIER"),
    (["explain", "--analyze"], f"SELECT city FROM h2o WHERE `reflect`('org.apache.spark.util.Utils', "
                               f"'checkCommandAvailable', 'x; id > {PWNED}') IS NOT NULL", "reflect"),
    (["explain", "--analyze"], "SELECT city FROM h2o WHERE java_method('java.lang.System', 'getenv', 'HOME') "
                               "IS NOT NULL", "java_method"),
    (["explain", "--analyze"], "SELECT * FROM h2o LATERAL VIEW reflect('java.lang.System', 'getenv', 'HOME') "
                               "t AS x", "reflect"),
    # issue 31: sizes and patterns that took the shared server down, refused before Spark runs
    (["query"], "SELECT /*+ REPARTITION(2147483647) */ count(*) AS c FROM h2o", "IOX_MAX_HINT_PARTITIONS"),
    (["query"], "SELECT count_min_sketch(city, 0.00000001D, 0.9D, 1) AS s FROM h2o", "count_min_sketch"),
    (["query"], "SELECT city FROM h2o WHERE regexp_like(concat(repeat('a,', 40), city), '(.*,){11}P')",
     "regular expression"),
]


@pytest.mark.parametrize("command, sql, name", CLI_CASES, ids=[f"cli{i:02d}" for i in range(len(CLI_CASES))])
def test_the_cli_refuses_and_leaves_nothing_behind(h2o_db: str, untouched: Any, command: list[str], sql: str,
                                                   name: str) -> None:
    PWNED.unlink(missing_ok=True)
    output = untouched.canary / "out.jsonl"
    extra = ["--format", "jsonl", "--output", str(output)] if command == ["query"] else []
    result = run_cli(*command, "--db", h2o_db, sql, *extra, env={"IOX_RUNNER": "in-process"})
    assert_one_paragraph_error(result)
    assert name.lower() in result.stderr.lower(), result.stderr
    assert not PWNED.exists()
    assert not output.exists()
    untouched.check()


def test_the_cli_refuses_invalid_utf8_in_argv(h2o_db: str, untouched: Any) -> None:
    import subprocess
    import sys

    exe = Path(sys.executable).parent / "iox-batch"
    for argv in ([b"query", b"--db", h2o_db.encode(), b"SELECT city FROM h2o WHERE city = '\xff\xfe'"],
                 [b"query", b"--db", h2o_db.encode(), b"SELECT city FROM h2o WHERE city = :c", b"--param",
                  b"c=\xc3\x28"]):
        result = subprocess.run([str(exe).encode(), *argv], capture_output=True, text=True, timeout=300,
                                env={**os.environ, "LC_ALL": "C.UTF-8"})
        assert_one_paragraph_error(result, "not valid UTF-8")
    untouched.check()


def test_sql_file_reads_a_query_and_checks_it(h2o_db: str, tmp_path: Path, untouched: Any) -> None:
    path = tmp_path / "q.sql"
    path.write_bytes(b"SELECT city FROM h2o WHERE city = 'SF'\n")
    result = run_cli("explain", "--db", h2o_db, "--sql-file", str(path))
    assert result.returncode == 0, result.stderr
    assert "city = 'SF'" in result.stdout
    result = run_cli("explain", "--db", h2o_db, "--sql-file", "-", stdin="SELECT state FROM h2o")
    assert result.returncode == 0, result.stderr
    result = run_cli("explain", "--db", h2o_db, "--sql-file", str(path), "SELECT 1")
    assert_one_paragraph_error(result, "not both")
    result = run_cli("query", "--db", h2o_db)
    assert_one_paragraph_error(result, "--sql-file")
    path.write_bytes(b"SELECT city FROM h2o WHERE city = '\xff'")
    assert_one_paragraph_error(run_cli("explain", "--db", h2o_db, "--sql-file", str(path)),
                               "not valid UTF-8", "0xff")
    assert_one_paragraph_error(run_cli("explain", "--db", h2o_db, "--sql-file", str(tmp_path / "missing.sql")),
                               "cannot read")
    untouched.check()


def test_sql_file_takes_a_megabyte_query_up_to_the_limit(h2o_db: str, tmp_path: Path) -> None:
    """A 1 MB query (a long IN list) fits the default limit; one byte more than the limit is refused."""
    from iox_planner.config import MAX_SQL_BYTES

    limit = MAX_SQL_BYTES.default

    # IN lists of at most IOX_MAX_SQL_LIST values each, ORed.
    head, tail = "SELECT count(*) AS n FROM h2o WHERE city IN (", ")"
    items, size = [], len(head) + len(tail)
    i = 0
    while size < limit - 40:
        item = f"'c{i:08d}', " if (i + 1) % 5_000 else f"'c{i:08d}') OR city IN ("
        items.append(item)
        size += len(item)
        i += 1
    sql = head + "".join(items) + "'SF'" + tail
    assert 1_000_000 < len(sql) <= limit
    path = tmp_path / "big.sql"
    path.write_text(sql)
    result = run_cli("explain", "--db", h2o_db, "--sql-file", str(path), "--format", "json")
    assert result.returncode == 0, result.stderr[-2000:]
    path.write_text(sql + " " * (limit - len(sql) + 1))
    assert_one_paragraph_error(run_cli("explain", "--db", h2o_db, "--sql-file", str(path)),
                               "IOX_MAX_SQL_BYTES")


def test_a_huge_error_is_cut_at_the_cli(h2o_db: str) -> None:
    sql = "SELECT nope_" + "x" * 200_000 + " FROM h2o"
    result = run_cli("explain", "--db", h2o_db, "--sql-file", "-", stdin=sql)
    assert_one_paragraph_error(result, "message cut")
    assert len(result.stderr) < 2_100


SPARK_ERRORS = [
    ("SELECT CAST(city AS INT) AS n FROM h2o", "[CAST_INVALID_INPUT]"),
    ("SELECT array_contains(city, 1) AS x FROM h2o", "[DATATYPE_MISMATCH"),
    ("SELECT a.city FROM h2o a JOIN h2o b ON a.time = b.time WHERE a.city + 1 > b.state", "["),
    ("SELECT 1 / 0 AS x FROM h2o", "[DIVIDE_BY_ZERO]"),
]


@pytest.mark.spark
def test_a_spark_error_keeps_its_class_and_drops_the_plan(spark: Any, catalog: Any, h2o_db: str) -> None:
    from iox_planner.catalog.store import CatalogSource
    from iox_planner.cli.runner import run
    from iox_planner.output import OutputFormat

    for sql, error_class in SPARK_ERRORS:
        plan = plan_query(sql, CatalogSource(catalog, h2o_db))
        with pytest.raises(IoxError) as caught:
            run(plan, OutputFormat.JSONL, None, io.StringIO())
        message = str(caught.value)
        assert message.startswith("the query failed on Spark: " + error_class), message
        for internal in ("__iox_scan_", "__time_ns", "__iox_ns_", "MapInArrow", "Project [", "\n", "SQLSTATE",
                         "SubqueryAlias", "== SQL"):
            assert internal not in message, (sql, message)
        assert len(message) < 800, message


def test_no_configuration_turns_variable_substitution_back_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from iox_planner.spark.conf import session_conf

    monkeypatch.setenv("IOX_SPARK_CONF", "spark.sql.variable.substitute=true")
    assert session_conf()["spark.sql.variable.substitute"] == "false"
    assert session_conf({"spark.sql.variable.substitute": "true"})["spark.sql.variable.substitute"] == "false"



CTE_CHAIN = ("WITH t0 AS (SELECT * FROM h2o), "
             + ", ".join(f"t{n} AS (SELECT * FROM t{n - 1})" for n in range(1, 30)) + " SELECT count(*) AS n FROM t29")


@pytest.mark.spark
@pytest.mark.parametrize(("sql", "words"), [
    # The probe's endless recursion ended "Exception thrown in awaitResult:", which says nothing of why.
    ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) AS c FROM r",
     "the query failed on Spark: WITH RECURSIVE did not end: its recursive part was still producing rows after "
     "5 levels, Spark's bound on a recursive query. Give the recursive part a condition that stops it"),
    # A chain of WITH queries each reading the one before ended in Spark's "Max iterations (100) reached".
    (CTE_CHAIN, "the query failed on Spark: the query is nested too deeply for Spark's analyzer, which gave up "
                "after 10 rounds of resolution"),
])
def test_a_query_too_deep_for_spark_says_what_is_wrong(spark: Any, catalog: Any, h2o_db: str, sql: str,
                                                       words: str) -> None:
    """Spark's bounds lowered for the test's time (100 levels took 12 s, a chain of 150 WITH queries 7 s): the
    errors are the same."""
    from iox_planner.catalog.store import CatalogSource
    from iox_planner.cli.runner import run
    from iox_planner.errors import BadQueryError
    from iox_planner.output import OutputFormat

    plan = plan_query(sql, CatalogSource(catalog, h2o_db))
    bounds = {"spark.sql.cteRecursionLevelLimit": "5", "spark.sql.analyzer.maxIterations": "10"}
    before = {key: spark.conf.get(key) for key in bounds}
    try:
        for key, value in bounds.items():
            spark.conf.set(key, value)
        with pytest.raises(BadQueryError) as caught:
            run(plan, OutputFormat.JSONL, None, io.StringIO())
    finally:
        for key, value in before.items():
            spark.conf.set(key, value)
    assert str(caught.value).startswith(words), str(caught.value)
    assert "\n" not in str(caught.value) and "awaitResult" not in str(caught.value)
