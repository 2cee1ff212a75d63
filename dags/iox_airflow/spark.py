"""How the DAGs reach Spark: the `spark_default` connection derived from IOX_SPARK_MASTER, and the environment
spark-submit runs in. No Airflow import here (docker-compose.yml's test checks its settings against these)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SPARK_CONN_ID = "spark_default"


def spark_connection(master: str) -> str:
    """`spark_default` for a Spark master (`local[*]`, `spark://host:7077`), in the JSON form Airflow reads from
    `AIRFLOW_CONN_SPARK_DEFAULT` (the URI form `spark://local[2]` would silently mean YARN)."""
    return json.dumps({"conn_type": "spark", "host": master})


def ensure_spark_connection(conn_id: str = SPARK_CONN_ID) -> None:
    """Derive the connection from IOX_SPARK_MASTER (unset: `local[*]`) unless the environment defines it
    explicitly (`AIRFLOW_CONN_SPARK_DEFAULT`, as docker-compose.yml does)."""
    from iox_planner.cli.runner import spark_master

    os.environ.setdefault(f"AIRFLOW_CONN_{conn_id.upper()}", spark_connection(spark_master()))


def spark_env() -> dict[str, str]:
    """What spark-submit and the job's Python need: the virtualenv's bin first on PATH (spark-submit lives there),
    its Python for the workers, the checkout on PYTHONPATH (spark_jobs, iox_planner)."""
    from iox_planner.config import project_root
    from iox_planner.cli.runner import spark_master

    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    env = {
        "PATH": path if path.split(os.pathsep)[0] == bin_dir else f"{bin_dir}{os.pathsep}{path}",
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON") or sys.executable,
        "PYTHONPATH": os.pathsep.join(p for p in (str(project_root()), os.environ.get("PYTHONPATH", "")) if p),
    }
    # On one machine Spark must not guess an address; against a cluster the executors connect back to the
    # driver, so its address is left to the deployment (IOX_SPARK_CONF spark.driver.host, SPARK_LOCAL_IP).
    if "SPARK_LOCAL_IP" in os.environ or spark_master().startswith("local"):
        env["SPARK_LOCAL_IP"] = os.environ.get("SPARK_LOCAL_IP") or "127.0.0.1"
    return env
