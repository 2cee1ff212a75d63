"""The one operator iox-batch adds: an iox-batch Spark job, through spark-submit or over Spark Connect."""

from __future__ import annotations

import re
import shutil
import threading
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from iox_planner.errors import IoxError, QueryTimeoutError
from iox_planner.spark.budget import timeout_error
from iox_planner.spark.conf import FAST_START_JVM, job_conf, spark_env
from iox_planner.spark.jobs import JobSpec, parse_job
from iox_planner.spark.submit import SUBMIT_GRACE_S, job_failure, stop_job

from iox_airflow.spark import CONNECT_CONN_ID, SPARK_CONN_ID, ensure_spark_connection, uses_connect

_ERROR_LINE = re.compile(r"^error: (.+)$", re.MULTILINE)


class IoxSparkSubmitOperator(SparkSubmitOperator):
    """Run one iox-batch Spark job (a job spec of `iox_planner/spark/jobs.py`, given as its `operator_kwargs`:
    a plan, a fan-out part or merge, a compaction batch, a bulk load) with spark-submit, or over Spark Connect
    under IOX_RUNNER=connect.

    `__init__` only stores arguments. At execute time the operator skips when it has no job (a merge step of a plan
    that was not split) and removes whatever an earlier attempt left at the job's output and report (read from its
    arguments by the spec that wrote them, `jobs.parse_job`), so a retry reruns cleanly. When the job fails, its
    one-paragraph error is left beside its report (`<report>.error`) for the commit step to record.

    Over Spark Connect (`execute_connect`) the job runs in the task's process as the CLI's connect runner runs it
    (`spark_jobs/launch.py` `ConnectLauncher`: the same job wrapper, no JVM here), on the server the
    `iox_spark_connect` connection names (`iox_airflow/spark.py` `connect_remote`); its session ends with the
    task. The budget is the job's own: its operations on the server carry a tag the job interrupts at the budget
    (`spark_jobs/budget.py`). A lost server is the retryable `SparkUnavailableError`; a budget run out fails
    without retries, as below.

    Through spark-submit the operator derives `spark_default` from IOX_SPARK_MASTER and passes iox-batch's Spark
    settings (`iox_planner.spark.conf.session_conf`, which includes IOX_SPARK_CONF); the job's `error: ...` line
    is its error.

    `fast_start` (set by the plan task for small plans, see IOX_SPARK_FAST_START_ROWS) starts the driver JVM for
    latency rather than throughput: on a job of a few seconds the JIT's warm-up dominates (measured here: a small
    query's Spark job 16-20 s with the defaults, about 13.5 s with C1-only compilation and the serial GC).

    The budget: a query job (its spec's `budget()`, carried as `--timeout-s N`) still running `SUBMIT_GRACE_S` after
    its budget (it cancels itself at the budget; this is for a job that cannot) is stopped with every process under
    it (`spark/submit.py` `stop_job`), as `on_kill` does. spark-submit stays in the task's process group, which Airflow's
    supervisor signals whole. A job past its budget fails the task without retries (the same query would only
    run out of time again), its error saying how to give it more.
    """

    template_fields = (*SparkSubmitOperator.template_fields, "fast_start")
    ui_color = "#f4a261"
    FAST_START_JVM = FAST_START_JVM

    def __init__(self, *, application: str = "", application_args: list[str] | None = None,
                 conn_id: str = SPARK_CONN_ID, name: str = "iox-batch", fast_start: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(application=application, application_args=application_args, conn_id=conn_id, name=name,
                         **kwargs)
        self.fast_start = fast_start
        self._connect = False

    def execute(self, context: Any) -> None:
        if not self.application_args:
            raise AirflowSkipException("no Spark job to run here (the plan was not split, so there is no merge)")
        connect = self._connect = uses_connect()
        job = self.job() if connect else self.prepare_submit()
        report = job.report_path()
        output: Path | None = getattr(job, "output", None)
        for target in (output, report):
            if target is not None:
                _remove(target)
        error_file = report.with_name(report.name + ".error") if report is not None else None
        if error_file is not None:
            error_file.unlink(missing_ok=True)
        if connect:
            return self.execute_connect(job, error_file)
        budget = job.budget()
        done, expired = threading.Event(), threading.Event()
        if budget is not None:
            threading.Thread(target=self._stop_past_budget, args=(budget + SUBMIT_GRACE_S, done, expired),
                             name="iox-job-budget", daemon=True).start()
        try:
            super().execute(context)
        except Exception as err:
            proc = self._hook._submit_sp if self._hook is not None else None
            status = proc.returncode if proc is not None else None
            failure = (timeout_error(budget) if expired.is_set() and budget is not None
                       else job_failure(status, str(err), "the Spark job") if status is not None else None)
            found = _ERROR_LINE.findall(str(err))
            message = (str(failure) if failure is not None
                       else found[-1] if found else f"the Spark job failed: {_first_line(err)}")
            _failed(error_file, message, failure, err)
            raise
        finally:
            done.set()

    def job(self) -> JobSpec:
        """The job these arguments stand for (read back by the spec that wrote them: a bad one fails here)."""
        return parse_job(self.application, [str(a) for a in self.application_args or []])

    def prepare_submit(self) -> JobSpec:
        """The job (`job`), and the spark-submit it gets: the connection, the settings and environment the CLI's
        spark-submit of the same job gets (`submit.spark_submit_command`), then the task's own."""
        job = self.job()
        ensure_spark_connection(self._conn_id)
        self.conf = {**job_conf(job.starts_fast() or self.fast_start is True), **(self.conf or {})}
        self.env_vars = {**spark_env(), **(self.env_vars or {})}
        return job

    def execute_connect(self, job: JobSpec, error_file: Path | None) -> None:
        """`job` on the Spark Connect server of `iox_spark_connect` (see the class), its progress in the task's
        log; its session on the server ends with it."""
        from spark_jobs.connect import server_lost

        from iox_airflow.spark import connect_launcher

        url = None
        try:
            with connect_launcher(CONNECT_CONN_ID) as launcher:
                url = launcher.remote.url if launcher.remote is not None else None
                self.log.info("running %s on the Spark Connect server at %s", job.script, url)
                launcher.run(job)
        except Exception as err:
            from iox_planner.catalog.store import catalog_unavailable

            failure = err if isinstance(err, IoxError) else server_lost(err, url) or catalog_unavailable(err)
            message = str(failure) if failure is not None else f"the Spark job failed: {_first_line(err)}"
            _failed(error_file, message, failure, err)
            if failure is not None and failure is not err:
                raise failure from err
            raise

    def _stop_past_budget(self, seconds: float, done: threading.Event, expired: threading.Event) -> None:
        if done.wait(seconds):
            return
        expired.set()
        self._stop_job()

    def _stop_job(self) -> None:
        proc = self._hook._submit_sp if self._hook is not None else None
        if proc is not None:
            stop_job(proc)

    def on_kill(self) -> None:
        if self._connect:
            # The job's operations on the server are interrupted and its session ended (`connect.release`).
            from spark_jobs.connect import release_shared

            release_shared()
            return
        self._stop_job()
        super().on_kill()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _failed(error_file: Path | None, message: str, failure: BaseException | None, err: BaseException) -> None:
    """A failed job, either way: its one-paragraph `message` left beside its report for the commit step; a budget
    run out fails the task without retries (the same query would only run out of time again)."""
    if error_file is not None and error_file.parent.is_dir():
        error_file.write_text(message)
    if isinstance(failure, QueryTimeoutError):
        raise AirflowFailException(message) from err


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:500]
