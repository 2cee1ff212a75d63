"""One argv builder: for the same job, the CLI's spark-submit (`SubmitLauncher.command`) and the DAGs' operator
(given the job as the plan task hands it on, `operator_kwargs`, its command built by Airflow's own SparkSubmitHook)
run the same script with the same arguments, master and Spark settings."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from airflow_support import DAGS

pytestmark = pytest.mark.airflow

BOTH_COMMANDS = r"""
import json, os, sys
from pathlib import Path
from iox_airflow.operators import IoxSparkSubmitOperator
from iox_planner.output import OutputFormat
from iox_planner.spark.jobs import BulkLoadJob, CompactJob, MergeJob, PartJob, PlanJob
from iox_planner.spark.launch import SubmitLauncher

os.environ.pop("AIRFLOW_CONN_SPARK_DEFAULT", None)
tmp = Path(sys.argv[1])
jobs = [
    PlanJob(tmp / "plan.json", tmp / "out.jsonl", OutputFormat.JSONL, 60, report=tmp / "m.json", fast_start=True),
    PartJob(tmp / "part-0.json", tmp / "parts" / "0", 60, report=tmp / "p.json"),
    MergeJob(tmp / "plan.json", tmp / "parts", tmp / "out.arrow", OutputFormat.ARROW, 60, report=tmp / "m.json"),
    CompactJob(report=tmp / "b.json", targets=(("db1", (1, 2)), ("db2", (3,)))),
    BulkLoadJob("db1", str(tmp / "in"), report=tmp / "r.json", root=tmp),
]
out = []
for job in jobs:
    cli = SubmitLauncher().command(job)
    op = IoxSparkSubmitOperator(task_id="t", **job.operator_kwargs())
    op.prepare_submit()
    dag = op._get_hook()._build_spark_submit_command(op.application)
    out.append({"cli": cli, "dag": dag})
print(json.dumps(out))
"""


def _split(command: list[str]) -> tuple[str, dict[str, str], list[str]]:
    """(master, --conf settings, the script and its arguments) of a spark-submit command line."""
    master, conf, i = "", {}, 1
    while i < len(command) and command[i].startswith("--"):
        flag, value = command[i], command[i + 1]
        if flag == "--master":
            master = value
        elif flag == "--conf":
            key, _, setting = value.partition("=")
            conf[key] = setting
        i += 2
    return master, conf, command[i:]


def test_cli_and_dag_submit_the_same_job_the_same_way(airflow_env: dict[str, str], tmp_path) -> None:
    env = {**airflow_env, "PYTHONPATH": str(DAGS), "IOX_SPARK_MASTER": "local[2]"}
    done = subprocess.run([sys.executable, "-c", BOTH_COMMANDS, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    pairs = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(pairs) == 5
    for pair in pairs:
        cli, dag = _split(pair["cli"]), _split(pair["dag"])
        assert cli[0] == dag[0] == "local[2]"
        assert cli[1] == dag[1]
        assert cli[2] == dag[2] and cli[2][0].endswith(".py")
    plan_conf = _split(pairs[0]["cli"])[1]
    assert "-XX:TieredStopAtLevel=1" in plan_conf["spark.driver.extraJavaOptions"]  # the plan's fast start, both
