"""The one way a Spark job builds its SparkSession, with the settings of `iox_planner/spark/conf.py`; and the one
session of a process whose jobs run in it (`shared_session`: the CLI's in-process launcher, the tests)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Mapping

from pyspark.sql import SparkSession

from iox_planner.spark.conf import session_conf, spark_master

_SHARED: SparkSession | None = None


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


def shared_session() -> SparkSession:
    """One SparkSession per process, built on first use. The JVM's own chatter goes to `.iox/spark.log`, not to
    the user's terminal: errors come back as exceptions and are reported as iox-batch errors."""
    global _SHARED
    if _SHARED is None:
        from iox_planner.config import state_dir

        path = state_dir() / "spark.log"
        root = logging.getLogger()
        if not root.handlers:
            # py4j logs a lost JVM connection on the root logger (which would configure itself to print the
            # traceback on standard error); the error is reported in one paragraph, the details go to the log.
            root.addHandler(logging.FileHandler(path))
        log = open(path, "ab")
        sys.stdout.flush()
        saved = {fd: os.dup(fd) for fd in (1, 2)}
        try:
            # The JVM inherits these descriptors as its standard output and error: its chatter (and a dying JVM's
            # last words) must not land in a result printed to standard output.
            for fd in saved:
                os.dup2(log.fileno(), fd)
            _SHARED = build_session(spark_master())
        finally:
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            log.close()
    return _SHARED
