"""The launcher that runs a job in this process, on its one SparkSession (`session.shared_session`), through the
same job wrapper and body spark-submit runs (`job.py`); and `launcher`, the one place a caller (the CLI,
`iox-batch materialized refresh`) gets the launcher IOX_RUNNER names. The spark-submit launcher is
`iox_planner/spark/launch.py` (no pyspark)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from iox_planner.spark.jobs import JobSpec, PlanJob
from iox_planner.spark.launch import Launcher, Runner, SubmitLauncher, chosen_runner


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


def launcher(runner: Runner | None = None, progress: Callable[[str], None] = _stderr) -> Launcher:
    """The launcher of `runner` (default: IOX_RUNNER's)."""
    chosen = chosen_runner() if runner is None else runner
    if chosen is Runner.SPARK_SUBMIT:
        return SubmitLauncher()
    return InProcessLauncher(progress)
