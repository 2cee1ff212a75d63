"""Spark's exceptions as iox-batch errors: one paragraph, in the user's terms (no Java or Python traceback)."""

from __future__ import annotations

import re
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from iox_planner.errors import CatalogError, IoxError, error_named
from iox_planner.model import HIDDEN_PREFIX, NS_PREFIX, TIME_NS, VIEW_PREFIX
from iox_planner.planner.nodes import QueryPlan
from iox_planner.planner.sql.guards import GUARD_MARKER


@contextmanager
def spark_errors(plan: QueryPlan | None = None) -> Iterator[None]:
    """Spark's exceptions as iox-batch errors: one paragraph naming what went wrong, in the user's terms.

    Spark's message is kept to its error class and first sentence (what follows is its plan, the query text with a
    caret, and suggestions, all in terms of iox-batch's internals); view names become the user's table names and
    internal columns (`__time_ns`, `__iox_ns_x`, ...) the columns they stand for."""
    from pyspark.errors import PySparkException

    from iox_planner.config import DEBUG
    from iox_planner.errors import BadQueryError

    try:
        yield
    except IoxError:
        raise
    except PySparkException as err:
        condition = err.getCondition() if hasattr(err, "getCondition") else None
        guard = guard_message(str(err))
        if guard is not None:
            raise BadQueryError(guard) from err
        too_deep = query_too_deep(str(err))
        if too_deep is not None:
            raise BadQueryError(f"the query failed on Spark: {too_deep}") from err
        raised = raised_in_worker(str(err))
        if raised is not None:
            raise raised from err
        text = _with_hint(sanitize_spark_message(str(err), plan))
        if condition and ("CANNOT_READ" in condition or "FILE" in condition or "PARQUET" in condition):
            raise CatalogError(f"reading a chunk file failed: {text}") from err
        raise BadQueryError(f"the query failed on Spark: {text}") from err
    except Exception as err:
        # py4j ships no type information; its error class is known by name.
        if type(err).__name__ != "Py4JJavaError" or DEBUG.read():
            raise
        guard = guard_message(str(err))
        if guard is not None:
            raise BadQueryError(guard) from err
        raised = raised_in_worker(str(err))
        if raised is not None:
            raise raised from err
        java = java_message(str(err))
        too_deep = query_too_deep(java)
        if too_deep is not None:
            raise BadQueryError(f"the query failed on Spark: {too_deep}") from err
        raise IoxError(f"the query failed on Spark: {_with_hint(sanitize_spark_message(java, plan))}") from err


_CAUSED_BY = "Caused by: "
_GUARD = re.compile(r"\[USER_RAISED_EXCEPTION\]\s*" + re.escape(GUARD_MARKER) + r"(.*?)(?:\s+SQLSTATE:|\n|$)")


def guard_message(text: str) -> str | None:
    """The planner's size guard's own paragraph when it is what failed the query (`planner/sql/guards.py`: a size
    computed from the data past IOX_MAX_SQL_ALLOC), wherever Spark wraps it (a task's failure, a Connect error)."""
    found = _GUARD.search(text)
    return f"the query stopped at a size guard: {found.group(1).strip()}" if found else None



def java_message(text: str) -> str:
    """The first line of a JVM exception PySpark does not convert, whose text is "An error occurred while calling
    oN.x.\n: <java class>: <message>" and the Java stack. When that line only wraps another exception (Spark's
    "Exception thrown in awaitResult:", which says that a thread of the query failed, and nothing of why), the
    first line of its cause instead."""
    lines = [line for line in text.splitlines() if line.strip()]
    java = lines[1].lstrip(": ").strip() if len(lines) > 1 else (lines[0] if lines else "")
    if java.endswith(":"):
        cause = next((line.strip()[len(_CAUSED_BY):] for line in lines if line.strip().startswith(_CAUSED_BY)), "")
        java = cause or java
    return java


# Spark's words for the two ways a query is too deep for it (its hints name SQL and settings iox-batch does not
# take: `MAX RECURSION LEVEL`, a LIMIT on the CTE, `spark.sql.analyzer.maxIterations` as a session setting).
_RECURSION = re.compile(r"\[RECURSION_(LEVEL|ROW)_LIMIT_EXCEEDED\]\D*([0-9]+)")
_MAX_ITERATIONS = re.compile(r"Max iterations \(([0-9]+)\) reached for batch (\w+)")


def query_too_deep(text: str) -> str | None:
    """One paragraph saying what is wrong with the query when Spark's message (`text`) is one of its bounds on
    depth: a WITH RECURSIVE that did not end, or a query its analyzer gave up on; else None."""
    recursion = _RECURSION.search(text)
    if recursion:
        level = recursion.group(1) == "LEVEL"
        bound, setting = ("levels", "cteRecursionLevelLimit") if level else ("rows", "cteRecursionRowLimit")
        return (f"WITH RECURSIVE did not end: its recursive part was still producing rows after "
                f"{int(recursion.group(2)):,} {bound}, Spark's bound on a recursive query. Give the recursive part a "
                f"condition that stops it (WHERE n < 10); if it does end, but later, raise spark.sql.{setting} "
                "with IOX_SPARK_CONF")
    iterations = _MAX_ITERATIONS.search(text)
    if iterations:
        return (f"the query is nested too deeply for Spark's analyzer, which gave up after "
                f"{int(iterations.group(1)):,} rounds of {iterations.group(2).lower()} (a long chain of WITH "
                "queries or subqueries, each reading the one before, does this). Flatten the chain or split the "
                "query; or raise spark.sql.analyzer.maxIterations with IOX_SPARK_CONF")
    return None


def _with_hint(text: str) -> str:
    """Spark's message, with what to do when it is one of the bounds iox-batch sets (spark/conf.py DEFAULT_CONF)."""
    if "spark.driver.maxResultSize" in text:
        return (f"{text}; the result is larger than one query may collect on the driver: write it with --format "
                "parquet --output PATH (written by Spark's executors, never collected), or raise "
                "spark.driver.maxResultSize (and spark.driver.memory) with IOX_SPARK_CONF")
    return text


_ERROR_CLASS = re.compile(r"^\s*(\[[A-Z0-9_.]+\])\s*")
_FIRST_SENTENCE = re.compile(r"^(.*?[.!?])(?=\s|$)")
_SCAN_VIEW = re.compile(rf"`?{VIEW_PREFIX}(\d+)`?")
_FORMATTER_TYPE = re.compile(r"([a-zA-Z]) != ([\w.$]+)")
_JAVA_TYPES = {"UTF8String": "string", "Integer": "int", "Long": "bigint", "Double": "double", "Float": "float",
               "Boolean": "boolean", "Short": "smallint", "Byte": "tinyint", "Decimal": "decimal"}
_VIEW_NS = re.compile(rf"`?{VIEW_PREFIX}\d+{TIME_NS}`?")


def sanitize_spark_message(message: str, plan: QueryPlan | None = None) -> str:
    """Spark's error class and first sentence, on one line, with iox-batch's internal names mapped back."""
    first_line = message.strip().split("\n", 1)[0]
    match = _ERROR_CLASS.match(first_line)
    error_class = match.group(1) + " " if match else ""
    rest = first_line[match.end():] if match else first_line
    rest = re.split(r"\s*SQLSTATE:|;\s*line \d+ pos \d+|\s*== SQL", rest, maxsplit=1)[0]
    formatter = _FORMATTER_TYPE.fullmatch(rest.strip())
    if formatter:
        # Java's Formatter says only `d != org.apache.spark.unsafe.types.UTF8String`: a value of the wrong type for
        # a format_string/printf specifier (a format that is a constant is checked when planning).
        java = formatter.group(2).rsplit(".", 1)[-1]
        return (f"format_string/printf: the specifier %{formatter.group(1)} does not fit its value, a "
                f"{_JAVA_TYPES.get(java, java)}; cast the value or use %s")
    sentence = _FIRST_SENTENCE.match(rest)
    text = (sentence.group(1) if sentence else rest).strip()
    views = {scan.view: scan.table for scan in plan.scans} if plan is not None else {}

    def view_name(found: re.Match[str]) -> str:
        view = f"{VIEW_PREFIX}{found.group(1)}"
        return f"`{views[view]}`" if view in views else "a table of the query"

    text = _VIEW_NS.sub("time", text)
    text = _SCAN_VIEW.sub(view_name, text)
    text = re.sub(rf"{NS_PREFIX}(\w+)", r"\1", text)
    text = re.sub(rf"{HIDDEN_PREFIX}\d+|{TIME_NS}", "time", text)
    text = re.sub(r"__chunk_order|__seq|MapInArrow\w*|mapInArrow", "(internal)", text)
    if len(text) > 600:
        text = text[:600] + "..."
    return error_class + (text or "Spark gave no message")


def run_tasks(spark: Any, payloads: Sequence[Any], task: Callable[[Any], Any], description: str,
              failed: str) -> list[Any]:
    """Run `task` over `payloads`, one Spark task each, in one Spark job (compaction's slices, the bulk load's
    ranges). A failing task fails the job; it is raised as `"<failed>: <the worker's error message>"`, one
    paragraph, of the worker's own class when that is one of the error tree's (a bad input in a worker stays a bad
    input, with its exit status), else a CatalogError (a file a worker could not read or write). IOX_DEBUG keeps
    Spark's own exception."""
    from iox_planner.config import DEBUG

    from spark_jobs.connect import is_remote

    if not payloads:
        return []
    try:
        if is_remote(spark):
            return _run_over_connect(spark, list(payloads), task)
        sc = spark.sparkContext
        sc.setJobDescription(description)
        return list(sc.parallelize(list(payloads), len(payloads)).map(task).collect())
    except Exception as err:  # noqa: BLE001 - Spark's errors as one paragraph
        if DEBUG.read():
            raise
        kind, message = worker_error(err)
        raise (kind or CatalogError)(f"{failed}: {message}") from err


def _run_over_connect(spark: Any, payloads: list[Any], task: Callable[[Any], Any]) -> list[Any]:
    """`run_tasks` on a Spark Connect session, which has no sparkContext to parallelize with: `spark.range` over
    the payloads' indexes, one partition (so one task) each, mapped in Arrow by a function that carries the
    payloads (serialized with it, as parallelize would ship them) and returns each task's result pickled. The
    results come back in the payloads' order; they are this code's own, from the server's workers."""
    import pickle

    def each(batches: Any) -> Any:
        import pyarrow as pa

        for batch in batches:
            ids = batch.column("id").to_pylist()
            yield pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.int64()),
                                              "result": pa.array([pickle.dumps(task(payloads[i])) for i in ids],
                                                                 pa.binary())})

    count = len(payloads)
    rows = spark.range(0, count, 1, count).mapInArrow(each, "id long, result binary").collect()
    done = {int(row["id"]): pickle.loads(row["result"]) for row in rows}
    return [done[i] for i in range(count)]


def default_parallelism(spark: Any) -> int:
    """How many tasks the session runs at once: its SparkContext's default parallelism, or over Spark Connect (no
    SparkContext here) the number of partitions the server gives a range by default, which is that same number."""
    from spark_jobs.connect import is_remote

    if not is_remote(spark):
        return int(spark.sparkContext.defaultParallelism)
    from pyspark.sql import functions as F

    parts = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p")).agg(F.max("p").alias("n"))
    return int(parts.first()["n"]) + 1


def raised_in_worker(text: str) -> IoxError | None:
    """The error a Python worker of this code raised (a chunk file the warehouse lacks, the object store not
    answering: `store_read`), as itself, when Spark's message carries its line; None for any other failure."""
    kind, message = worker_error(Exception(text))
    if kind is None or "Traceback" not in text:
        return None
    return kind(message)


def worker_error(err: Exception) -> tuple[type[IoxError] | None, str]:
    """The Python worker's own error (its class, when the error tree has it, and its message) when its line is in
    Spark's message (`iox_planner.errors.BadInputError: ...`), else (None, the worker's error line, or the first
    line of Spark's message); never a traceback."""
    text = str(err)
    found = re.findall(r"^([A-Za-z_.]+(?:Error|Exception)): (.+)$", text, flags=re.M)
    if not found:
        return None, (text.strip().splitlines() or [type(err).__name__])[0][:500]
    name, message = found[-1]
    kind = error_named(name.rsplit(".", 1)[-1])
    return kind, (message if kind is not None else f"{name}: {message}")[:500]


def exit_status(work: Callable[[], int]) -> int:
    """A spark-submit job's exit status: `work()`'s, or, after printing the error as one clipped paragraph on
    standard error (what `spark/submit.py` `job_failure` reads back), the error's own exit status, the one the CLI
    would exit with (`errors.py`: 2 a bad input, 3 the catalog, 75 the catalog unreachable, 124 past the budget...):
    spark-submit passes the Python job's status on, so an Airflow task, the CLI's launcher or a script sees each as
    such. SQLAlchemy's own error (a connection dropped mid-job, outside the places that already convert it) is read
    the same way, without its traceback."""
    from iox_planner.catalog.store import catalog_unavailable
    from iox_planner.config import DEBUG
    from iox_planner.errors import clip_message

    try:
        return work()
    except IoxError as err:
        print(clip_message(f"error: {err}"), file=sys.stderr)
        return err.exit_code
    except Exception as err:
        lost = catalog_unavailable(err)
        if lost is None or DEBUG.read():
            raise
        print(clip_message(f"error: {lost}"), file=sys.stderr)
        return lost.exit_code
