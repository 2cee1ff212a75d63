"""Issue 31, item 3 (the planner's side): no query can take the shared Spark server down by size.

Every allowed function is classified by what its arguments size (`planner/sizing.py`); constant sizes are checked
when planning, sizes from the data are guarded at run time (`sql/guards.py`), partitioning hints are bounded, and
regular expressions must be literals that cannot backtrack for ever (`planner/regex.py`). The guard is checked on
the shared in-process Spark session: the same rows within bounds, one paragraph past them (`IOX_SIZING_FULL=1`
runs every guarded call past its bound; CI runs two).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from iox_planner.errors import BadQueryError, IoxError
from iox_planner.ingest.scenario import read_scenario, scenario_source
from iox_planner.planner import plan_query
from iox_planner.planner.functions import ALLOWED
from iox_planner.planner.regex import REGEX_ARGUMENTS, pattern_problem
from iox_planner.planner.sizing import SIZED, UNSIZED, Bound

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def h2o_source() -> Any:
    return scenario_source(read_scenario(str(ROOT / "examples" / "h2o.yaml")))


def refusal(sql: str, source: Any) -> str:
    with pytest.raises(IoxError) as caught:
        plan_query(sql, source, now_ns=0)
    message = str(caught.value)
    assert "\n" not in message and len(message) <= 2_000, message[:300]
    return message


# ---------------------------------------------------------------------------------------------------------------
# The classification covers the allow-list


def test_every_allowed_function_is_classified_once() -> None:
    assert not set(SIZED) & UNSIZED
    assert set(SIZED) | UNSIZED == ALLOWED, (sorted(ALLOWED - set(SIZED) - UNSIZED),
                                            sorted((set(SIZED) | UNSIZED) - ALLOWED))


def test_the_size_setting_functions_the_issue_names_are_sized() -> None:
    named = """count_min_sketch histogram_numeric approx_percentile percentile_approx approx_count_distinct
        hll_sketch_agg kll_sketch_agg_bigint theta_sketch_agg tuple_sketch_agg_double array_insert sequence
        format_string printf lpad rpad randstr space repeat array_repeat""".split()
    assert [n for n in named if n not in SIZED] == []
    assert SIZED["format_string"].bound is Bound.LITERAL and SIZED["repeat"].bound is Bound.GUARDED


def test_every_regex_taking_function_is_allowed_and_listed() -> None:
    spark_regex = """rlike regexp regexp_like regexp_replace regexp_extract regexp_extract_all regexp_count
        regexp_instr regexp_substr split str_to_map""".split()
    assert sorted(REGEX_ARGUMENTS) == sorted(spark_regex)
    assert set(REGEX_ARGUMENTS) <= ALLOWED


# ---------------------------------------------------------------------------------------------------------------
# Refused when planning

REFUSED = [
    ("SELECT count_min_sketch(city, 0.00000001D, 0.9D, 1) AS s FROM h2o", "800,000,000 sketch cells"),
    ("SELECT max(length(format_string(concat('%', CAST(area AS INT) * 1000000, 's'), city))) AS n FROM h2o",
     "must be one string literal"),
    ("SELECT format_string(city, 1) AS s FROM h2o", "must be one string literal"),
    ("SELECT approx_count_distinct(city, 0.0001) AS n FROM h2o", "134,217,728 HyperLogLog registers"),
    ("SELECT histogram_numeric(max_temp, 100000000) AS h FROM h2o", "100,000,000 histogram bins"),
    ("SELECT histogram_numeric(max_temp, CAST(area AS INT)) AS h FROM h2o", "must be a constant"),
    ("SELECT approx_percentile(max_temp, 0.5, 2147483647) AS p FROM h2o", "summary entries"),
    ("SELECT theta_sketch_agg(city, 26) AS s FROM h2o", "67,108,864 sketch entries"),
    ("SELECT tuple_sketch_agg_double(city, max_temp, 25, 'sum') AS s FROM h2o", "sketch entries"),
    ("SELECT randstr(CAST(area AS INT)) AS s FROM h2o", "must be a constant"),
    ("SELECT format_number(max_temp, 100000000) AS s FROM h2o", "100,000,000 digits"),
    ("SELECT /*+ REPARTITION(2147483647) */ count(*) AS c FROM h2o", "IOX_MAX_HINT_PARTITIONS"),
    ("SELECT /*+ REPARTITION(3000000) */ count(*) AS c FROM h2o", "3,000,000 partitions"),
    ("SELECT /*+ COALESCE((5000)) */ count(*) AS c FROM h2o", "5,000 partitions"),
    ("SELECT /*+ REPARTITION_BY_RANGE(100000, city) */ count(*) AS c FROM h2o", "100,000 partitions"),
    ("SELECT /*+ REBALANCE(100000) */ count(*) AS c FROM h2o", "100,000 partitions"),
    ("SELECT city FROM h2o WHERE regexp_like(concat(repeat('a,', 40), city), '(.*,){11}P')", "nested quantifiers"),
    ("SELECT city FROM h2o WHERE regexp_like(repeat(concat(state, ','), 40), '(.*,){11}P')", "nested quantifiers"),
    ("SELECT city FROM h2o WHERE city RLIKE '(a|ab)*c'", "alternation"),
    ("SELECT city FROM h2o WHERE city REGEXP '.*a.*a.*b'", "in a row"),
    ("SELECT city FROM h2o WHERE city RLIKE concat('^', state)", "must be one string literal"),
    ("SELECT regexp_replace(city, '(a)\\\\1', 'x') AS r FROM h2o", "backreference"),
    ("SELECT split(city, '(x+x+)+y') AS s FROM h2o", "nested quantifiers"),
    ("SELECT str_to_map(city, ',', '(?=a)') AS m FROM h2o", "lookaround"),
    ("SELECT regexp_extract(city, :p, 0) AS r FROM h2o", "must be one string literal"),
    ("SELECT sequence(CAST(area AS DOUBLE), 5) AS s FROM h2o", "takes integers"),
    ("SELECT city FROM h2o WHERE city LIKE '%a%a%a%b'", "LIKE pattern"),
    ("SELECT repeat(city, (SELECT max(CAST(area AS INT)) FROM h2o)) AS r FROM h2o", "computed by a subquery"),
    ("SELECT city FROM h2o WHERE city NOT ILIKE '%a%b%c%d' ESCAPE '!'", "LIKE pattern"),
    # A LIKE pattern that is not one literal is a regex Spark compiles at run time (each kept a core for minutes)
    ("SELECT city FROM h2o WHERE repeat('a', 3000) LIKE concat('%a%a%a%a%a', '%a%a%a%b')", "must be one string"),
    ("SELECT city FROM h2o WHERE repeat('a', 3000) ILIKE concat('%a%a%a%a%a', '%a%a%a%b')", "must be one string"),
    ("SELECT city FROM h2o WHERE city LIKE state", "must be one string literal"),
    ("SELECT city FROM h2o WHERE city LIKE :p", "must be one string literal"),
    ("SELECT city FROM h2o WHERE repeat('a', 3000) LIKE ANY ('%a%a%a%a%a%a%a%a%b', 'x')", "LIKE pattern"),
    ("SELECT city FROM h2o WHERE city NOT ILIKE ALL ('x%', '%a%a%a%b')", "LIKE pattern"),
    ("SELECT city FROM h2o WHERE city LIKE SOME ('x%', concat('%', state))", "must be one string literal"),
]


@pytest.mark.parametrize("sql, needle", REFUSED, ids=[f"refused{i:02d}" for i in range(len(REFUSED))])
def test_a_size_or_pattern_that_could_take_the_server_is_refused(h2o_source: Any, sql: str, needle: str) -> None:
    try:
        plan_query(sql, h2o_source, now_ns=0, params={"p": "(a+)+"} if ":p" in sql else None)
    except IoxError as err:
        message = str(err)
        assert needle in message, message
        assert "\n" not in message and len(message) <= 2_000
    else:
        pytest.fail(f"planned: {sql}")


EVERYDAY = [
    "SELECT city FROM h2o WHERE city RLIKE '^cpu[0-9]+$'",
    "SELECT city FROM h2o WHERE regexp_like(city, 'host_(a|b)')",
    "SELECT city FROM h2o WHERE city RLIKE '.*foo.*'",
    "SELECT city FROM h2o WHERE regexp_like(city, '[a-z]+@[a-z]+\\\\.com')",
    "SELECT regexp_extract(city, '^(S.)', 1) AS p, split(city, ',') AS s, str_to_map('a:1,b:2') AS m FROM h2o",
    "SELECT regexp_replace(city, '\\\\s+', ' ') AS r, regexp_count(city, '[aeiou]') AS n FROM h2o",
    "SELECT /*+ REPARTITION(8), COALESCE(2) */ count(*) AS c FROM h2o",
    "SELECT /*+ REPARTITION(4, city), BROADCAST(h2o) */ count(*) AS c FROM h2o",
    "SELECT count_min_sketch(city, 0.001D, 0.99D, 1) AS s, approx_count_distinct(city, 0.01) AS n FROM h2o",
    "SELECT approx_percentile(max_temp, 0.5, 10000) AS p, histogram_numeric(max_temp, 20) AS h FROM h2o",
    "SELECT hll_sketch_agg(city, 21) AS h, theta_sketch_agg(city, 12) AS t, kll_sketch_agg_double(max_temp, 200) "
    "AS k, approx_top_k(city, 5, 10000) AS a FROM h2o",
    "SELECT format_string('%-10s|%5.1f', city, max_temp) AS s, format_number(max_temp, '#,###.#') AS f FROM h2o",
    "SELECT sequence(1, 10) AS s, repeat(city, 3) AS r, lpad(city, 10, '*') AS p FROM h2o",
    "SELECT city FROM h2o WHERE city LIKE '%foo%bar%' OR city ILIKE 'b_s%' OR city RLIKE '.*foo.*bar.*'",
    "SELECT city FROM h2o WHERE city LIKE ANY ('S%', '%ton') AND city NOT ILIKE ALL ('x%', '%y')",
]


@pytest.mark.parametrize("sql", EVERYDAY, ids=[f"everyday{i:02d}" for i in range(len(EVERYDAY))])
def test_everyday_sizes_patterns_and_hints_plan_unchanged(h2o_source: Any, sql: str) -> None:
    plan = plan_query(sql, h2o_source, now_ns=0)
    assert plan.spark_sql == sql.replace("FROM h2o", "FROM __iox_scan_0 AS h2o")
    assert not any("guard" in note for note in plan.notes)


def test_the_hint_limit_is_a_setting(h2o_source: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOX_MAX_HINT_PARTITIONS", "10")
    assert plan_query("SELECT /*+ REPARTITION(10) */ count(*) AS c FROM h2o", h2o_source, now_ns=0)
    assert "over the limit of 10" in refusal("SELECT /*+ REPARTITION(11) */ count(*) AS c FROM h2o", h2o_source)


CATASTROPHIC = [r"\w*\w*\w*\s", r".*a.*b.*$", r"(.*a.*b.*)",
                r"(.*,){11}P", r"(a+)+$", r"(a*)*b", r"(a|aa)+$", r"(a|a?)+", r"(\w+\s?)+$", r"(x+x+)+y",
                r"^(([a-z])+.)+[A-Z]([a-z])+$", r"(\d+)*$", r"(a?){30}a{30}", r"(.*,)(.*,)(.*,)P", r".*a.*a.*b",
                r"(\w|\d)+$", r"(a)\1", r"(?<n>a)\k<n>", r"(?=a)b", r"(?<!a)b", r"(?x) (a+)+", r"[]a]",
                r"a{1,100000}", r"(?i)(a|A)+", "(.*){1,32000}[bc]", r"^(\w+\s?)*$", r"(([a-z])+.)+[A-Z]([a-z])+$",
                r"^([a-zA-Z0-9])(([\-.]|[_]+)?([a-zA-Z0-9]+))*(@){1}[a-z0-9]+[.]{1}(([a-z]{2,3})|([a-z]{2,3}[.]{1}"
                r"[a-z]{2,3}))$", "x" * 1001, r"\Q(a+)+\E(a+)+", r"(", r"a{"]
SAFE = [r".*foo.*bar.*", r"^cpu[0-9]+$", r"host_(a|b)", r".*foo.*", r"[a-z]+@[a-z]+\.com", r"^\w+\s+\w+\s+\w+$",
        r"^[0-9]{1,3}(\.[0-9]{1,3}){3}$", r"(?i)^cpu", r"\Q(a+)+\E", r"[\w.-]+", r"^(?:us|eu)-[a-z]+-\d+$",
        r"\p{L}+", r"[^,]+", r"\d{4}-\d{2}-\d{2}", r"(https?://)?[a-z.]+", r"[a-z[0-9]]+", r"(a|b)*c", r"\bword\b",
        r"x*+y", r".*?foo", ",", ":"]


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_known_catastrophic_patterns_are_refused(pattern: str) -> None:
    assert pattern_problem(pattern) is not None


@pytest.mark.parametrize("pattern", SAFE)
def test_everyday_patterns_pass(pattern: str) -> None:
    assert pattern_problem(pattern) is None


# ---------------------------------------------------------------------------------------------------------------
# Guards at run time

GUARDED = [
    "SELECT city, repeat(city, CAST(area AS INT) % 4) AS r, lpad(city, length(city) + 3, '*') AS l, "
    "rpad(state, CAST(area AS INT) % 7, '-') AS p, array_repeat(state, length(city)) AS a, space(length(state)) AS s, "
    "array_insert(array(1, 2), length(city), 9) AS i, sequence(1, CAST(area AS INT) % 5) AS q, "
    "sequence(length(city), 1, -1) AS d, "
    "sequence(to_date('2024-01-01'), date_add(to_date('2024-01-01'), length(city))) AS t FROM h2o",
    "SELECT city, x FROM h2o LATERAL VIEW explode(sequence(1, CAST(area AS INT) % 3)) e AS x",
    "SELECT city, repeat(city, count(city)) AS r, lpad(city, row_number() OVER (ORDER BY city) + 1, '*') AS l "
    "FROM h2o GROUP BY city HAVING length(repeat(city, count(city))) > 1",
]


def test_a_size_from_the_data_gets_a_guard_shown_as_a_note(h2o_source: Any) -> None:
    from iox_planner.planner.explain import render_tree
    from iox_planner.planner.sql.guards import GUARD_MARKER

    plan = plan_query("SELECT repeat(city, CAST(area AS INT)) FROM h2o", h2o_source, now_ns=0)
    assert GUARD_MARKER in plan.spark_sql and "transform(array(CAST(area AS INT))" in plan.spark_sql
    assert plan.naming_sql == "SELECT repeat(city, CAST(area AS INT)) FROM __iox_scan_0 AS h2o"
    assert "note: run-time guard: the size of repeat(...)" in render_tree(plan)


@pytest.fixture(scope="module")
def h2o_db(catalog: Any) -> str:
    import uuid

    from spark_support import load

    name = f"siz_{uuid.uuid4().hex[:10]}"
    import yaml

    load(catalog, name, yaml.safe_load((ROOT / "examples" / "h2o.yaml").read_text())["chunks"])
    return name


def _run(plan: Any) -> list[dict[str, Any]]:
    """The rows of `plan` as the in-process runner gives them (jsonl), the way `spark_support.run_jsonl` runs
    a query, but for a plan built here."""
    from iox_planner.cli.runner import print_result
    from iox_planner.output import OutputFormat
    from iox_planner.planner.serde import plan_to_json
    from iox_planner.spark.budget import query_timeout_s
    from iox_planner.spark.jobs import PlanJob
    from spark_jobs.launch import InProcessLauncher

    out = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="iox-test-") as tmp:
        plan_file = Path(tmp) / "plan.json"
        plan_file.write_text(plan_to_json(plan))
        table = InProcessLauncher().fetch(PlanJob(plan_file, Path(tmp) / "result.arrow", OutputFormat.ARROW,
                                                  query_timeout_s()))
    print_result(table, OutputFormat.JSONL, out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.mark.spark
def test_a_guard_never_changes_rows_within_bounds(spark: Any, catalog: Any, h2o_db: str) -> None:
    from iox_planner.catalog.store import CatalogSource
    from iox_planner.planner.sql.guards import GUARD_MARKER

    for sql in GUARDED:
        plan = plan_query(sql, CatalogSource(catalog, h2o_db))
        assert GUARD_MARKER in plan.spark_sql, sql
        # the same query without the guard: the user's text with only the view swapped in
        bare = dataclasses.replace(plan, spark_sql=sql.replace("FROM h2o", "FROM __iox_scan_0 AS h2o"),
                                   naming_sql=None)
        guarded, unguarded = _run(plan), _run(bare)
        assert guarded and sorted(map(json.dumps, guarded)) == sorted(map(json.dumps, unguarded)), sql


@pytest.mark.spark
def test_a_size_from_the_data_past_the_limit_fails_alone_with_one_paragraph(spark: Any, catalog: Any,
                                                                           h2o_db: str) -> None:
    from iox_planner.catalog.store import CatalogSource

    cases = [
        ("SELECT max(size(array_insert(array(1), CAST(area AS INT) * 1000000, 2))) AS n FROM h2o", "array_insert"),
        ("SELECT length(string_agg(repeat(city, 10), ',')) AS n FROM h2o "
         "LATERAL VIEW explode(sequence(1, CAST(area AS INT) * 100000)) e AS x", "sequence"),
        ("SELECT max(length(repeat(city, CAST(area AS INT) * 1000000))) AS n FROM h2o", "repeat"),
    ]
    for sql, call in cases if os.environ.get("IOX_SIZING_FULL") else cases[:2]:
        plan = plan_query(sql, CatalogSource(catalog, h2o_db))
        with pytest.raises(BadQueryError) as caught:
            _run(plan)
        message = str(caught.value)
        assert message.startswith(f"the query stopped at a size guard: {call}(...) was given a size computed "
                                   "from the data"), message
        assert "IOX_MAX_SQL_ALLOC" in message and "\n" not in message and "SQLSTATE" not in message, message
    # the next query is served
    [row] = _run(plan_query("SELECT count(*) AS c FROM h2o", CatalogSource(catalog, h2o_db)))
    assert row["c"] > 0


@pytest.mark.spark
def test_the_gate_reads_guards_patterns_and_hints_as_spark_does(spark: Any) -> None:
    from iox_planner.errors import UnsupportedError
    from iox_planner.planner.sql.guards import GUARD_MARKER
    from spark_jobs.gate import check_query_text

    def gate(text: str) -> None:
        check_query_text(spark, text, ["__iox_scan_0"], ["city"])

    gate(f"SELECT raise_error('{GUARD_MARKER}x') FROM __iox_scan_0")
    gate("SELECT /*+ REPARTITION(8) */ city FROM __iox_scan_0 WHERE city RLIKE '^B[a-z]+$' AND city LIKE '%B%d%'")
    for text, needle in [
        ("SELECT raise_error('boom') FROM __iox_scan_0", "raise_error"),
        ("SELECT raise_error(concat('" + GUARD_MARKER + "', city)) FROM __iox_scan_0", "raise_error"),
        ("SELECT /*+ REPARTITION(3000000) */ city FROM __iox_scan_0", "IOX_MAX_HINT_PARTITIONS"),
        ("SELECT city FROM __iox_scan_0 WHERE city RLIKE '(.*,){11}P'", "nested quantifiers"),
        ("SELECT city FROM __iox_scan_0 WHERE regexp_like(city, concat('a', city))", "one string literal"),
        ("SELECT split(city, '(x+x+)+y') FROM __iox_scan_0", "nested quantifiers"),
        ("SELECT city FROM __iox_scan_0 WHERE city LIKE '%a%a%a%b'", "LIKE pattern"),
    ]:
        with pytest.raises((UnsupportedError, BadQueryError)) as caught:
            gate(text)
        assert needle in str(caught.value), (text, str(caught.value))


@pytest.mark.spark
@pytest.mark.skipif(not os.environ.get("IOX_SIZING_FULL"), reason="a CLI process with its own JVM: IOX_SIZING_FULL=1")
def test_the_cli_exits_2_with_one_paragraph_at_a_guard(h2o_db: str) -> None:
    from common_support import assert_one_paragraph_error, run_cli

    result = run_cli("query", "--db", h2o_db, "--timeout", "120", "--format", "jsonl",
                     "SELECT max(size(array_insert(array(1), CAST(area AS INT) * 1000000, 2))) AS n FROM h2o",
                     env={"IOX_RUNNER": "in-process"})
    assert_one_paragraph_error(result, "size guard: array_insert(...)", "IOX_MAX_SQL_ALLOC")
    assert result.returncode == 2, result.stderr
