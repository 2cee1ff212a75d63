"""How the DAGs reach Spark: the `spark_default` connection derived from IOX_SPARK_MASTER, and the environment
spark-submit runs in (iox_planner.spark.conf builds it). No Airflow import here (docker-compose.yml's test checks its settings against these)."""

from __future__ import annotations

import json
import os

SPARK_CONN_ID = "spark_default"


def spark_connection(master: str) -> str:
    """`spark_default` for a Spark master (`local[*]`, `spark://host:7077`), in the JSON form Airflow reads from
    `AIRFLOW_CONN_SPARK_DEFAULT` (the URI form `spark://local[2]` would silently mean YARN)."""
    return json.dumps({"conn_type": "spark", "host": master})


def ensure_spark_connection(conn_id: str = SPARK_CONN_ID) -> None:
    """Derive the connection from IOX_SPARK_MASTER (unset: `local[*]`) unless the environment defines it
    explicitly (`AIRFLOW_CONN_SPARK_DEFAULT`, as docker-compose.yml does)."""
    from iox_planner.spark.conf import spark_master

    os.environ.setdefault(f"AIRFLOW_CONN_{conn_id.upper()}", spark_connection(spark_master()))
