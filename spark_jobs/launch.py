"""The launchers that run a job in this process, through the same job wrapper and body spark-submit runs
(`job.py`): on its one SparkSession (`session.shared_session`), or on its one Spark Connect session
(`connect.shared_remote`); and `launcher`, the one place a caller (the CLI, `iox-batch materialized refresh`) gets
the launcher IOX_RUNNER names. The spark-submit launcher is
`iox_planner/spark/launch.py` (no pyspark)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from iox_planner.spark.jobs import JobSpec, PlanJob
from iox_planner.spark.launch import Launcher, Runner, SubmitLauncher, chosen_runner
from iox_planner.spark.server import Remote


def _stderr(line: str) -> None:
    import sys

    print(line, file=sys.stderr, flush=True)


@dataclasses.dataclass
class InProcessLauncher:
    """Jobs on this process's SparkSession, each through `job.run_job` as a spark-submit job would run; their
    progress lines go to `progress` (the CLI's console, which shows user text as text)."""

    progress: Callable[[str], None] = _stderr
    runner: Runner = Runner.IN_PROCESS

    def run(self, job: JobSpec) -> dict[str, Any]:
        from spark_jobs.job import run_job
        from spark_jobs.session import shared_session

        return dict(run_job(job, shared_session, self.progress))

    def fetch(self, job: PlanJob) -> Any:
        from spark_jobs import query_job
        from spark_jobs.job import run_job
        from spark_jobs.session import shared_session

        return run_job(dataclasses.replace(job, report=None), shared_session, self.progress, query_job.collect)


@dataclasses.dataclass
class ConnectLauncher:
    """Jobs through the same wrapper as in-process, on this process's Spark Connect session (`connect.py`
    `shared_remote`, on `remote` when given: an Airflow task's connection): queries, compaction and the bulk load
    (their tasks ride a `spark.range` mapped in Arrow, `errors.run_tasks`, as a Connect session has no
    `sparkContext.parallelize`)."""

    progress: Callable[[str], None] = _stderr
    runner: Runner = Runner.CONNECT
    remote: Remote | None = None

    def _session(self) -> Any:
        from spark_jobs.connect import shared_remote

        return shared_remote(self.remote)

    def run(self, job: JobSpec) -> dict[str, Any]:
        from spark_jobs.job import run_job

        return dict(run_job(job, self._session, self.progress))

    def fetch(self, job: PlanJob) -> Any:
        from spark_jobs import query_job
        from spark_jobs.job import run_job

        return run_job(dataclasses.replace(job, report=None), self._session, self.progress, query_job.collect)


def launcher(runner: Runner | None = None, progress: Callable[[str], None] = _stderr) -> Launcher:
    """The launcher of `runner` (default: IOX_RUNNER's)."""
    chosen = chosen_runner() if runner is None else runner
    if chosen is Runner.SPARK_SUBMIT:
        return SubmitLauncher()
    if chosen is Runner.CONNECT:
        return ConnectLauncher(progress)
    return InProcessLauncher(progress)


def analysis_session() -> Any:
    """The session EXPLAIN ANALYZE runs a plan on, node by node, in this process: the Connect session under
    IOX_RUNNER=connect, else this process's own (spark-submit has no session to walk)."""
    if chosen_runner() is Runner.CONNECT:
        from spark_jobs.connect import shared_remote

        return shared_remote()
    from spark_jobs.session import shared_session

    return shared_session()
