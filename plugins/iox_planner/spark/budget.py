"""A query's wall-time budget, as far as it needs no Spark: the setting (IOX_QUERY_TIMEOUT_S, or a flag, a run's
param, a definition's field), the job argument that carries it, and the one wording of a query stopped at its
budget or by a lost JVM. The watchdog inside a driver is `spark_jobs/budget.py`; the one that stops a spark-submit
job from outside is `submit.py`."""

from __future__ import annotations

from iox_planner import config
from iox_planner.errors import BadInputError, IoxError, QueryTimeoutError
from iox_planner.spark.conf import OOM_EXIT_STATUSES, session_conf

QUERY_TIMEOUT_ENV = config.QUERY_TIMEOUT_S.name
# The default, an hour: on this class of machine (2 cores: a plain scan about 4.4 M rows/s per core, a dedup about
# 0.7 M rows/s) that is billions of rows, more than any query here should need; an hourly materialization that
# needs longer cannot keep up with its schedule anyway. A run that really needs more says so (`--timeout`,
# `timeout_s`).
DEFAULT_QUERY_TIMEOUT_S = config.QUERY_TIMEOUT_S.default
# At most a day: a query past that holds its worker, its run lock and its output's staging for longer than any
# schedule here; a number beyond it is a mistake (1e21 seconds is not a budget).
MAX_QUERY_TIMEOUT_S = config.QUERY_TIMEOUT_S.high
# The job argument that carries a query's budget to run_plan.py and run_parts.py (`jobs.py` writes and reads it),
# so a job and whoever watches it (the CLI's launcher, the Airflow operator) agree.
TIMEOUT_ARG = "--timeout-s"


def query_timeout_s(value: object = None, what: str = "--timeout") -> int:
    """A query's wall-time budget in seconds: `value` (a CLI flag, a run's param, a definition's field; `what`
    names it in the error) when given, else IOX_QUERY_TIMEOUT_S, else an hour. Whole seconds from 1 to a day;
    anything else is a one-paragraph error. Text is read by the registry's rule for whole numbers (`1_000`)."""
    if value is None:
        return config.QUERY_TIMEOUT_S.read()
    number = -1
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        number = config.whole_number(value) or -1
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
