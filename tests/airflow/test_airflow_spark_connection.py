"""`spark_default`, the connection the DAGs' Spark operator uses, as Airflow's own SparkSubmitHook reads it; and
`iox_spark_connect` as `connect_remote` reads it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


CONNECT_REMOTES = r"""
import json, os, sys
from iox_airflow.spark import connect_remote
from iox_planner.errors import IoxError
for conn in json.loads(sys.argv[1]):
    os.environ["AIRFLOW_CONN_IOX_SPARK_CONNECT"] = json.dumps(conn)
    try:
        r = connect_remote()
        print(json.dumps([r.url, r.gate_host, r.gate_port, r.token, r.tls, r.ca, repr(r)]))
    except IoxError as err:
        print(json.dumps(["error", str(err)]))
"""


def test_iox_spark_connect_gives_the_token_from_its_password_and_tls_from_use_ssl(
        airflow_env: dict[str, str], tmp_path: Path) -> None:
    """`iox_spark_connect` as the provider's form fills it: the token in the password (the extra `gate_token` of
    earlier releases still read), `use_ssl` for TLS with IOX_SPARK_TLS_CA; a host elsewhere without TLS, or a user
    id, refused in one paragraph that never shows the token."""
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    token, old = "p" * 64, "g" * 64
    base = {"conn_type": "spark_connect", "port": 15443}
    conns = [{**base, "host": "127.0.0.1", "password": token},
             {**base, "host": "127.0.0.1", "extra": {"gate_token": old, "gate_port": 15500}},
             {**base, "host": "spark-connect", "password": token, "extra": {"gate_port": 15444, "use_ssl": True}},
             {**base, "host": "spark-connect", "password": token},
             {**base, "host": "127.0.0.1", "password": token, "login": "someone"}]
    env = {**airflow_env, "PYTHONPATH": str(DAGS), "IOX_SPARK_TLS_CA": str(ca)}
    env.pop("IOX_SPARK_GATE_TOKEN", None)
    done = subprocess.run([sys.executable, "-c", CONNECT_REMOTES, json.dumps(conns)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    local, earlier, tls, clear, user = (json.loads(line) for line in done.stdout.splitlines())
    assert local[:6] == ["sc://127.0.0.1:15443", "127.0.0.1", 15444, token, False, None]
    assert earlier[2:5] == [15500, old, False]
    assert tls[:6] == ["sc://spark-connect:15443", "spark-connect", 15444, token, True, str(ca)]
    assert token not in local[6] and token not in tls[6]
    assert clear[0] == "error" and "without TLS" in clear[1] and "'use_ssl'" in clear[1]
    assert user[0] == "error" and "user id" in user[1]
    assert token not in clear[1] + user[1]
