"""Runs write only under the output roots: `..`, absolute paths elsewhere, symlinks leading out and names a loader
or shell would execute are refused when a request is built, and again by the plan step, with nothing written and
the run recorded failed. (The same through Airflow's plan task: tests/airflow/test_airflow_security.py.)"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from iox_planner.catalog import runs
from iox_planner.catalog.store import Catalog
from iox_planner.errors import BadInputError, RunFailed
from iox_planner.runs.definitions import parse_definition
from iox_planner.runs.planning import plan
from iox_planner.runs.request import QueryRequest
from iox_planner.runs.settings import RunSettings
from iox_planner.runs.staging import RunIdentity

QUERY = "SELECT state, city, time FROM h2o"


def _settings(root: Path, *more: Path) -> RunSettings:
    return RunSettings(output_root=root, output_roots=(root, *more))


def _request(settings: RunSettings, output: str, fmt: str = "jsonl") -> QueryRequest:
    return QueryRequest.from_params({"db": "demo", "sql": QUERY, "output": output, "format": fmt}, settings)


def test_outputs_that_leave_the_roots_or_could_run_are_refused(tmp_path: Path, outside: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "escape").symlink_to(outside)
    (root / "link.jsonl").symlink_to(outside / "x.jsonl")
    settings = _settings(root)
    cases = [
        ("../../x.jsonl", "jsonl", "outside the output roots"),
        ("sub/../../x.jsonl", "jsonl", "outside the output roots"),
        (str(outside / "x.jsonl"), "jsonl", "outside the output roots"),
        ("escape/x.jsonl", "jsonl", "outside the output roots"),
        ("link.jsonl", "jsonl", "outside the output roots"),
        (str(root), "parquet", "outside the output roots"),
        ("evil.pth", "csv", "must end in '.csv'"),
        ("evil.pth", "parquet", "must end in no extension or '.parquet'"),  # a folder named .pth
        ("sitecustomize.py", "jsonl", "must end in '.jsonl'"),
        (".bashrc", "csv", "not allowed"),
        (".config/x.csv", "csv", "not allowed"),
        ("a b.csv", "csv", "not allowed"),
        ("x.csv\n", "csv", "not allowed"),
        ("x.csv", "jsonl", "must end in '.jsonl'"),
        ("x\0.csv", "csv", "NUL"),
    ]
    for output, fmt, needle in cases:
        with pytest.raises(BadInputError) as caught:
            _request(settings, output, fmt)
        message = str(caught.value)
        assert needle in message, (output, message)
        assert "\n" not in message and len(message) < 600, (output, message)
    assert os.listdir(outside) == []
    # Allowed: names under the root with the format's suffix; a symlink that stays inside the root is followed.
    (root / "inner").mkdir()
    (root / "alias").symlink_to(root / "inner")
    assert _request(settings, "day/2024-01-01T00.parquet", "parquet").output == root / "day/2024-01-01T00.parquet"
    assert _request(settings, "alias/x.csv", "csv").output == root / "inner" / "x.csv"
    assert _request(settings, str(root / "r.jsonl")).output == root / "r.jsonl"


def test_output_roots_from_the_environment(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    got = RunSettings.from_env({"IOX_OUTPUT_ROOTS": f"{a}{os.pathsep}{b}"})
    assert got.output_root == a and got.output_roots == (a, b)
    assert _request(got, str(b / "x.csv"), "csv").output == b / "x.csv"
    with pytest.raises(BadInputError, match="filesystem root"):
        RunSettings.from_env({"IOX_OUTPUT_ROOTS": "/"})


def test_a_definition_writing_outside_the_roots_fails_in_the_plan_step(catalog: Catalog, db: str,
                                                                        tmp_path: Path, outside: Path) -> None:
    import datetime as dt

    settings = _settings(tmp_path / "root")
    definition = parse_definition({
        "name": "escape", "db": db, "sql": QUERY, "schedule": "@daily", "start_date": "2024-01-01",
        "output": str(outside / "{start:%Y-%m-%d}.parquet"),
    }, "escape.yaml")
    start = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    request = definition.request(start, start + dt.timedelta(days=1), settings)
    run = RunIdentity("materialize_escape", f"test__{uuid.uuid4().hex[:8]}")
    with pytest.raises(RunFailed, match="outside the output roots"):
        plan(request, run, settings)
    assert os.listdir(outside) == []
    recorded = runs.find_run(catalog, run.dag_id, run.run_id)
    assert recorded is not None
    assert recorded["status"] == "failed" and "outside the output roots" in recorded["error"]


@pytest.mark.parametrize("change, message", [
    ({"sql": {"select": "1"}}, "param 'sql' must be a string, not dict"),
    ({"sql": ["SELECT 1"]}, "param 'sql' must be a string, not list"),
    ({"db": {"demo": 1}}, "param 'db' must be a string, not dict"),
    ({"output": {"path": "x.jsonl"}}, "param 'output' must be a string, not dict"),
    ({"time_start": 1704067200}, "param 'time_start' must be a string, not int"),
    ({"format": ["jsonl"]}, "param 'format' must be a string, not list"),
    ({"args": {"low": float("nan")}}, "bound parameter :low is nan, which SQL has no literal for"),
    ({"args": {"low": float("-inf")}}, "bound parameter :low is -inf"),
    ({"timeout_s": "60"}, "param 'timeout_s' must be whole seconds (an integer), not str"),
    ({"timeout_s": "\u0661\u0662"}, "param 'timeout_s' must be whole seconds (an integer), not str"),
    ({"timeout_s": 60.0}, "param 'timeout_s' must be whole seconds (an integer), not float"),
    ({"timeout_s": True}, "param 'timeout_s' must be whole seconds (an integer), not bool"),
])
def test_params_of_the_wrong_type_are_refused_not_turned_into_text(tmp_path: Path, change: dict[str, object],
                                                                 message: str) -> None:
    """A triggered run's params as JSON can hold objects and NaN (Python's JSON reads `NaN` and `Infinity`)."""
    params = {"db": "demo", "sql": QUERY, "output": "x.jsonl", "format": "jsonl", **change}
    with pytest.raises(BadInputError) as err:
        QueryRequest.from_params(params, _settings(tmp_path))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_run_failed_is_an_iox_error_with_its_cause_s_exit_status() -> None:
    from iox_planner.errors import IoxError

    failed = RunFailed("the catalog was unreachable", 75)
    assert isinstance(failed, IoxError) and failed.exit_code == 75 and str(failed) == "the catalog was unreachable"
    assert RunFailed("x").exit_code == 1


@pytest.mark.parametrize("change, message", [
    ({"time_start": "2024-01-01T00:00:00+25:00"}, "has the UTC offset +25:00, which no place has"),
    ({"time_end": "2024-01-01T00:00:00-24:00"}, "has the UTC offset -24:00, which no place has"),
    ({"time_start": "2024-01-01T00:00:00Z "}, "is not an RFC 3339 time"),
    ({"time_start": ""}, "is not an RFC 3339 time"),
    ({"time_start": "2262-04-12T00:00:00Z"}, "is after the last time data may have (1677-09-22T00:00:00Z to "),
    ({"changes_since": "beginning "}, "is not a watermark"),
    ({"changes_since": "Beginning"}, "is not a watermark"),
    ({"changes_since": " W1-1-5-0123456789abcdef"}, "is not a watermark"),
    ({"changes_since": ""}, "is not a watermark"),
    ({"format": "jsonl "}, "is not an output format"),
])
def test_params_are_taken_exactly_and_times_within_what_they_can_mean(tmp_path: Path, change: dict[str, object],
                                                                     message: str) -> None:
    """Probes: `time_start` with `+25:00` published 0 rows; `changes_since: "beginning "` was read as beginning."""
    params = {"db": "demo", "sql": QUERY, "output": "x.jsonl", "format": "jsonl", **change}
    with pytest.raises(BadInputError) as err:
        QueryRequest.from_params(params, _settings(tmp_path))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_whole_days_just_outside_the_range_leave_it_open(tmp_path: Path) -> None:
    params = {"db": "demo", "sql": QUERY, "output": "x.jsonl", "format": "jsonl", "changes_since": "beginning",
              "time_start": "1677-09-21T00:00:00Z", "time_end": "2262-04-12T00:00:00Z"}
    request = QueryRequest.from_params(params, _settings(tmp_path))
    assert (request.time_start, request.time_end, request.changes_since) == (None, None, "beginning")
    request = QueryRequest.from_params({**params, "time_end": "2024-01-01T01:00:00+01:00"}, _settings(tmp_path))
    assert (request.time_start, request.time_end) == (None, 1_704_067_200_000_000_000)
