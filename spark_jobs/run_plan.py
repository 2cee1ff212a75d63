"""spark-submit entry point: execute a serialized iox-batch plan and write its result.

    spark-submit spark_jobs/run_plan.py --plan plan.json --warehouse DIR --format jsonl --output out.jsonl

`--format arrow` writes an Arrow IPC file (how `iox-batch query` reads a result back to print it); `--limit-rows N`
cuts the result at N rows (the CLI's bound on printed results). `--timeout-s N` is the query's wall-time budget
(default IOX_QUERY_TIMEOUT_S): past it the job's Spark jobs are cancelled (`spark_jobs/budget.py`). Exit status 0
on success; on failure a one-paragraph `error: ...` on standard error and status 1 (124: past its budget), with
nothing published.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable


def main(argv: list[str] | None = None) -> int:
    from iox_planner.output import JOB_FORMATS

    parser = argparse.ArgumentParser(prog="run_plan.py")
    parser.add_argument("--plan", required=True, help="plan JSON file (iox-batch explain --format json)")
    parser.add_argument("--warehouse", required=True)
    parser.add_argument("--format", required=True, choices=[f.value for f in JOB_FORMATS])
    parser.add_argument("--output", required=True)
    parser.add_argument("--strategy", default=None, choices=["arrow", "shared", "window", "node"],
                        help="how dedups run (default: IOX_DEDUP_STRATEGY or arrow)")
    parser.add_argument("--metrics", help="write {\"rows\": N} here as JSON")
    add_timeout_arg(parser)
    parser.add_argument("--limit-rows", type=int, help="at most this many result rows (the CLI's print bound)")
    args = parser.parse_args(argv)

    return run_job(args.plan, "iox-batch run_plan", lambda spark, plan: run(plan, spark, args), args.metrics,
                   args.timeout_s)


def add_timeout_arg(parser: argparse.ArgumentParser) -> None:
    """`--timeout-s SECONDS`, the budget every query job takes (the runners read the same argument to stop a job
    that outlives it: `sparkconf.job_timeout_s`)."""
    from iox_planner.sparkconf import TIMEOUT_ARG

    parser.add_argument(TIMEOUT_ARG, dest="timeout_s", metavar="SECONDS",
                        help="wall-time budget of the query (default IOX_QUERY_TIMEOUT_S)")


def run_job(plan_file: str, app: str, work: Callable[[Any, Any], int], metrics: str | None,
            timeout_s: str | None = None) -> int:
    """What every iox-batch spark-submit job does around its work: load the plan, start the session, run the
    work within the query's budget (`timeout_s`, else IOX_QUERY_TIMEOUT_S), turn Spark's errors into one
    paragraph, write `{"rows": N}` to `metrics`. Returns the exit status (through `errors.exit_status`, so the
    message is clipped like every other job's)."""
    from spark_jobs.errors import exit_status

    def job() -> int:
        from iox_planner.sparkconf import TIMEOUT_ARG, query_timeout_s
        from spark_jobs.budget import query_budget
        from spark_jobs.errors import spark_errors
        from spark_jobs.session import build_session

        plan = load_plan(plan_file)
        budget = query_timeout_s(timeout_s, TIMEOUT_ARG)
        spark = build_session(app=app)
        with spark_errors(plan), query_budget(spark, budget):
            rows = work(spark, plan)
        if metrics:
            Path(metrics).write_text(json.dumps({"rows": rows}))
        spark.stop()
        return 0

    return exit_status(job)


def load_plan(plan_file: str) -> Any:
    """The plan a job runs, or a BadInputError naming the file: a missing, unreadable or foreign plan file is the
    job's input being wrong, not a reason for a traceback."""
    from iox_planner.errors import BadInputError, IoxError
    from iox_planner.planner.serde import plan_from_json

    try:
        return plan_from_json(Path(plan_file).read_text())
    except IoxError as err:  # read, but not a valid plan
        raise BadInputError(f"--plan {plan_file!r} is not a plan iox-batch wrote: {err}") from None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError, IndexError) as err:
        raise BadInputError(f"--plan {plan_file!r} is not a plan iox-batch wrote ({type(err).__name__}: {err})"
                            ) from None


def run(plan: Any, spark: Any, args: argparse.Namespace) -> int:
    from spark_jobs.execute import execute
    from spark_jobs.load import write_result

    execution = execute(spark, plan, Path(args.warehouse), strategy=args.strategy)
    result = execution.result
    limit = getattr(args, "limit_rows", None)  # absent when a test calls run() with its own arguments
    if limit is not None:
        result = result.limit(limit)
    return write_result(result, args.format, Path(args.output), sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
