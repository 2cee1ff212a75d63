"""Everything about reaching Spark that needs no Spark: the session settings, the master, the environment
spark-submit and the job's Python run in, and the spark-submit command line. One place for the CLI's runner
(`cli/runner.py`), the Spark jobs' sessions (`spark_jobs/session.py`) and the DAGs (`dags/iox_airflow/`).
Imports no pyspark, so the DAG files can use it at parse time."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

from iox_planner.config import project_root
from iox_planner.errors import BadInputError, CatalogUnavailableError, IoxError

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
    "spark.driver.memory": "2g",
    # Parquet output: timestamps as UTC microsecond timestamps (Spark's default is the legacy INT96).
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # User SQL is data: Spark must not replace `${env:HOME}`, `${system:...}`, `${spark:...}` or `${hiveconf:...}`
    # in it (even inside string literals) with the service's environment, properties or settings.
    "spark.sql.variable.substitute": "false",
}

# Settings no configuration may change: with substitution on, a query's '${env:...}' reads the service's
# environment (the security model says a query reads the catalog's data and nothing else).
_FIXED_CONF: Mapping[str, str] = {"spark.sql.variable.substitute": "false"}


def parse_spark_conf(text: str | None) -> dict[str, str]:
    """IOX_SPARK_CONF: `key=value` pairs separated by commas, semicolons or newlines."""
    out: dict[str, str] = {}
    for item in (text or "").replace(";", "\n").replace(",", "\n").splitlines():
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise BadInputError(f"IOX_SPARK_CONF entry {item!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def jobs_dir() -> Path:
    """Where every Spark job lives (`spark_jobs/` of the checkout): run_plan.py, run_parts.py."""
    return project_root() / "spark_jobs"


def session_conf(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Spark settings of every iox-batch session: the defaults, then IOX_SPARK_CONF, then `extra`, then the
    fixed settings (applied last, so neither the user's conf nor `extra` can turn substitution back on)."""
    log4j = jobs_dir() / "log4j2.properties"
    conf = dict(DEFAULT_CONF)
    conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{log4j}"
    conf["spark.executor.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{log4j}"
    conf.update(parse_spark_conf(os.environ.get("IOX_SPARK_CONF")))
    conf.update(extra or {})
    conf.update(_FIXED_CONF)
    return conf


def spark_master() -> str:
    """IOX_SPARK_MASTER, else `local[*]`."""
    return os.environ.get("IOX_SPARK_MASTER") or "local[*]"


def spark_env() -> dict[str, str]:
    """What spark-submit and the job's Python need: the virtualenv's bin first on PATH (spark-submit lives there),
    its Python for the workers, the checkout on PYTHONPATH (spark_jobs, iox_planner)."""
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
# seconds the JIT's warm-up dominates. IoxSparkSubmitOperator's `fast_start` and `spark_submit_command` use it.
FAST_START_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def fast_start_conf(conf: Mapping[str, str]) -> dict[str, str]:
    """`conf` with the fast-start JVM options added to the driver's."""
    key = "spark.driver.extraJavaOptions"
    return {**conf, key: f"{conf.get(key, '')} {FAST_START_JVM}".strip()}


def spark_submit_command(job: str, args: Sequence[str], *, fast_start: bool = False) -> list[str]:
    """spark-submit of the job `job` (a file in spark_jobs/) with iox-batch's settings and `args`. The DAGs pass
    the same settings (`session_conf`) and environment (`spark_env`) through SparkSubmitOperator."""
    submit = shutil.which("spark-submit") or str(Path(sys.executable).parent / "spark-submit")
    cmd = [submit, "--master", spark_master()]
    conf = session_conf()
    for key, value in (fast_start_conf(conf) if fast_start else conf).items():
        cmd += ["--conf", f"{key}={value}"]
    return [*cmd, str(jobs_dir() / job), *args]


def run_submit(command: Sequence[str], what: str = "spark-submit") -> None:
    """Run a spark-submit command with iox-batch's Spark environment; a failure becomes the job's own one-paragraph
    error (its last `error: ` line), or `what` failed with the tail of its standard error. A job's exit 75 (it lost
    the catalog, `spark_jobs/errors.py` `exit_status`) stays the retryable CatalogUnavailableError (exit 75)."""
    done = subprocess.run(list(command), capture_output=True, text=True, env={**os.environ, **spark_env()})
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
        # spark-submit runs a Python job with its standard error merged into its standard output.
        errors = errors or [line for line in done.stdout.splitlines() if line.startswith("error: ")]
        error = CatalogUnavailableError if done.returncode == CatalogUnavailableError.exit_code else IoxError
        if errors:
            raise error(errors[-1][len("error: "):])
        tail = " ".join(done.stderr.strip().splitlines()[-5:])
        raise IoxError(f"{what} failed (exit {done.returncode}): {tail}")
