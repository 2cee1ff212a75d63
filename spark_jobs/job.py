"""The one wrapper every Spark job runs in: `main` when spark-submit starts a job's script, `run_job` when a
launcher runs the job in its own process (`launch.py`). Either way it reads the job's spec
(`iox_planner/spark/jobs.py`), loads its input (a plan, before any Spark session starts), builds the session on
first use (a compaction of promotions only needs none), runs the job's body (a query job within its wall-time
budget, Spark's errors as one paragraph), and writes the job's report atomically, after removing what an earlier
try left there. `main` then exits with the status of the error, if any (errors.py's one mapping, the one the CLI
exits with)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from iox_planner.spark.jobs import BulkLoadJob, CompactJob, JobSpec, MergeJob, PartJob, PlanJob, parse_job
from spark_jobs.context import JobContext

Body = Callable[[JobContext], dict[str, Any]]


def _bodies() -> dict[type[JobSpec], Body]:
    from spark_jobs import bulk_job, compact_job, query_job

    return {PlanJob: query_job.run_plan, PartJob: query_job.run_part, MergeJob: query_job.run_merge,
            CompactJob: compact_job.run_compact, BulkLoadJob: bulk_job.run_bulk_load}


def run_job(job: JobSpec, make_session: Callable[[], Any], progress: Callable[[str], None],
            body: Callable[[JobContext], Any] | None = None) -> Any:
    """Run `job` (its kind's body, or `body`) and return what the body returns: the job's report, also written
    to `job.report_path()`. Raises the job's error (an IoxError for anything the user can act on)."""
    report = job.report_path()
    if report is not None:
        report.unlink(missing_ok=True)  # a report of an earlier try must not stand for this one
    ctx = JobContext(job, progress, make_session)
    work = body or _bodies()[type(job)]
    budget = job.budget()
    if budget is None:
        done = work(ctx)
    else:
        from spark_jobs.budget import query_budget
        from spark_jobs.errors import spark_errors

        ctx.plan = load_plan(job)  # read before a session starts: a bad plan file costs no JVM
        with spark_errors(ctx.plan), query_budget(ctx.session(), budget):
            done = work(ctx)
    if report is not None:
        from iox_planner.storage import write_json_atomic

        write_json_atomic(done, report)
    return done


def load_plan(job: JobSpec) -> Any:
    """The plan a query job runs, or a BadInputError naming the file: a missing, unreadable or foreign plan file is
    the job's input being wrong, not a reason for a traceback."""
    from iox_planner.errors import BadInputError, IoxError
    from iox_planner.planner.serde import plan_from_json

    plan_file: Path = getattr(job, "plan")
    try:
        return plan_from_json(plan_file.read_text())
    except IoxError as err:  # read, but not a valid plan
        raise BadInputError(f"--plan {str(plan_file)!r} is not a plan iox-batch wrote: {err}") from None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError, IndexError) as err:
        raise BadInputError(f"--plan {str(plan_file)!r} is not a plan iox-batch wrote ({type(err).__name__}: "
                            f"{err})") from None


def main(script: str, argv: Sequence[str] | None = None) -> int:
    """A job script's entry point: its spec from `argv`, its own session (stopped when the job succeeds), progress on
    standard error; the exit status of its error, if any."""
    from spark_jobs.errors import exit_status

    def work() -> int:
        from spark_jobs.session import build_session

        job = parse_job(script, sys.argv[1:] if argv is None else argv)
        sessions: list[Any] = []

        def session() -> Any:
            sessions.append(build_session(app=job.app))
            return sessions[-1]

        run_job(job, session, lambda line: print(line, file=sys.stderr, flush=True))
        for spark in sessions:
            spark.stop()
        return 0

    return exit_status(work)
