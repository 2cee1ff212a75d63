"""The planner's public surface: settings, renderings, the plan JSON the executor reads, the Spark SQL it runs."""

from __future__ import annotations

import json

import pytest
import yaml

from iox_planner.errors import BadInputError, InternalError
from iox_planner.model import CHUNK_ORDER, Chunk, ChunkKind, ColumnType, StaticSource
from iox_planner.planner import (
    PASSES, DeduplicateExec, EmptyExec, ParquetExec, PlannerSettings, ProjectionExec, QueryPlan, SortItem,
    UnionExec, plan_query, render,
)
from iox_planner.planner.context import PassContext
from iox_planner.planner.explain import render_tree
from iox_planner.planner.predicate import parse_predicate, predicate_sql
from iox_planner.planner.serde import plan_from_json, plan_to_json
from iox_planner.planner.settings import parse_overrides

COLUMNS = {"state": ColumnType.TAG, "city": ColumnType.TAG, "temp": ColumnType.FLOAT, "n": ColumnType.UNSIGNED,
           "time": ColumnType.TIME}
NOW = 1_704_067_200_123_456_789  # 2024-01-01T00:00:00.123456789Z


BASE = 1_704_067_200 * 10**9  # 2024-01-01T00:00:00Z


def chunk(cid: str, lo: int, hi: int, kind: ChunkKind = ChunkKind.PARQUET, **extra: object) -> Chunk:
    """A chunk over [BASE + lo, BASE + hi]."""
    return Chunk(cid, kind, "h2o", "2024-01-01", int(cid[1:]), BASE + lo, BASE + hi, COLUMNS,
                 **extra)  # type: ignore[arg-type]


SOURCE = StaticSource((chunk("F1", 1, 10), chunk("F2", 5, 15, tag_ranges={"state": ("CA", "MA")}, rows=3),
                       chunk("I3", 12, 20, ChunkKind.INGESTER), chunk("F4", 30, 40, store="s3://b")))


# --- settings --------------------------------------------------------------------------------------------------

def test_settings_defaults() -> None:
    s = PlannerSettings()
    assert (s.target_partitions, s.max_dedup_partition_split, s.max_dedup_time_split, s.max_parquet_fanout) == (
        4, 10_000, 100, 40)


def test_settings_from_environment_then_overrides() -> None:
    env = {"IOX_TARGET_PARTITIONS": "8", "IOX_MAX_PARQUET_FANOUT": "12", "IOX_UNRELATED": "x"}
    s = PlannerSettings.from_env({"target_partitions": "2"}, environ=env)
    assert (s.target_partitions, s.max_parquet_fanout) == (2, 12)
    assert PlannerSettings.from_env(parse_overrides(["max_dedup_time_split=7"]), environ={}).max_dedup_time_split == 7


@pytest.mark.parametrize(("overrides", "env", "fragment"), [
    ({"target_partition": "2"}, {}, "valid settings: target_partitions, max_dedup_partition_split"),
    ({"target_partitions": "two"}, {}, "target_partitions takes a whole number from 1 to 10,000"),
    ({"target_partitions": "0"}, {}, "target_partitions takes a whole number from 1"),
    ({}, {"IOX_MAX_DEDUP_TIME_SPLIT": "-1"}, "IOX_MAX_DEDUP_TIME_SPLIT"),
])
def test_bad_settings_name_the_valid_ones(overrides: dict[str, str], env: dict[str, str], fragment: str) -> None:
    with pytest.raises(BadInputError, match=fragment):
        PlannerSettings.from_env(overrides, environ=env)


def test_set_without_equals() -> None:
    with pytest.raises(BadInputError, match="not name=value"):
        parse_overrides(["target_partitions"])


# --- the plan JSON -----------------------------------------------------------------------------------------------

def complex_plan() -> QueryPlan:
    return plan_query(
        "SELECT a.city, b.temp, a.time FROM h2o a LEFT JOIN h2o b ON a.city = b.city "
        "WHERE a.state = :s AND a.time > now() - INTERVAL 1 DAY AND b.n > 3",
        SOURCE, params={"s": "MA"}, time_start=0, time_end=2 * 10**18, now_ns=NOW,
        settings=PlannerSettings(max_dedup_time_split=1))


def test_json_round_trips_exactly() -> None:
    plan = complex_plan()
    assert plan_from_json(plan_to_json(plan)) == plan
    assert plan_from_json(json.loads(render(plan, "json"))) == plan


def test_json_shape_the_executor_reads() -> None:
    doc = json.loads(plan_to_json(complex_plan()))
    assert doc["node"] == "QueryExec"
    assert set(doc) >= {"sql", "spark_sql", "now", "params", "time_range", "settings", "scans", "time_columns",
                        "chunks", "pruning", "notes", "children"}
    assert doc["now"] == "2024-01-01T00:00:00.123456Z"  # truncated to Spark's microseconds
    assert doc["params"] == {"s": "MA"}
    assert [s["view"] for s in doc["scans"]] == ["__iox_scan_0", "__iox_scan_1"]
    assert [(s["table"], s["alias"]) for s in doc["scans"]] == [("h2o", "a"), ("h2o", "b")]
    assert doc["scans"][0]["columns"] == {"city": "tag", "state": "tag", "time": "time"}
    assert doc["time_columns"] == ["time"]
    assert doc["chunks"]["F2"] == {
        "kind": "parquet", "table": "h2o", "partition": "2024-01-01", "path": None, "order": 2,
        "time": [BASE + 5, BASE + 15],
        "columns": {"state": "tag", "city": "tag", "temp": "float", "n": "unsigned", "time": "time"}, "rows": 3,
        "store": "file://", "sort_key": [], "tag_ranges": {"state": ["CA", "MA"]}, "file_size": None}
    assert doc["pruning"]["__iox_scan_0"]["chunks_considered"] == 4
    assert len(doc["children"]) == 2
    nodes = []
    stack = list(doc["children"])
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node["children"])
    kinds = {n["node"] for n in nodes}
    assert kinds <= {"ProjectionExec", "FilterExec", "DeduplicateExec", "UnionExec", "SortExec",
                     "SortPreservingMergeExec", "EmptyExec", "ParquetExec", "RecordBatchesExec"}
    for node in nodes:
        if node["node"] == "ParquetExec":
            assert set(node) == {"node", "store", "file_groups", "projection", "predicate", "output_ordering",
                                 "children"}
        if node["node"] == "DeduplicateExec":
            assert node["sort_key"][0] == {"column": "city", "descending": False, "nulls_first": True}


def test_spark_sql_is_the_users_text_with_views_nanoseconds_and_now_spliced_in() -> None:
    plan = complex_plan()
    # Every byte but the edits as written (`INTERVAL 1 DAY` stays as it is, parameters stay bound).
    assert plan.spark_sql == (
        "SELECT a.city, b.temp, a.time, a.__iox_scan_0__time_ns AS __iox_ns_time FROM __iox_scan_0 a "
        "LEFT JOIN __iox_scan_1 b ON a.city = b.city "
        "WHERE a.state = :s AND a.time > TIMESTAMP_MICROS(1704067200123456) - INTERVAL 1 DAY AND b.n > 3")


def test_pushed_predicates_use_parameter_values_and_nanoseconds() -> None:
    text = render(complex_plan())
    assert "state = 'MA'" in text
    assert "time >= 1703980800123457000" in text  # > now - 1 day, in ns, from the next microsecond on
    assert text.count("time >= 0 AND time < 2000000000000000000") >= 2  # the time range, on every scan
    assert "n > 3" not in text.split("scan __iox_scan_1")[1].split("FilterExec")[0]


def test_renderings() -> None:
    plan = complex_plan()
    tree = render(plan, "tree")
    assert tree.startswith("QueryExec: now=2024-01-01T00:00:00.123456Z, time_range=[1970-01-01T00:00:00Z, ")
    assert "note: __iox_scan_0 (h2o): time split skipped" in tree
    assert render_tree(plan) == tree
    doc = yaml.safe_load(render(plan, "yaml"))
    scans = doc["QueryExec"]["scans"]
    assert [s["view"] for s in scans] == ["__iox_scan_0", "__iox_scan_1"]
    assert "child" in next(iter(scans[0]["plan"].values()))
    with pytest.raises(ValueError):
        render(plan, "xml")  # type: ignore[arg-type]


@pytest.mark.parametrize(("sql", "columns"), [
    ("SELECT time FROM h2o", ["time"]),
    ("SELECT time AS t, city FROM h2o ORDER BY t", ["t"]),
    ("SELECT * FROM h2o", ["time"]),
    ("WITH x AS (SELECT time AS ts FROM h2o WHERE city = 'a') SELECT ts AS u FROM x", ["u"]),
    ("SELECT s.time FROM (SELECT time FROM h2o) s JOIN h2o b ON s.time = b.time", ["time"]),
    ("SELECT max(time) AS m FROM h2o", []),
    ("SELECT time, count(*) AS c FROM h2o GROUP BY time", []),
    ("SELECT time + INTERVAL 1 HOUR AS t FROM h2o", []),
    ("SELECT time FROM h2o UNION ALL SELECT time FROM h2o", []),
])
def test_time_columns_are_times_passed_through_unchanged(sql: str, columns: list[str]) -> None:
    assert list(plan_query(sql, SOURCE, now_ns=0).time_columns) == columns


def test_every_scan_view_is_in_the_spark_sql() -> None:
    plan = plan_query("SELECT count(*) FROM h2o x WHERE EXISTS (SELECT 1 FROM h2o y WHERE y.city = x.city)",
                      SOURCE, now_ns=0)
    assert plan.spark_sql == ("SELECT count(*) FROM __iox_scan_0 x WHERE EXISTS (SELECT 1 FROM __iox_scan_1 y "
                              "WHERE y.city = x.city)")


def test_internal_columns_never_reach_a_view() -> None:
    for sql in ("SELECT * FROM h2o", "SELECT count(*) FROM h2o", "SELECT city FROM h2o WHERE temp > 1"):
        for naive in (False, True):
            plan = plan_query(sql, SOURCE, now_ns=0, optimize=not naive)
            assert all(CHUNK_ORDER not in tree.schema for tree in plan.children)


# --- passes and nodes ----------------------------------------------------------------------------------------------

def test_every_pass_has_a_reason_and_the_check_is_last() -> None:
    assert all(p.reason for p in PASSES)
    assert PASSES[-1].name == "sanity_check"
    assert [p.name for p in PASSES].count("clean_unions") == 2


def test_a_pass_that_changes_nothing_returns_its_input() -> None:
    plan = plan_query("SELECT city FROM h2o WHERE state = 'MA'", SOURCE, now_ns=0)
    schema = SOURCE.tables()["h2o"]
    for tree in plan.children:
        for entry in PASSES:
            ctx = PassContext(PlannerSettings(), schema, {}, "t")
            if entry.name in ("push_down_predicates", "push_down_projections", "add_sorts", "sanity_check",
                              "clean_unions", "group_scans_by_type", "split_dedup_by_partition"):
                assert entry.run(tree, ctx) is tree, entry.name
    empty = EmptyExec(("city",))
    for entry in PASSES:
        assert entry.run(empty, PassContext(PlannerSettings(), schema, {}, "t")) is empty


def test_unknown_stop_after() -> None:
    with pytest.raises(ValueError, match="no pass named"):
        plan_query("SELECT city FROM h2o", SOURCE, stop_after="nope")


def test_nodes_are_validated_when_built() -> None:
    f1, i3 = SOURCE.chunk_list[0], SOURCE.chunk_list[2]
    full = (CHUNK_ORDER, "city", "state", "n", "temp", "time")
    scan = ParquetExec("file://", ((f1,),), full)
    with pytest.raises(InternalError, match="inputs differ in schema"):
        UnionExec((scan, ParquetExec("file://", ((f1,),), full[1:])))
    with pytest.raises(InternalError, match="IOx issue #6125"):
        ParquetExec("file://", ((f1, SOURCE.chunk_list[1]),), full, output_ordering=(SortItem("city"),))
    with pytest.raises(InternalError, match="not an ingester chunk|does not belong"):
        ParquetExec("file://", ((i3,),), full)
    with pytest.raises(InternalError, match="__chunk_order"):
        DeduplicateExec((SortItem("city"),), ParquetExec("file://", ((f1,),), full[1:]))
    with pytest.raises(InternalError, match="duplicate columns"):
        ProjectionExec(("city", "city"), scan)
    with pytest.raises(Exception):
        scan.store = "x"  # type: ignore[misc]


def test_predicates_round_trip_with_parentheses() -> None:
    conjuncts = parse_predicate("(a = 1 OR b = 2) AND c > 3 AND (d = 'x' AND e IS NULL)")
    assert [c.sql for c in conjuncts] == ["a = 1 OR b = 2", "c > 3", "d = 'x'", "e IS NULL"]
    assert predicate_sql(conjuncts) == "(a = 1 OR b = 2) AND c > 3 AND d = 'x' AND e IS NULL"
    assert parse_predicate(predicate_sql(conjuncts)) == conjuncts


@pytest.mark.parametrize(("pairs", "needle"), [
    ({"target_partitions": "999999999999999999999"}, "target_partitions takes a whole number from 1 to 10,000"),
    ({"max_dedup_time_split": "0"}, "from 1 to 100,000"),
    ({"max_parquet_fanout": "many"}, "max_parquet_fanout takes a whole number"),
    ({"target_partitions": "\u0661\u0662"}, "target_partitions takes a whole number"),  # Arabic-Indic 12
])
def test_planner_settings_are_bounded_where_they_enter(pairs: dict[str, str], needle: str) -> None:
    with pytest.raises(BadInputError, match=needle):
        PlannerSettings.from_env(pairs, environ={})
    name, value = next(iter(pairs.items()))
    with pytest.raises(BadInputError, match="IOX_"):
        PlannerSettings.from_env(environ={f"IOX_{name.upper()}": value})
    with pytest.raises(BadInputError, match="target_partitions takes a whole number from 1 to 10,000"):
        PlannerSettings(target_partitions=10**21)


@pytest.mark.parametrize(("literal", "ascii_min"), [
    ("TIMESTAMP '2024-01-01 00:00:0\u0661'", BASE + 10**9),
    ("'2024-01-01T00:00:0\u0661Z'", BASE + 10**9),
    ("DATE '2024-01-0\u0662'", BASE + 86_400 * 10**9),
])
def test_time_text_with_digits_of_another_script_bounds_nothing(literal: str, ascii_min: int) -> None:
    """Spark reads only ASCII digits in a timestamp's text (`\u0661` makes no timestamp): the planner must not
    read a time bound from it that Spark would not apply."""
    plan = plan_query(f"SELECT city FROM h2o WHERE time >= {literal}", SOURCE, now_ns=0)
    assert [p.time_min for p in plan.pruning] == [None]
    ascii = literal.replace("\u0661", "1").replace("\u0662", "2")
    assert [p.time_min for p in plan_query(f"SELECT city FROM h2o WHERE time >= {ascii}", SOURCE, now_ns=0).pruning] \
        == [ascii_min]
