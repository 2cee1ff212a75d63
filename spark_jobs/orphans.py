"""Spark jobs that outlive their query, cancelled: a job still running after the SQL query it belongs to ended.

Spark 4's adaptive execution prepares each shuffle stage on a thread pool of its own and submits the stage's job
from there (SPARK-49057). When the query's thread is interrupted while a stage is being prepared (over Spark
Connect: a budget's `interruptTag`, `interruptAll`, a released session), the query cancels the jobs its tags have
at that moment and ends; the stage's job is submitted a moment later, from the pool, with the query's tags, which
nobody cancels again. It then runs to its end: the slow query a budget of seconds had cancelled held a core of the
project's Connect server for minutes, and the next queries waited (tests/spark_jobs/test_connect.py's budget test).
Adaptive execution cancels its stages only when a stage fails, not when its thread is interrupted.

Every job of a SQL query carries its execution's own tag (`spark-session-<uuid>-execution-root-id-<id>`, Spark's
`SQLExecution.executionIdJobTag`), and Spark holds each running execution until it ends
(`SQLExecution.getQueryExecution`). A job running for an execution that has ended has no one left to read what it
computes: `watch` cancels every such job (the cancellation interrupts its tasks when its query asked for that, as a
Connect operation does). Jobs outside SQL (no such tag) are left alone. Reads Spark's status store through py4j,
so it runs where the JVM is: the Connect server's process (`connect_server.py`).

The watch also enforces each query's budget on the server, whatever became of its client (a client killed, stopped
with Ctrl-C before it could interrupt, or cut off from the server): a query's tag carries its deadline
(`deadline_tag`, set by `budget.py`), and `GRACE_S` past it the watch interrupts the Connect operations carrying it
(their threads, their jobs) and cancels every job carrying it, a job Spark submits later included. A client still
there interrupts at the deadline itself; the server's look is the backstop. An operation whose client went away
before its deadline is interrupted by Spark itself (`spark.connect.execute.manager.detachedTimeout`, `spark/conf.py`
`CONNECT_SERVER_CONF`).
"""

from __future__ import annotations

import re
import sys
import threading
import time
import uuid
from typing import Any

EVERY_S = 0.5
"""How often to look: an orphaned job holds its cores at most about twice this long after it starts."""

GRACE_S = 3
"""How long past its deadline a query's work may run before the server stops it: its client interrupts it at the
deadline, and the two clocks may differ a little (the client's and the server's may be two machines)."""

_EXECUTION_TAG = re.compile(r"spark-session-[0-9a-f-]{36}-execution-root-id-(?P<id>[0-9]{1,18})")
_DEADLINE_TAG = re.compile(r"iox-query-[0-9a-f]{32}-until-(?P<deadline>[0-9]{1,12})$")
"""A query's tag (`deadline_tag`); Spark Connect prefixes it (`SparkConnect_OperationTag_..._Tag_<tag>`) on the jobs."""


def deadline_tag(seconds: float) -> str:
    """A query's own tag, carrying its deadline (Unix seconds, rounded up) for the server's watch."""
    return f"iox-query-{uuid.uuid4().hex}-until-{int(time.time() + seconds) + 1}"


def _overdue(tags: Any, now: float) -> bool:
    found = (_DEADLINE_TAG.search(str(tag)) for tag in tags)
    return any(m is not None and int(m.group("deadline")) + GRACE_S < now for m in found)


def overdue_operations(spark: Any, now: float) -> list[Any]:
    """The Connect operations (`ExecuteHolder`s) whose query's deadline passed more than `GRACE_S` ago."""
    jvm = spark.sparkContext._jvm
    service = getattr(jvm.org.apache.spark.sql.connect.service, "SparkConnectService$").__getattr__("MODULE$")
    as_java = jvm.scala.jdk.javaapi.CollectionConverters.asJava
    holders = as_java(service.executionManager().listExecuteHolders())
    return [h for h in holders if _overdue(as_java(h.sparkSessionTags()), now)]


def orphaned_jobs(spark: Any, now: float | None = None) -> list[int]:
    """The ids of the running jobs whose SQL execution has ended, or (with `now`) whose query's deadline passed
    more than `GRACE_S` before `now`."""
    sc = spark.sparkContext
    running = sc.statusTracker().getActiveJobsIds()  # the cheap look, every time: usually none
    if not running:
        return []
    jvm, jsc = sc._jvm, sc._jsc.sc()
    as_java = jvm.scala.jdk.javaapi.CollectionConverters.asJava
    executions = jvm.org.apache.spark.sql.execution.SQLExecution
    found = []
    for job in running:
        try:
            tags = list(as_java(jsc.statusStore().job(job).jobTags()))
        except Exception:  # noqa: BLE001 - the job ended and left the store meanwhile
            continue
        ended = (_EXECUTION_TAG.fullmatch(tag) for tag in tags)
        if any(m is not None and executions.getQueryExecution(int(m.group("id"))) is None for m in ended) or (
                now is not None and _overdue(tags, now)):
            found.append(int(job))
    return found


def watch(spark: Any, stop: threading.Event, connect: bool = False) -> threading.Thread:
    """A daemon thread cancelling `spark`'s orphaned and overdue jobs until `stop` is set, and with `connect` (a
    JVM serving Spark Connect) interrupting overdue operations: the jobs `orphaned_jobs` finds in two looks in a
    row (Spark's status store learns of a job's end a moment after its query has ended: a job seen once may just
    have finished). Each one is named on standard error (the server's log); a failure to look is reported
    once (the JVM going down, or a Spark whose internals moved: then orphans are no longer cancelled, which
    tests/spark_jobs/test_orphans.py shows)."""

    def run() -> None:
        jsc = spark.sparkContext._jsc.sc()
        failed = False
        suspects: set[int] = set()
        interrupted: set[str] = set()
        while not stop.wait(EVERY_S):
            try:
                now = time.time()
                overdue = {str(h.operationId()): h for h in (overdue_operations(spark, now) if connect else ())}
                for key in overdue.keys() - interrupted:  # once: an interrupted operation ends, its jobs with it
                    overdue[key].interrupt()
                    print(f"interrupted Spark Connect operation {key}: past its query's deadline", file=sys.stderr,
                          flush=True)
                interrupted = set(overdue)
                found = set(orphaned_jobs(spark, now))
                seen_twice = found & suspects
                for job in sorted(seen_twice):
                    jsc.cancelJob(job, "as its SQL query had ended or passed its deadline")
                    print(f"cancelled Spark job {job}: its query had ended or passed its deadline",
                          file=sys.stderr, flush=True)
                suspects = found - seen_twice
            except Exception as err:  # noqa: BLE001 - the server goes on serving; this only frees cores sooner
                if not failed and not stop.is_set():  # a server stopping: its JVM goes first
                    print(f"cannot look for orphaned Spark jobs: {type(err).__name__}", file=sys.stderr, flush=True)
                failed = True

    thread = threading.Thread(target=run, name="iox-orphaned-jobs", daemon=True)
    thread.start()
    return thread
