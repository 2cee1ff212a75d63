"""A query's wall-time budget inside a Spark driver, and the watchdog that keeps a query from hanging.

`query_budget(spark, seconds)` runs a block whose Spark jobs all carry one job tag of their own (job tags are
local properties of the thread, inherited by the threads Spark starts for the query, such as the one serving an
Arrow result to Python). A watchdog thread cancels the tagged jobs at the deadline, with interrupt-on-cancel so
running tasks are interrupted rather than left to finish, and again every `CANCEL_EVERY_S` until the block returns
(a query may start its next job in between); the block then raises the budget's error (`spark/budget.py`
`timeout_error`). Only this query's jobs are cancelled: the session serves the next query.

Some work no cancellation reaches: the optimizer on the driver (folding a constant), or a thread the JVM lost.
When the block has not returned `STUCK_GRACE_S` after the deadline, the watchdog writes the budget's error to
standard error, stops the JVM this process started (the CLI's own session) and ends the process with the
budget's exit status. A hang is never the outcome.

A JVM that ends under the block (the driver runs with `-XX:+ExitOnOutOfMemoryError`, see `spark/conf.py`) surfaces
as a lost py4j connection; the block raises `spark/budget.py` `jvm_lost_error` for it instead.

Over Spark Connect (`connect.py`) the tag is the session's operation tag (`SparkSession.addTag`, also local to the
thread) and the watchdog interrupts the server's operations that carry it (`interruptTag`), which cancels their jobs
there (a job Spark submits after the interrupt, from a stage prepared meanwhile, is the server's to cancel:
`orphans.py`): the server and the other clients' queries go on. The tag carries the deadline
(`orphans.deadline_tag`), so the server interrupts the query itself a few seconds past it when this process could
not (killed, stopped). A server lost under the block raises the retryable `SparkUnavailableError`; past the grace
the watchdog ends this process only (the server is not ours to stop)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator

from pyspark.sql import SparkSession

from iox_planner.errors import IoxError, clip_message
from iox_planner.spark.budget import jvm_lost_error, timeout_error
from spark_jobs.orphans import deadline_tag

CANCEL_EVERY_S = 0.5
STUCK_GRACE_S = 30.0
"""How long after its deadline a query may take to come back from its cancellation before the process ends. A
cancelled job fails at once on the driver, whatever its tasks do, so a query still not back after this is stuck
where no cancellation reaches (driver-side planning, a lost thread).

Its tasks are another matter: Spark stops a cancelled task at its next input row, but an expression that never
returns within one row (a backtracking regular expression: Java's never looks at the interrupt) keeps its core
until that row is done. The command has ended by then (a CLI process and its JVM end with it; a spark-submit job
ends, its group stopped if need be); a long-lived session has that core busy meanwhile."""

# How py4j reports a JVM going down under a call: a broken connection, or (seen under load, the call answered by
# a closing socket) a plain `Py4JError` "An error occurred while calling oN.getResult". Not `Py4JJavaError`, its
# subclass for an exception the JVM raised: that is the query's own error, with the JVM alive.
_LOST_CONNECTION = frozenset({"Py4JNetworkError", "Py4JError", "ConnectionResetError", "ConnectionRefusedError",
                              "ConnectionAbortedError", "BrokenPipeError", "EOFError"})


class _Tags:
    """One query's tag on this process's SparkContext: its jobs, cancelled with interrupt-on-cancel."""

    def __init__(self, spark: SparkSession) -> None:
        self.sc = spark.sparkContext

    def add(self, tag: str) -> None:
        self.sc.addJobTag(tag)
        self.sc.setInterruptOnCancel(True)

    def cancel(self, tag: str) -> None:
        self.sc.cancelJobsWithTag(tag)

    def remove(self, tag: str) -> None:
        self.sc.removeJobTag(tag)

    def lost(self, err: BaseException) -> IoxError | None:
        return _jvm_lost(self.sc, err)

    def jvm(self) -> subprocess.Popen[bytes] | None:
        return _jvm_process(self.sc)


class _ConnectTags:
    """One query's tag on a Spark Connect session: its operations on the server, interrupted there."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def add(self, tag: str) -> None:
        self.spark.addTag(tag)

    def cancel(self, tag: str) -> None:
        self.spark.interruptTag(tag)

    def remove(self, tag: str) -> None:
        self.spark.removeTag(tag)

    def lost(self, err: BaseException) -> IoxError | None:
        from spark_jobs.connect import server_lost

        return server_lost(err)

    def jvm(self) -> None:
        return None


@contextmanager
def query_budget(spark: SparkSession, seconds: int) -> Iterator[None]:
    """Run the block's Spark jobs within `seconds` of wall time (see the module's docstring)."""
    from spark_jobs.connect import is_remote

    tags: _Tags | _ConnectTags = _ConnectTags(spark) if is_remote(spark) else _Tags(spark)
    tag = deadline_tag(seconds)  # the server's watch enforces the deadline it carries too (`orphans.py`)
    tags.add(tag)
    done = threading.Event()
    expired = threading.Event()
    threading.Thread(target=_watch, args=(tags, tag, seconds, done, expired), name="iox-query-budget",
                     daemon=True).start()
    try:
        yield
    except Exception as err:
        lost = tags.lost(err)
        if lost is not None:
            raise lost from err
        if expired.is_set():
            raise timeout_error(seconds) from err
        raise
    finally:
        done.set()
        try:
            tags.remove(tag)
        except Exception:  # noqa: BLE001 - the JVM is gone: there is no tag left to remove
            pass


def _watch(tags: _Tags | _ConnectTags, tag: str, seconds: int, done: threading.Event,
           expired: threading.Event) -> None:
    if done.wait(seconds):
        return
    expired.set()
    give_up_at = time.monotonic() + STUCK_GRACE_S
    while not done.is_set():
        try:
            tags.cancel(tag)
        except Exception:  # noqa: BLE001 - a JVM that is gone: the block reports it when its call fails
            pass
        if done.wait(CANCEL_EVERY_S):
            return
        if time.monotonic() > give_up_at:
            _end_process(tags.jvm(), seconds)


def _end_process(proc: subprocess.Popen[bytes] | None, seconds: int) -> None:
    """The query is stuck past anything a cancellation reaches: report it and end this process (and the JVM it
    started). Written to the standard error descriptor itself: the block's caller may have redirected sys.stderr,
    and nothing else will run."""
    message = (f"error: {timeout_error(seconds)} (Spark did not stop within {STUCK_GRACE_S:.0f} s of being "
               "cancelled, so the process ended)")
    os.write(2, (clip_message(message) + "\n").encode("utf-8", "replace"))
    if proc is not None:
        proc.kill()
    os._exit(timeout_error(seconds).exit_code)


def _jvm_process(sc: Any) -> subprocess.Popen[bytes] | None:
    """The JVM this process started (PySpark's gateway keeps its Popen), or None when the JVM started this process
    (spark-submit: the JVM is the parent, and its exit status reaches whoever ran spark-submit)."""
    return getattr(getattr(sc, "_gateway", None), "proc", None)


def _jvm_lost(sc: Any, err: BaseException) -> IoxError | None:
    """The error to raise when the JVM this process started ended under the query, else None."""
    proc = _jvm_process(sc)
    if proc is None:
        return None
    status = proc.poll()
    if status is None and _lost_connection(err):
        # The connection broke as the JVM went down: its exit status follows within moments.
        try:
            status = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None
    return None if status is None else jvm_lost_error(status)


def _lost_connection(err: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__name__ in _LOST_CONNECTION:
            return True
        current = current.__cause__ or current.__context__
    return False
