"""The run domain's pure parts (no Airflow, no database): materialized definitions, requests from params,
settings, and the fan-out split of a plan."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from iox_planner.errors import BadInputError
from iox_planner.ingest.scenario import read_scenario, scenario_source
from iox_planner.model import RunKey
from iox_planner.output import OutputFormat
from iox_planner.planner import plan_query
from iox_planner.planner.fanout import split_plan
from iox_planner.planner.nodes import DeduplicateExec, EmptyExec
from iox_planner.runs.definitions import load_definitions, parse_definition, to_ns
from iox_planner.runs.refresh import scheduled_intervals
from iox_planner.runs.request import QueryRequest
from iox_planner.runs.settings import RunSettings
from iox_planner.timeutil import INT64_MAX, INT64_MIN

ROOT = Path(__file__).resolve().parents[2]
DAGS = ROOT / "dags"
DATA = ROOT / "tests" / "airflow" / "data"  # the Airflow tests' sample scenarios

SETTINGS = RunSettings(output_root=Path("/data/out"), materialized_dir=Path("/nowhere"))
GOOD: dict[str, Any] = {
    "name": "cpu_hourly", "db": "tsbs", "sql": "SELECT 1", "schedule": "@hourly", "start_date": "2024-01-01",
    "output": "cpu/{start:%Y-%m-%dT%H}.parquet",
}
H = 3600 * 10**9


def test_the_shipped_definitions_are_valid() -> None:
    found = load_definitions(DAGS / "materialized")
    assert found, "dags/materialized holds at least one example definition"
    for definition in found:
        assert definition.dag_id == f"materialize_{definition.name}"
        assert "{start" in definition.output


def test_a_definition_makes_one_request_per_interval() -> None:
    definition = parse_definition({**GOOD, "register_as": {"table": "cpu_hourly", "tags": ["host"]},
                                   "args": {"low": 5}}, "cpu.yaml")
    start = dt.datetime(2024, 1, 2, 3, tzinfo=dt.timezone.utc)
    request = definition.request(start, start + dt.timedelta(hours=1), SETTINGS)
    assert request.output == Path("/data/out/cpu/2024-01-02T03.parquet")
    assert (request.time_start, request.time_end) == (1704164400 * 10**9, 1704164400 * 10**9 + H)
    assert request.format is OutputFormat.PARQUET and request.args == {"low": 5}
    assert request.lock_key() == RunKey("cpu_hourly", request.time_start, request.time_end)
    assert request.register_as is not None and request.register_as.tags == ("host",)
    assert definition.output_pattern(SETTINGS) == Path("/data/out/cpu/*.parquet")
    assert definition.cron == "0 * * * *"


@pytest.mark.parametrize("change, message", [
    ({"schedule": None}, "`schedule`: is required"),
    ({"schedule": "hourly please"}, "`schedule`: 'hourly please' is not a cron expression"),
    ({"output": "cpu/latest.parquet"}, "`output`: must use {start}"),
    ({"output": "cpu/{when}.parquet"}, "`output`: unknown field(s) {when}"),
    ({"format": "xml"}, "`format`: format 'xml' is not an output format"),
    ({"name": "CPU hourly"}, "`name`: 'CPU hourly' must be lowercase"),
    ({"db": "no spaces"}, "`db`: database name 'no spaces' is not allowed"),
    ({"start_date": "yesterday"}, "`start_date`: start_date 'yesterday' is not an RFC 3339 time"),
    ({"end_date": "2023-01-01"}, "`end_date`: must be after start_date"),
    ({"register_as": {"table": "t", "tags": ["time"]}}, "`register_as`: `time` cannot be a tag"),
    ({"catchup": "yes"}, "`catchup`: must be true or false"),
    ({"colour": "blue"}, "unknown key(s) colour"),
    ({"timeout_s": 0}, "`timeout_s`: timeout_s 0 is not allowed; give whole seconds from 1 to 86,400"),
    ({"timeout_s": 10**21}, "`timeout_s`: timeout_s 1000000000000000000000 is not allowed"),
    ({"timeout_s": 1e21}, "`timeout_s`: must be whole seconds, not 1e+21"),
    ({"timeout_s": True}, "`timeout_s`: must be whole seconds, not True"),
])
def test_a_bad_definition_says_which_file_and_key(change: dict[str, Any], message: str) -> None:
    with pytest.raises(BadInputError) as err:
        parse_definition({**GOOD, **change}, "dags/materialized/cpu.yaml")
    assert str(err.value).startswith("dags/materialized/cpu.yaml: ")
    assert message in str(err.value)


def test_a_run_s_budget_comes_from_its_definition_or_param_else_the_setting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    start = dt.datetime(2024, 1, 2, 3, tzinfo=dt.timezone.utc)
    end = start + dt.timedelta(hours=1)
    own = parse_definition({**GOOD, "timeout_s": 1800}, "cpu.yaml").request(start, end, SETTINGS)
    default = parse_definition(GOOD, "cpu.yaml").request(start, end, SETTINGS)
    params = {"db": "d", "sql": "SELECT 1", "output": "/data/out/x.jsonl", "format": "jsonl"}
    triggered = QueryRequest.from_params({**params, "timeout_s": 20}, SETTINGS)
    monkeypatch.setenv("IOX_QUERY_TIMEOUT_S", "600")
    assert (own.budget_s(), default.budget_s(), triggered.budget_s()) == (1800, 600, 20)
    assert triggered.as_params()["timeout_s"] == 20 and "timeout_s" not in default.as_params()
    for bad in (0, 86_401):
        with pytest.raises(BadInputError, match="timeout_s .* is not allowed; give whole seconds from 1 to 86,400"):
            QueryRequest.from_params({**params, "timeout_s": bad}, SETTINGS)
    for bad in (2.5, "1e21", "60", {"s": 1}, float("nan")):
        with pytest.raises(BadInputError, match="param 'timeout_s' must be whole seconds \\(an integer\\), not "):
            QueryRequest.from_params({**params, "timeout_s": bad}, SETTINGS)


def test_two_definitions_with_one_name_are_refused(tmp_path: Path) -> None:
    for stem in ("a", "b"):
        (tmp_path / f"{stem}.yaml").write_text(yaml.safe_dump(GOOD))
    with pytest.raises(BadInputError, match="name 'cpu_hourly' is already used by"):
        load_definitions(tmp_path)


def test_requests_from_params() -> None:
    request = QueryRequest.from_params({"db": "demo", "sql": "SELECT 1", "output": "q/x.jsonl", "format": "jsonl",
                                        "time_start": "2024-01-01", "time_end": "2024-01-01T02:00:00+01:00",
                                        "args": {"a": 1}}, SETTINGS)
    assert request.output == Path("/data/out/q/x.jsonl")
    assert (request.time_start, request.time_end) == (1704067200 * 10**9, 1704067200 * 10**9 + H)
    assert request.lock_key() == RunKey("output:/data/out/q/x.jsonl", INT64_MIN, INT64_MAX)
    with pytest.raises(BadInputError, match="is not before its end"):
        QueryRequest.from_params({"db": "d", "sql": "SELECT 1", "output": "/o", "time_start": "2024-01-02",
                                  "time_end": "2024-01-01"}, SETTINGS)
    with pytest.raises(BadInputError, match="bound parameter :a must be"):
        QueryRequest.from_params({"db": "d", "sql": "SELECT 1", "output": "/o", "args": {"a": [1]}}, SETTINGS)
    with pytest.raises(BadInputError, match="unknown param"):
        QueryRequest.from_params({"db": "d", "sql": "SELECT 1", "output": "/o", "fmt": "csv"}, SETTINGS)


def test_settings_from_the_environment() -> None:
    got = RunSettings.from_env({"IOX_MAX_SPARK_JOBS": "3", "IOX_OUTPUT_ROOT": "/x", "IOX_SPARK_RETRIES": "0"})
    assert (got.max_spark_jobs, got.output_root, got.spark_retries) == (3, Path("/x"), 0)
    with pytest.raises(BadInputError, match="IOX_MAX_SPARK_JOBS='0' is not allowed: IOX_MAX_SPARK_JOBS takes a "
                       "whole number from 1 to 1,024"):
        RunSettings.from_env({"IOX_MAX_SPARK_JOBS": "0"})
    with pytest.raises(BadInputError, match="IOX_PERSIST_CHUNK_THRESHOLD='many' is not allowed"):
        RunSettings.from_env({"IOX_PERSIST_CHUNK_THRESHOLD": "many"})


def test_fan_out_deals_overlap_groups_into_at_most_n_parts() -> None:
    source = scenario_source(read_scenario(DATA / "h2o_3days.yaml"))
    plan = plan_query("SELECT a.state, b.temp FROM h2o a JOIN h2o b ON a.city = b.city AND a.time = b.time",
                      source)
    dedups = [n for tree in plan.children for n in tree.walk() if isinstance(n, DeduplicateExec)]
    assert len(dedups) == 6  # one overlap group per day, in each of the two scans
    assert split_plan(plan, 1) == []
    for n, expected in ((2, 2), (3, 3), (8, 3)):
        parts = split_plan(plan, n)
        assert len(parts) == expected
        for scan in range(2):
            # Every chunk of the scan lands in exactly one part, and each part keeps the scan's schema.
            ids = [sorted(c.id for c in part.children[scan].scanned_chunks()) for part in parts]
            assert sorted(i for part_ids in ids for i in part_ids) == sorted(
                c.id for c in plan.children[scan].scanned_chunks())
            assert all(part.children[scan].schema == plan.children[scan].schema for part in parts)
        assert all(part.sql == plan.sql and part.scans == plan.scans for part in parts)


def test_fan_out_leaves_an_unsplittable_scan_whole() -> None:
    source = scenario_source(read_scenario(DAGS.parent / "examples" / "h2o.yaml"))
    plan = plan_query("SELECT * FROM h2o", source)
    assert split_plan(plan, 4) == []  # one overlap group: nothing to split
    two = scenario_source(read_scenario(DATA / "h2o_3days.yaml"))
    mixed = plan_query("SELECT * FROM h2o WHERE time < TIMESTAMP '2024-01-02 00:00:00'", two)
    parts = split_plan(mixed, 2)
    assert parts == [] or any(isinstance(p.children[0], EmptyExec) for p in parts)


@pytest.mark.parametrize("field, value", [("name", "cpu\n"), ("db", "demo\n"), ("db", "de\0mo")])
def test_definition_names_are_matched_whole(field: str, value: str) -> None:
    doc = {"name": "cpu", "db": "demo", "sql": "SELECT 1", "schedule": "@daily", "start_date": "2024-01-01",
           "output": "cpu/{start:%Y-%m-%d}.parquet", field: value}
    with pytest.raises(BadInputError) as caught:
        parse_definition(doc, "cpu.yaml")
    assert "\n" not in str(caught.value).replace("\\n", "")


# --- bounds on every field (issue 22, item 4) ----------------------------------------------------------------------


@pytest.mark.parametrize("change, message", [
    ({"max_spark_jobs": 10**21}, "`max_spark_jobs`: must be a whole number from 1 to 1,024, not 10000000000000000"),
    ({"max_spark_jobs": 1e21}, "`max_spark_jobs`: must be a whole number from 1 to 1,024, not 1e+21"),
    ({"max_spark_jobs": 1025}, "`max_spark_jobs`: must be a whole number from 1 to 1,024"),
    ({"max_spark_jobs": 0}, "`max_spark_jobs`: must be a whole number from 1 to 1,024"),
    ({"retries": 10**21}, "`retries`: must be a whole number from 0 to 10, not 1000000000000000000000"),
    ({"retries": -1}, "`retries`: must be a whole number from 0 to 10"),
    ({"args": {"low": float("nan")}}, "`args`: bound parameter :low is nan, which SQL has no literal for"),
    ({"args": {"low": float("inf")}}, "`args`: bound parameter :low is inf"),
])
def test_every_numeric_field_is_bounded(change: dict[str, Any], message: str) -> None:
    with pytest.raises(BadInputError) as err:
        parse_definition({**GOOD, **change}, "cpu.yaml")
    assert message in str(err.value) and "\n" not in str(err.value)
    assert parse_definition({**GOOD, "max_spark_jobs": 1024, "retries": 10}, "cpu.yaml").max_spark_jobs == 1024


@pytest.mark.parametrize("template, message", [
    ("cpu/{start:%Y}-{name:>300000000}.jsonl", "{name:...}: only {start} and {end} take a pattern"),
    ("cpu/{start!r:>300000000}.jsonl", "{start!r}: a conversion is not allowed"),
    ("cpu/{start!s}.jsonl", "{start!s}: a conversion is not allowed"),
    ("cpu/{start.year:>300000000}.jsonl", "unknown field(s) {start.year}"),
    ("cpu/{start.__class__}/{start}.jsonl", "unknown field(s) {start.__class__}"),
    ("cpu/{start[0]}.jsonl", "unknown field(s) {start[0]}"),
    ("cpu/{start:{name}}.jsonl", "{start:...}: a pattern may not hold another field"),
    ("cpu/{start:%Y}/" + "x" * 2000 + ".jsonl", "an output path template holds at most 1,024"),
    ("../../../../tmp/escape/{start:%Y%m%d%H}.csv", "climbs out of its folder with '..'"),  # probe MD09
    ("cpu/{start:%Y}/../../x.jsonl", "climbs out of its folder with '..'"),
])
def test_an_output_template_cannot_grow_or_reach_into_values(template: str, message: str) -> None:
    with pytest.raises(BadInputError) as err:
        parse_definition({**GOOD, "output": template, "format": "jsonl"}, "cpu.yaml")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_start_and_end_keep_their_strftime_patterns() -> None:
    definition = parse_definition({**GOOD, "output": "{name}/{start:%Y-%m-%dT%H}_{end:%H}.jsonl",
                                   "format": "jsonl"}, "cpu.yaml")
    start = dt.datetime(2024, 1, 2, 3, tzinfo=dt.timezone.utc)
    assert definition.output_path(start, start + dt.timedelta(hours=1), SETTINGS) == Path(
        "/data/out/cpu_hourly/2024-01-02T03_04.jsonl")


@pytest.mark.parametrize("schedule", ["* * * * * *", "*/5 * * * * *", "0 0 * * * * 2030", "* * * *"])
def test_a_schedule_is_five_cron_fields_or_a_preset(schedule: str) -> None:
    with pytest.raises(BadInputError, match="is not a cron expression of five fields"):
        parse_definition({**GOOD, "schedule": schedule}, "cpu.yaml")
    assert parse_definition({**GOOD, "schedule": "* * * * *"}, "cpu.yaml").cron == "* * * * *"


@pytest.mark.parametrize(("schedule", "start"), [("0 0 30 2 *", "2024-01-01"), ("0 0 31 4 *", "2024-01-01"),
                                                 ("15 3 31 6,9,11 *", "2024-01-01")])
def test_a_schedule_that_never_fires_is_refused_when_the_definition_loads(schedule: str, start: str) -> None:
    """croniter accepts these and fails only when asked for the next tick: at every status call and DAG parse."""
    with pytest.raises(BadInputError, match=f"`schedule`: '{re.escape(schedule)}' never fires from start_date "
                                            f"{start} on: no date before the year 10000 matches it"):
        parse_definition({**GOOD, "schedule": schedule, "start_date": start}, "cpu.yaml")


@pytest.mark.parametrize("key, value", [("start_date", "9999-06-01"), ("start_date", dt.date(1600, 1, 1)),
                                        ("start_date", dt.datetime(2262, 4, 11, tzinfo=dt.timezone.utc)),
                                        ("end_date", "2262-04-12T00:00:00Z"),
                                        ("start_date", "2024-01-01T00:00:00+25:00")])
def test_a_date_no_interval_bound_can_hold_is_refused_when_the_definition_loads(key: str, value: object) -> None:
    """Each interval's bounds are nanoseconds in the catalog's bigint: a start in 1600 or 9999 would fail every run
    in psycopg2's "bigint out of range" (or, with `@yearly` from 9999, never fire)."""
    with pytest.raises(BadInputError, match=f"`{key}`: {key} .* (is outside the times iox-batch holds|has the UTC "
                                            "offset)"):
        parse_definition({**GOOD, key: value}, "cpu.yaml")


@pytest.mark.parametrize("schedule", ["@hourly ", " @hourly", "@HOURLY", 5])
def test_a_schedule_is_taken_exactly(schedule: object) -> None:
    with pytest.raises(BadInputError, match="`schedule`: "):
        parse_definition({**GOOD, "schedule": schedule}, "cpu.yaml")


def test_a_schedule_that_fires_rarely_is_a_schedule() -> None:
    leap = parse_definition({**GOOD, "schedule": "0 0 29 2 *"}, "cpu.yaml")
    utc = dt.timezone.utc
    assert list(scheduled_intervals(leap, dt.datetime(2029, 1, 1, tzinfo=utc))) == [
        (to_ns(dt.datetime(2024, 2, 29, tzinfo=utc)), to_ns(dt.datetime(2028, 2, 29, tzinfo=utc)))]


@pytest.mark.parametrize("register_as, message", [
    ({"table": "__iox_scan_0"}, "table: measurement name '__iox_scan_0' starts with '__'"),
    ({"table": " "}, "is only whitespace"),
    ({"table": "cpu\x1b[31m"}, "the control character U+001B is not allowed"),
    ({"table": "x" * 3000}, "is longer than 2048 bytes"),
    ({"table": 5}, "`table` must be a table name, not int"),
    ({"table": "t", "tags": ["__seq"]}, "tags: tag key '__seq' starts with '__'"),
])
def test_register_as_names_follow_the_catalog_s_rule(register_as: dict[str, Any], message: str) -> None:
    with pytest.raises(BadInputError) as err:
        parse_definition({**GOOD, "register_as": register_as}, "cpu.yaml")
    assert "`register_as`: " in str(err.value) and message in str(err.value)


def test_definition_files_are_read_as_safely_as_scenario_files(tmp_path: Path) -> None:
    """YAML aliases (a 528-byte file of them cost 22 s and 712 MB on every DAG parse), a file past the size
    bound (or one that never ends) and deep nesting are refused, each in one paragraph naming the file."""
    good = yaml.safe_dump(GOOD)
    laughs = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8))
    cases = {
        "aliases.yaml": (good + laughs, "YAML anchors and aliases (&name, *name) are not allowed"),
        "anchor.yaml": (good.replace("db: tsbs", "db: &d tsbs"), "YAML anchors and aliases"),
        "big.yaml": (good + "description: " + "x" * (2 * 1024 * 1024) + "\n", "is larger than 2097152 bytes"),
        "deep.yaml": (good + "args: " + "[" * 50 + "]" * 50 + "\n", "nested deeper than 4 levels"),
        "python.yaml": (good + "args: !!python/object/apply:os.system ['true']\n", "is not valid YAML"),
    }
    for name, (text, message) in cases.items():
        folder = tmp_path / name.split(".")[0]
        folder.mkdir()
        (folder / name).write_text(text)
        with pytest.raises(BadInputError) as err:
            load_definitions(folder)
        assert message in str(err.value) and str(folder / name) in str(err.value), (name, str(err.value)[:300])
        assert "\n" not in str(err.value)
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "cpu.yaml").write_text(good)
    assert [d.name for d in load_definitions(tmp_path / "ok")] == ["cpu_hourly"]


@pytest.mark.parametrize(("text", "key", "line", "first"), [
    # The probe: a second `sql:` replaced the query a reader of the file sees first.
    ("sql: SELECT 1 AS x\n", "sql", 7, 3),
    ("register_as:\n  table: t\n  tags: [a]\n  table: u\n", "table", 10, 8),
    ("args: {a: 1, 'a': 2}\n", "a", 7, 7),
])
def test_a_key_given_twice_in_a_definition_is_refused(tmp_path: Path, text: str, key: str, line: int,
                                                      first: int) -> None:
    good = yaml.safe_dump(GOOD, sort_keys=False)
    assert good.count("\n") == 6 and good.splitlines()[2].startswith("sql:")
    (tmp_path / "cpu.yaml").write_text(good + text)
    with pytest.raises(BadInputError, match=rf"cpu.yaml: line {line}, column \d+: key '{key}' appears twice in one "
                                            rf"mapping \(first at line {first}\); YAML allows each key once"):
        load_definitions(tmp_path)
