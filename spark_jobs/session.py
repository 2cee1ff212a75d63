"""The one way a Spark job (or the CLI's in-process runner) builds its SparkSession, with the settings of
`iox_planner.sparkconf`."""

from __future__ import annotations

import logging
import os
import sys
from typing import Mapping

from pyspark.sql import SparkSession

from iox_planner.sparkconf import session_conf, spark_master


def build_session(master: str | None = None, app: str = "iox-batch",
                  conf: Mapping[str, str] | None = None) -> SparkSession:
    master = master or spark_master()
    if master.startswith("local"):
        # Only a local driver may bind to loopback: a cluster's executors must reach a client-mode driver.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must run this interpreter: it has pyarrow and the iox-batch packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app).master(master)
    for key, value in session_conf(conf).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # PySpark logs a failed query's context as JSON on standard error; iox-batch reports the error itself.
    logging.getLogger("SQLQueryContextLogger").disabled = True
    return spark
