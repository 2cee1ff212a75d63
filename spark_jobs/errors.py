"""Spark's exceptions as iox-batch errors: one paragraph, in the user's terms (no Java or Python traceback)."""

from __future__ import annotations

import os
import re
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from iox_planner.errors import CatalogError
from iox_planner.model import HIDDEN_PREFIX, NS_PREFIX, TIME_NS, VIEW_PREFIX
from iox_planner.planner.nodes import QueryPlan


@contextmanager
def spark_errors(plan: QueryPlan | None = None) -> Iterator[None]:
    """Spark's exceptions as iox-batch errors: one paragraph naming what went wrong, in the user's terms.

    Spark's message is kept to its error class and first sentence (what follows is its plan, the query text with a
    caret, and suggestions, all in terms of iox-batch's internals); view names become the user's table names and
    internal columns (`__time_ns`, `__iox_ns_x`, ...) the columns they stand for."""
    from pyspark.errors import PySparkException

    from iox_planner.errors import BadQueryError, IoxError

    try:
        yield
    except IoxError:
        raise
    except PySparkException as err:
        condition = err.getCondition() if hasattr(err, "getCondition") else None
        text = _with_hint(sanitize_spark_message(str(err), plan))
        if condition and ("CANNOT_READ" in condition or "FILE" in condition or "PARQUET" in condition):
            raise CatalogError(f"reading a chunk file failed: {text}") from err
        raise BadQueryError(f"the query failed on Spark: {text}") from err
    except Exception as err:
        # py4j ships no type information; its error class is known by name.
        if type(err).__name__ != "Py4JJavaError" or os.environ.get("IOX_DEBUG"):
            raise
        # A JVM exception PySpark does not convert: its text is "An error occurred while calling oN.x.\n:
        # <java class>: <message>" followed by the Java stack. Keep the exception's own first line.
        lines = [line for line in str(err).splitlines() if line.strip()]
        java = lines[1].lstrip(": ").strip() if len(lines) > 1 else (lines[0] if lines else "")
        raise IoxError(f"the query failed on Spark: {_with_hint(sanitize_spark_message(java, plan))}") from err


def _with_hint(text: str) -> str:
    """Spark's message, with what to do when it is one of the bounds iox-batch sets (sparkconf.DEFAULT_CONF)."""
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
    ranges). A failing task fails the job; it is raised as a CatalogError `"<failed>: <the worker's error line>"`,
    one paragraph (IOX_DEBUG keeps Spark's own exception)."""
    if not payloads:
        return []
    sc = spark.sparkContext
    sc.setJobDescription(description)
    try:
        return list(sc.parallelize(list(payloads), len(payloads)).map(task).collect())
    except Exception as err:  # noqa: BLE001 - Spark's errors as one paragraph
        if os.environ.get("IOX_DEBUG"):
            raise
        raise CatalogError(f"{failed}: {first_error(err)}") from err


def first_error(err: Exception) -> str:
    """The Python worker's own error line (e.g. `CatalogError: ...`, `FileNotFoundError: ...`) when there is one,
    else the first line of Spark's message; never a traceback."""
    text = str(err)
    found = re.findall(r"^(?:[A-Za-z_.]+(?:Error|Exception)): .+$", text, flags=re.M)
    line = found[-1] if found else (text.strip().splitlines() or [type(err).__name__])[0]
    return line[:500]


def exit_status(work: Callable[[], int]) -> int:
    """A spark-submit job's exit status: `work()`'s, or 1 after printing an IoxError as one clipped paragraph on
    standard error (what `sparkconf.run_submit` reports to the user). A lost or refused catalog connection is 75
    (CatalogUnavailableError's EX_TEMPFAIL) and a query past its budget 124 (QueryTimeoutError), as the CLI has
    them: spark-submit passes the Python job's status on, so an Airflow task or a script sees either as such. SQLAlchemy's own error (a connection dropped
    mid-job, outside the places that already convert it) is read the same way, without its traceback."""
    from iox_planner.catalog.store import catalog_unavailable
    from iox_planner.errors import CatalogUnavailableError, IoxError, QueryTimeoutError, clip_message

    try:
        return work()
    except (CatalogUnavailableError, QueryTimeoutError) as err:
        print(clip_message(f"error: {err}"), file=sys.stderr)
        return err.exit_code
    except IoxError as err:
        print(clip_message(f"error: {err}"), file=sys.stderr)
        return 1
    except Exception as err:
        lost = catalog_unavailable(err)
        if lost is None or os.environ.get("IOX_DEBUG"):
            raise
        print(clip_message(f"error: {lost}"), file=sys.stderr)
        return lost.exit_code
