"""Everything about reaching Spark that needs no Spark: the session settings, the master, the environment
spark-submit and the job's Python run in, the spark-submit command line and its run, and a query's wall-time
budget (the setting, its message, and the watchdog that stops a spark-submit job and everything under it). One place
for the CLI's runner (`cli/runner.py`), the Spark jobs' sessions (`spark_jobs/session.py`, `spark_jobs/budget.py`)
and the DAGs (`dags/iox_airflow/`). Imports no pyspark, so the DAG files can use it at parse time."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

from iox_planner.config import env_int, project_root
from iox_planner.errors import BadInputError, CatalogUnavailableError, IoxError, QueryTimeoutError

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
    driver_opts = conf.get("spark.driver.extraJavaOptions", "")
    if EXIT_ON_OOM not in driver_opts.split():
        conf["spark.driver.extraJavaOptions"] = f"{driver_opts} {EXIT_ON_OOM}".strip()
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
    error (`job_failure`). A query job (one with `--timeout-s N`) still running `SUBMIT_GRACE_S` after its budget
    (it cancels itself at the budget; this is for a job that cannot: a wedged JVM, a shutdown that hangs) is
    stopped with everything it started (`stop_job`) and fails with the budget's error; a job whose wait ends any
    other way (Ctrl-C) is stopped the same way. The job stays in this process's group, so whatever stops that
    group (a terminal, timeout(1), Airflow's supervisor) stops the job too."""
    budget = job_timeout_s(command)
    proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **spark_env()})
    try:
        stdout, stderr = proc.communicate(timeout=None if budget is None else budget + SUBMIT_GRACE_S)
    except subprocess.TimeoutExpired:
        stop_job(proc)
        proc.communicate()
        assert budget is not None
        raise timeout_error(budget) from None
    except BaseException:
        stop_job(proc)
        raise
    if proc.returncode != 0:
        # spark-submit runs a Python job with its standard error merged into its standard output.
        raise job_failure(proc.returncode, stderr + "\n" + stdout, what)


def job_failure(status: int, output: str, what: str = "spark-submit") -> IoxError:
    """The error of a Spark job that ended with `status`: its own last `error: ` line (exit 75, the retryable lost
    catalog, stays CatalogUnavailableError; 124, its budget, QueryTimeoutError); else a JVM that ran out of memory
    (`OOM_EXIT_STATUSES`) as `jvm_lost_error`; else `what` failed with the tail of its output."""
    errors = [line[len("error: "):] for line in output.splitlines() if line.startswith("error: ")]
    kinds: dict[int, type[IoxError]] = {CatalogUnavailableError.exit_code: CatalogUnavailableError,
                                        QueryTimeoutError.exit_code: QueryTimeoutError}
    if errors:
        return kinds.get(status, IoxError)(errors[-1])
    if status in OOM_EXIT_STATUSES:
        found = [line for line in output.splitlines() if "OutOfMemoryError" in line]
        return jvm_lost_error(status, found[-1].strip() if found else None)
    tail = " ".join(output.strip().splitlines()[-5:])
    return IoxError(f"{what} failed (exit {status}): {tail}")


# --- the query budget ------------------------------------------------------------------------------------------

QUERY_TIMEOUT_ENV = "IOX_QUERY_TIMEOUT_S"
# An hour: on this class of machine (2 cores: a plain scan about 4.4 M rows/s per core, a dedup about 0.7 M rows/s)
# that is billions of rows, more than any query here should need; an hourly materialization that needs longer
# cannot keep up with its schedule anyway. A run that really needs more says so (`--timeout`, `timeout_s`).
DEFAULT_QUERY_TIMEOUT_S = 3600
# A day: a query past that holds its worker, its run lock and its output's staging for longer than any schedule
# here; a number beyond it is a mistake (1e21 seconds is not a budget).
MAX_QUERY_TIMEOUT_S = 86_400
# The job argument that carries a query's budget to run_plan.py and run_parts.py: the one place every runner of a
# job (the CLI, `materialized refresh`, the Airflow operator) reads it from, so job and watchdog agree.
TIMEOUT_ARG = "--timeout-s"
# How long past its budget a spark-submit job may take before it is stopped from outside (`stop_job`): the
# job's own watchdog counts from its SparkSession, so this covers the JVM's start (10-20 s here under load) and
# stop, and the job's own cancellation.
SUBMIT_GRACE_S = 60
# After SIGTERM (JVM shutdown hooks remove Spark's temporary folders), how long before SIGKILL.
STOP_GRACE_S = 10


def query_timeout_s(value: object = None, what: str = "--timeout") -> int:
    """A query's wall-time budget in seconds: `value` (a CLI flag, a run's param, a definition's field; `what`
    names it in the error) when given, else IOX_QUERY_TIMEOUT_S, else an hour. Whole seconds from 1 to a day;
    anything else is a one-paragraph error."""
    if value is None:
        return env_int(QUERY_TIMEOUT_ENV, DEFAULT_QUERY_TIMEOUT_S, 1, MAX_QUERY_TIMEOUT_S)
    number = -1
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isdigit() and value.strip().isascii():
        number = int(value.strip())
    if not 1 <= number <= MAX_QUERY_TIMEOUT_S:
        shown = repr(value)[:40]
        raise BadInputError(f"{what} {shown} is not allowed; give whole seconds from 1 to {MAX_QUERY_TIMEOUT_S:,} "
                            f"(default: {QUERY_TIMEOUT_ENV}, or {DEFAULT_QUERY_TIMEOUT_S:,} when unset)")
    return number


def timeout_error(seconds: int) -> QueryTimeoutError:
    """The one wording of a query stopped at its budget, wherever it was stopped."""
    return QueryTimeoutError(
        f"the query ran past its time budget of {seconds:,} s and was cancelled; nothing was published. Give it "
        f"more time with --timeout SECONDS (iox-batch query, explain --analyze), the `timeout_s` param of a "
        f"triggered run or field of a materialized definition, or {QUERY_TIMEOUT_ENV} (default "
        f"{DEFAULT_QUERY_TIMEOUT_S:,}, at most {MAX_QUERY_TIMEOUT_S:,}); or make the query cheaper (a narrower "
        "time range, fewer tables or columns, a LIMIT)")


def jvm_lost_error(status: int | None, detail: str | None = None) -> IoxError:
    """The error of a query whose Spark driver JVM ended under it: ran out of memory (`OOM_EXIT_STATUSES`, with
    the JVM's own line in `detail` when known) or ended for another reason."""
    said = f" ({detail})" if detail else ""
    if status in OOM_EXIT_STATUSES:
        memory = session_conf().get("spark.driver.memory", "?")
        return IoxError(
            f"Spark's driver ran out of memory{said} and was stopped, so the query ended; nothing was published. "
            f"The query needs more than the driver's spark.driver.memory ({memory}): make it smaller (a narrower "
            "time range, fewer or smaller values per row, a LIMIT), or give the driver more memory with "
            "IOX_SPARK_CONF=spark.driver.memory=<size>")
    code = f"exit status {status}" if status is not None else "it is gone"
    return IoxError(f"Spark's driver JVM ended during the query ({code}){said}; nothing was published. Its log "
                    "says why (.iox/spark.log for the CLI's own session, the job's output under spark-submit)")


def job_timeout_s(args: Sequence[str]) -> int | None:
    """The budget a job's arguments carry (`TIMEOUT_ARG`), or None for jobs that are not queries."""
    args = list(args)
    for i, arg in enumerate(args[:-1]):
        if arg == TIMEOUT_ARG:
            return query_timeout_s(args[i + 1], TIMEOUT_ARG)
    return None


def stop_job(proc: subprocess.Popen[str]) -> None:
    """Stop a running spark-submit job and every process under it (the JVM, the Python driver, Spark's Python
    workers): SIGTERM (the JVM's shutdown hooks remove Spark's temporary folders), then SIGKILL to whatever is left
    after `STOP_GRACE_S`. The tree is read before the first signal: a process whose parent dies first is still
    reached. Nothing happens once `proc` has ended (its pid may belong to someone else by then)."""
    if proc.poll() is not None:
        return
    pids = [proc.pid, *_descendants(proc.pid)]
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        time.sleep(0.2)
        proc.poll()  # reaps the job: a zombie still counts as alive below
        if not any(_alive(pid) for pid in pids):
            return
    if proc.poll() is None:
        pids += _descendants(proc.pid)  # a worker forked meanwhile
    _signal_all([pid for pid in pids if _alive(pid)], signal.SIGKILL)


def _descendants(root: int) -> list[int]:
    """Every process below `root`, from /proc (parents read from each process's stat line)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    """Running: neither gone nor a zombie (dead, waiting to be reaped)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _signal_all(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
