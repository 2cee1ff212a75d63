"""`spark_default`, the connection the DAGs' Spark operator uses, as Airflow's own SparkSubmitHook reads it."""

from __future__ import annotations

import subprocess
import sys

import pytest
from airflow_support import DAGS

pytestmark = pytest.mark.airflow

HOOK_MASTERS = r"""
import os, sys
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from iox_airflow.spark import ensure_spark_connection
for master in sys.argv[1:]:
    os.environ.pop("AIRFLOW_CONN_SPARK_DEFAULT", None)
    if master == "-":
        os.environ.pop("IOX_SPARK_MASTER", None)
    else:
        os.environ["IOX_SPARK_MASTER"] = master
    ensure_spark_connection()
    print(SparkSubmitHook()._connection["master"])
"""


def test_spark_default_is_derived_from_iox_spark_master(airflow_env: dict[str, str]) -> None:
    """What Airflow's own SparkSubmitHook makes of the derived connection: exactly IOX_SPARK_MASTER."""
    env = {**airflow_env, "PYTHONPATH": str(DAGS)}
    masters = ["-", "local[2]", "spark://127.0.0.1:7077"]
    done = subprocess.run([sys.executable, "-c", HOOK_MASTERS, *masters], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["local[*]", "local[2]", "spark://127.0.0.1:7077"]
