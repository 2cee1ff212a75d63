"""Spark's settings that need no Spark: the settings of every iox-batch session (defaults, IOX_SPARK_CONF, the
fixed ones), the master, the environment spark-submit and the job's Python run in, and the fast-start JVM of small
jobs. The CLI's launchers, the Spark jobs' sessions (`spark_jobs/session.py`) and the DAGs' operator all take them
from here. Imports no pyspark, so the DAG files can use it at parse time."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Mapping

from iox_planner import config
from iox_planner.config import project_root
from iox_planner.errors import BadInputError

DEFAULT_CONF: Mapping[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.ansi.enabled": "true",
    "spark.sql.caseSensitive": "true",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.parquet.filterPushdown": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # One query must not take the machine: in local mode the driver JVM is the whole engine (executors included),
    # and its heap is the bound. maxResultSize (Spark's own default, said here so it is seen next to the memory
    # it must fit in) bounds what one action may collect on the driver: a text result (csv, jsonl, the terminal)
    # and a `register_as` result pass through it; Parquet is written by the executors and never does.
    "spark.driver.memory": "2g",
    "spark.driver.maxResultSize": "1g",
    # Parquet output: timestamps as UTC microsecond timestamps (Spark's default is the legacy INT96).
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # User SQL is data: Spark must not replace `${env:HOME}`, `${system:...}`, `${spark:...}` or `${hiveconf:...}`
    # in it (even inside string literals) with the service's environment, properties or settings.
    "spark.sql.variable.substitute": "false",
}

# The Connect server's own defaults (`connect_server.server_conf`; `iox-batch spark start --conf` overrides each):
# what one client's query may take from the shared JVM, and how soon work whose client is gone stops.
CONNECT_SERVER_CONF: Mapping[str, str] = {
    # A request (a plan, SQL and any local rows) and one Arrow batch of a result, far below Spark's defaults
    # (128 MiB each, 512 MiB of plan): the gate reads at most 4 MiB of SQL, and a result streams in batches.
    "spark.connect.grpc.maxInboundMessageSize": "32m",
    "spark.connect.maxPlanSize": "64m",
    "spark.connect.grpc.arrow.maxBatchSize": "16m",
    "spark.sql.execution.arrow.maxBytesPerBatch": "16m",
    # An operation no client is attached to (the client killed or its connection gone) is interrupted after this,
    # looked at this often (Spark's defaults: 5 minutes, every 30 s). The server notices a client gone only when
    # it ends the operation's response stream, which it does this often (Spark's default: 2 minutes), a live
    # client reattaching at once: so a killed client's query stops within about the sum of the three.
    "spark.connect.execute.manager.detachedTimeout": "5s",
    "spark.connect.execute.manager.maintenanceInterval": "2s",
    "spark.connect.execute.reattachable.senderMaxStreamDuration": "5s",
    # A session is released by its command at its end; a vanished client's holds only its views (its running work
    # stops as above) until Spark's idle timeout releases it (spark.connect.session.manager.defaultSessionTimeout,
    # an hour): shorter would close the session of a live client that is merely idle (an Airflow worker, a test
    # run's long-lived client) under it.
    # A cancelled task is watched until it ends; one still running a minute after its cancellation is logged as an
    # error (`.iox/spark-connect.log`). In local mode Spark never kills its JVM for it (that would end every
    # client's queries); on a cluster the executor holding it is restarted.
    "spark.task.reaper.enabled": "true",
    "spark.task.reaper.pollingInterval": "5s",
    "spark.task.reaper.killTimeout": "60s",
}

# Settings no configuration may change: with substitution on, a query's '${env:...}' reads the service's
# environment (the security model says a query reads the catalog's data and nothing else).
_FIXED_CONF: Mapping[str, str] = {"spark.sql.variable.substitute": "false"}

# The driver JVM exits on its first OutOfMemoryError, whatever else its options say. A JVM that ran out of memory
# is in no state to go on (the thread that hit it is gone with its locks and promises): left running, a result
# thread dead of it leaves the Python side waiting on a socket forever (`repeat('x', 2147483647)` folded by the
# optimizer did exactly that). Exiting turns the hang into a lost JVM, which the runner reports in one paragraph
# (`jvm_lost_error`). Only the JVM's own allocation failures count: Spark's SparkOutOfMemoryError (a task that
# cannot get execution memory) is thrown by Spark's code and still fails just that task.
EXIT_ON_OOM = "-XX:+ExitOnOutOfMemoryError"
# The exit statuses of a JVM that ran out of memory: HotSpot's ExitOnOutOfMemoryError, and Spark's own handler
# (SparkExitCode.OOM) for an executor or a local task thread.
OOM_EXIT_STATUSES = frozenset({3, 52})


STORE_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
             "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE",
             "AWS_SHARED_CREDENTIALS_FILE")
"""The standard settings a process reaches the object store with. Every Spark process gets them from its own
environment (spark-submit and the Connect server inherit the caller's, Python workers their JVM's, a standalone
cluster's executors their worker's), never as a Spark setting: a `--conf` is on a command line any user of the
machine can read, and Spark shows its settings in its UI and logs."""
_SECRET_VALUES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")

_SECRET_KEY = re.compile(
    r"secret|password|passwd|token|credential|access[._-]?key|session[._-]?key|"
    r"(?:executorEnv|appMasterEnv|driverEnv|driverSecretKeyRef|executorSecretKeyRef)\.AWS_", re.IGNORECASE)
"""A Spark setting that carries a credential (Hadoop's `fs.s3a.secret.key`, a token, an `AWS_*` environment
variable handed to executors): refused, so no secret reaches a command line, a plan or a state file."""


def _holds_secret(text: str) -> bool:
    return any(len(secret) >= 8 and secret in text for secret in (os.environ.get(n, "") for n in _SECRET_VALUES))


def check_not_secret(key: str, value: str, where: str) -> None:
    """Refuse a Spark setting `key=value` that names a credential or holds this process's AWS secret."""
    if _SECRET_KEY.search(key) or _holds_secret(key + value):
        shown = "<hidden>" if _holds_secret(key) else key[:80]
        raise BadInputError(
            f"{where} setting {shown} is refused: it would carry a credential on a command line and into logs; "
            "the object store's credentials come from the standard AWS_* settings (AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the default credential chain) in the environment of each "
            "process, which Spark's processes inherit")


def parse_spark_conf(text: str | None) -> dict[str, str]:
    """IOX_SPARK_CONF: `key=value` pairs separated by commas, semicolons or newlines (none carrying a
    credential: `check_not_secret`)."""
    out: dict[str, str] = {}
    for item in (text or "").replace(";", "\n").replace(",", "\n").splitlines():
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        check_not_secret(key.strip(), value.strip(), "IOX_SPARK_CONF")
        if not sep:
            raise BadInputError(f"IOX_SPARK_CONF entry {item[:80]!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def jobs_dir() -> Path:
    """Where every Spark job's script lives (`spark_jobs/` of the checkout): run_plan.py, run_parts.py,
    run_compact.py, run_bulk_load.py."""
    return project_root() / "spark_jobs"


def session_conf(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Spark settings of every iox-batch session: the defaults, then IOX_SPARK_CONF, then `extra`, then the
    fixed settings (applied last, so neither the user's conf nor `extra` can turn substitution back on)."""
    log4j = jobs_dir() / "log4j2.properties"
    conf = dict(DEFAULT_CONF)
    conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{log4j}"
    conf["spark.executor.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{log4j}"
    conf.update(parse_spark_conf(config.SPARK_CONF.read()))
    conf.update(extra or {})
    conf.update(_FIXED_CONF)
    driver_opts = conf.get("spark.driver.extraJavaOptions", "")
    if EXIT_ON_OOM not in driver_opts.split():
        conf["spark.driver.extraJavaOptions"] = f"{driver_opts} {EXIT_ON_OOM}".strip()
    return conf


def spark_master() -> str:
    """IOX_SPARK_MASTER, else `local[*]`."""
    return config.SPARK_MASTER.read() or "local[*]"


def spark_env() -> dict[str, str]:
    """What spark-submit and the job's Python need: the virtualenv's bin first on PATH (spark-submit lives there),
    its Python for the workers, the checkout on PYTHONPATH (spark_jobs, iox_planner). Laid over the caller's own
    environment, never instead of it: the object store's settings (`STORE_ENV`) reach Spark's processes that way."""
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


# A small job's driver JVM started for latency rather than throughput (C1 only, serial GC): on a job of a few
# seconds the JIT's warm-up dominates. A job's `fast_start` (`job_conf`) uses it.
FAST_START_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def fast_start_conf(conf: Mapping[str, str]) -> dict[str, str]:
    """`conf` with the fast-start JVM options added to the driver's."""
    key = "spark.driver.extraJavaOptions"
    return {**conf, key: f"{conf.get(key, '')} {FAST_START_JVM}".strip()}


def job_conf(fast_start: bool = False) -> dict[str, str]:
    """The Spark settings a spark-submit job gets, from the CLI (`submit.spark_submit_command`) and from the DAGs'
    operator alike: the session's, started for latency when `fast_start`."""
    conf = session_conf()
    return fast_start_conf(conf) if fast_start else conf
