"""How a job is launched: the runner setting (IOX_RUNNER, read and validated here and nowhere else), the one
interface every launcher offers (`Launcher`: run a job and get its report; fetch a plan's result back as Arrow),
and the launcher that runs a job through spark-submit (`SubmitLauncher`). The in-process launcher needs pyspark
and lives with the jobs (`spark_jobs/launch.py`, which also picks one by the setting), as does the Spark Connect
launcher (its session `spark_jobs/connect.py` `shared_remote`, on the server `server.py` manages or names).

The CLI and `iox-batch materialized refresh` launch through these; the DAGs run the same job specs with the same
settings (`jobs.py`, `conf.py`): with the Connect launcher under IOX_RUNNER=connect, else through spark-submit (their
operator, or `SubmitLauncher` in `iox_refresh`), never on a Spark session of an Airflow worker's own."""

from __future__ import annotations

import dataclasses
import json
import tempfile
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Protocol

from iox_planner import config
from iox_planner.output import OutputFormat
from iox_planner.spark.jobs import JobSpec, PlanJob
from iox_planner.spark.submit import run_submit, spark_submit_command


class Runner(str, Enum):
    """Where a job's Spark driver runs: a SparkSession in this process, a spark-submit job of its own, or a Spark
    Connect server (this process the client: no JVM here)."""

    IN_PROCESS = "in-process"
    SPARK_SUBMIT = "spark-submit"
    CONNECT = "connect"


def chosen_runner() -> Runner:
    """IOX_RUNNER (default in-process); any other word is a one-paragraph error naming the runners."""
    return Runner(config.RUNNER.read())


Progress = Callable[[str], None]


class Launcher(Protocol):
    runner: Runner

    def run(self, job: JobSpec) -> dict[str, Any]:
        """Run `job` to its end and return its report (also left at `job.report_path()` when that is set); a
        failure raises the job's own error, of the class the job exits with."""

    def fetch(self, job: PlanJob) -> Any:
        """Run a plan job and hand its result back as an Arrow table (cut at `job.limit_rows`), for printing: the
        job's `output` and `format` are the launcher's business."""


@dataclasses.dataclass
class SubmitLauncher:
    """Every job through spark-submit of its script (`jobs.JobSpec.application`, `args`), watched by
    `submit.run_submit` (a query job is stopped from outside past its budget); its report read from the file the
    job writes (a temporary one when the job names none)."""

    runner: Runner = Runner.SPARK_SUBMIT
    submit: Callable[..., None] = run_submit
    """`submit.run_submit`; a test may run the command's job another way."""

    def command(self, job: JobSpec) -> list[str]:
        """The spark-submit command line of `job`."""
        return spark_submit_command(job.application, job.args(), fast_start=job.starts_fast())

    def run(self, job: JobSpec) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="iox-job-") as tmp:
            if job.report_path() is None:
                job = dataclasses.replace(job, report=Path(tmp) / "report.json")  # type: ignore[call-arg]
            report = job.report_path()
            assert report is not None
            self.submit(self.command(job), f"spark-submit {job.script}", job.budget())
            return dict(json.loads(report.read_text()))

    def fetch(self, job: PlanJob) -> Any:
        import pyarrow as pa

        with tempfile.TemporaryDirectory(prefix="iox-run-") as tmp:
            target = Path(tmp) / "result.arrow"
            self.run(dataclasses.replace(job, format=OutputFormat.ARROW, output=target))
            with pa.memory_map(str(target)) as source:
                return pa.ipc.open_file(source).read_all()
