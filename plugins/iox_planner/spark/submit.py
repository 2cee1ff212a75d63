"""spark-submit, as the CLI's launcher and `materialized refresh` run it: the command line of a job (the DAGs'
operator builds the same from the same settings), its run with iox-batch's Spark environment, a failed job's own
error read back as the error of the tree it exited with, and the stop of a job (with every process under it) that
outlives its budget or whose caller is interrupted. No pyspark."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from iox_planner.errors import IoxError, error_for_status
from iox_planner.spark.budget import jvm_lost_error, timeout_error
from iox_planner.spark.conf import OOM_EXIT_STATUSES, job_conf, spark_env, spark_master

# How long past its budget a spark-submit job may take before it is stopped from outside (`stop_job`): the
# job's own watchdog counts from its SparkSession, so this covers the JVM's start (10-20 s here under load) and
# stop, and the job's own cancellation.
SUBMIT_GRACE_S = 60
# After SIGTERM (JVM shutdown hooks remove Spark's temporary folders), how long before SIGKILL.
STOP_GRACE_S = 10


def spark_submit_command(application: Path, args: Sequence[str], *, fast_start: bool = False) -> list[str]:
    """spark-submit of `application` (a job script, `jobs.JobSpec.application`) with iox-batch's settings and
    `args` (`jobs.JobSpec.args`). The DAGs' operator passes the same master, settings (`job_conf`) and environment
    (`spark_env`) through SparkSubmitOperator."""
    submit = shutil.which("spark-submit") or str(Path(sys.executable).parent / "spark-submit")
    cmd = [submit, "--master", spark_master()]
    for key, value in job_conf(fast_start).items():
        cmd += ["--conf", f"{key}={value}"]
    return [*cmd, str(application), *args]


def run_submit(command: Sequence[str], what: str = "spark-submit", budget: int | None = None) -> None:
    """Run a spark-submit command with iox-batch's Spark environment; a failure becomes the job's own one-paragraph
    error (`job_failure`). A query job (its `budget` in seconds) still running `SUBMIT_GRACE_S` after its budget
    (it cancels itself at the budget; this is for a job that cannot: a wedged JVM, a shutdown that hangs) is
    stopped with everything it started (`stop_job`) and fails with the budget's error; a job whose wait ends any
    other way (Ctrl-C) is stopped the same way. The job stays in this process's group, so whatever stops that
    group (a terminal, timeout(1), Airflow's supervisor) stops the job too."""
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
    """The error of a Spark job that ended with `status`: its own last `error: ` line, as the error of the tree
    whose exit status that is (`errors.error_for_status`: a bad input stays a bad input, 75 the retryable lost
    catalog, 124 its budget), so the caller exits as it would have in-process; else a JVM that ran out of memory
    (`OOM_EXIT_STATUSES`) as `jvm_lost_error`; else `what` failed with the tail of its output."""
    errors = [line[len("error: "):] for line in output.splitlines() if line.startswith("error: ")]
    if errors:
        return error_for_status(status, errors[-1])
    if status in OOM_EXIT_STATUSES:
        found = [line for line in output.splitlines() if "OutOfMemoryError" in line]
        return jvm_lost_error(status, found[-1].strip() if found else None)
    tail = " ".join(output.strip().splitlines()[-5:])
    return IoxError(f"{what} failed (exit {status}): {tail}")


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
