"""Airflow runs write only under the output roots: one batch of real `dag.test()` runs proves the plan task refuses
`..`, absolute paths elsewhere, symlinks leading out and names a loader or shell would execute, with nothing written
and the run recorded failed. (The validation itself, case by case: tests/runs/test_request.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from airflow_support import DagRunner, query_runs

from common_support import tree_digest
from iox_planner.catalog.store import Catalog

QUERY = "SELECT state, city, time FROM h2o"


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
