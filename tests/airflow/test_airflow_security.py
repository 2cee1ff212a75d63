"""Airflow runs write only under the output roots: `..`, absolute paths elsewhere, symlinks leading out and names
a loader or shell would execute are refused by the plan task, with nothing written and the run recorded failed.
Most cases run on the validation directly (fast); one batch of real `dag.test()` runs proves the plan task."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from af_support import DagRunner, query_runs

from helpers import tree_digest
from iox_airflow.definitions import parse_definition
from iox_airflow.query_request import QueryRequest
from iox_airflow.runs import RunFailed, RunIdentity, plan
from iox_airflow.settings import AirflowSettings
from iox_planner.catalog.store import Catalog
from iox_planner.errors import BadInputError

QUERY = "SELECT state, city, time FROM h2o"


@pytest.fixture
def outside() -> Iterator[Path]:
    """A folder outside every output root (and outside pytest's temporary folder)."""
    folder = Path("/tmp") / f"iox-sec-outside-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    yield folder
    shutil.rmtree(folder)


def _settings(root: Path, *more: Path) -> AirflowSettings:
    return AirflowSettings(output_root=root, output_roots=(root, *more))


def _request(settings: AirflowSettings, output: str, fmt: str = "jsonl") -> QueryRequest:
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
    got = AirflowSettings.from_env({"IOX_OUTPUT_ROOTS": f"{a}{os.pathsep}{b}"})
    assert got.output_root == a and got.output_roots == (a, b)
    assert _request(got, str(b / "x.csv"), "csv").output == b / "x.csv"
    with pytest.raises(BadInputError, match="filesystem root"):
        AirflowSettings.from_env({"IOX_OUTPUT_ROOTS": "/"})


def test_a_definition_writing_outside_the_roots_fails_in_the_plan_step(catalog: Catalog, h2o_db: str,
                                                                        tmp_path: Path, outside: Path) -> None:
    import datetime as dt

    settings = _settings(tmp_path / "root")
    definition = parse_definition({
        "name": "escape", "db": h2o_db, "sql": QUERY, "schedule": "@daily", "start_date": "2024-01-01",
        "output": str(outside / "{start:%Y-%m-%d}.parquet"),
    }, "escape.yaml")
    start = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    request = definition.request(start, start + dt.timedelta(days=1), settings)
    run = RunIdentity("materialize_escape", f"test__{uuid.uuid4().hex[:8]}")
    with pytest.raises(RunFailed, match="outside the output roots"):
        plan(request, run, settings)
    assert os.listdir(outside) == []
    [recorded] = query_runs(catalog, dag_id=run.dag_id, run_id=run.run_id)
    assert recorded["status"] == "failed" and "outside the output roots" in recorded["error"]


@pytest.mark.airflow
@pytest.mark.spark
def test_hostile_outputs_fail_at_the_plan_task_and_write_nothing(dag_runner: DagRunner, airflow_env: dict[str, str],
                                                                 catalog: Catalog, h2o_db: str, tmp_path: Path,
                                                                 outside: Path) -> None:
    root = Path(airflow_env["IOX_OUTPUT_ROOT"])
    escape = tmp_path / "escape"
    escape.symlink_to(outside)
    above = root.parent.parent / "dotdot.jsonl"  # where '../../dotdot.jsonl' from the root would land
    cases = {
        "dotdot": ("../../dotdot.jsonl", "jsonl", "outside the output roots"),
        "absolute": (str(outside / "abs.jsonl"), "jsonl", "outside the output roots"),
        "symlink": (str(escape / "link.jsonl"), "jsonl", "outside the output roots"),
        "pth": (str(tmp_path / "evil.pth"), "csv", "must end in '.csv'"),
    }
    before = tree_digest(tmp_path), tree_digest(root)
    specs = [{"dag_id": "iox_query", "conf": {"db": h2o_db, "sql": QUERY, "output": output, "format": fmt}}
             for output, fmt, _ in cases.values()]
    results = dag_runner.run(specs)
    for (name, (_, _, needle)), result in zip(cases.items(), results):
        assert result.get("state") == "failed", (name, result.get("error"), result["log"][-3000:])
        assert result["tasks"]["plan"] == "failed", (name, result["tasks"])
        [run] = query_runs(catalog, dag_id="iox_query", run_id=result["run_id"])
        assert run["status"] == "failed" and needle in run["error"], (name, run["error"])
        assert "Traceback" not in run["error"]
    assert os.listdir(outside) == [] and not above.exists()
    assert (tree_digest(tmp_path), tree_digest(root)) == before


@pytest.mark.parametrize("field, value", [("name", "cpu\n"), ("db", "demo\n"), ("db", "de\0mo")])
def test_definition_names_are_matched_whole(field: str, value: str) -> None:
    doc = {"name": "cpu", "db": "demo", "sql": QUERY, "schedule": "@daily", "start_date": "2024-01-01",
           "output": "cpu/{start:%Y-%m-%d}.parquet", field: value}
    with pytest.raises(BadInputError) as caught:
        parse_definition(doc, "cpu.yaml")
    assert "\n" not in str(caught.value).replace("\\n", "")
