"""A Spark job still running after its SQL query ended is cancelled (`spark_jobs/orphans.py`, the watch the
Connect server runs): what Spark's adaptive execution leaves behind when an interrupted query's stage is
submitted after the query cancelled its jobs. The race itself takes a budget firing within a fraction of a second
(about one try in ten here, budgets of 0.3 to 2.4 s on a loaded machine), so the test makes the state it leaves: a
job carrying the tags of a query that has ended. Real Spark, the test session's own."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from spark_jobs import orphans

pytestmark = pytest.mark.spark


def ended_query_tags(spark: Any) -> list[str]:
    """The job tags of a query that has run and ended, as Spark recorded them."""
    sc = spark.sparkContext
    group = f"iox-test-{uuid.uuid4().hex}"

    def query() -> Any:  # in a thread of its own, whose job group goes with it
        sc.setJobGroup(group, "a query that ends")
        return spark.range(3).collect()

    thread, outcome = run_in_thread(query)
    thread.join(60)
    assert "error" not in outcome, outcome
    (job,) = sc.statusTracker().getJobIdsForGroup(group)
    jvm = sc._jvm
    return list(jvm.scala.jdk.javaapi.CollectionConverters.asJava(sc._jsc.sc().statusStore().job(job).jobTags()))


def run_in_thread(work: Any) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            outcome["result"] = work()
        except Exception as err:  # noqa: BLE001 - the test reads what happened
            outcome["error"] = str(err)
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_job_still_running_after_its_query_ended_is_cancelled_and_a_live_query_is_not(spark: Any) -> None:
    sc = spark.sparkContext
    tags = ended_query_tags(spark)
    assert any("-execution-root-id-" in tag for tag in tags), tags

    def orphan() -> Any:
        # What the stage's thread does: it submits a job with the ended query's properties (its tags, and
        # interrupt-on-cancel as a Connect operation sets it). A minute long unless cancelled.
        sc.setLocalProperty("spark.job.tags", ",".join(tags))
        sc.setInterruptOnCancel(True)
        return sc.parallelize([0], 1).map(lambda _: time.sleep(60)).collect()

    def live() -> Any:
        # A query of its own, running while the watch looks several times.
        return spark.sql("SELECT java_method('java.lang.Thread', 'sleep', 2000L) AS s FROM range(1)").collect()

    stop = threading.Event()
    orphans.watch(spark, stop)
    try:
        orphan_thread, orphaned = run_in_thread(orphan)
        live_thread, lived = run_in_thread(live)
        orphan_thread.join(90)
        live_thread.join(90)
    finally:
        stop.set()
    assert "error" in orphaned and "SPARK_JOB_CANCELLED" in orphaned["error"], orphaned
    assert "had ended" in orphaned["error"], orphaned
    assert orphaned["seconds"] < 30, orphaned
    assert "error" not in lived and len(lived["result"]) == 1, lived


def test_a_job_past_its_querys_deadline_is_cancelled_and_one_within_it_is_not(spark: Any) -> None:
    """The server's look at each query's deadline (the tag `budget.py` sets carries it): whatever became of the
    client, a job still running past it is cancelled. Here a job of a query whose deadline passed, beside one of a
    query with an hour left."""
    sc = spark.sparkContext

    def tagged(seconds: float) -> Any:
        tag = orphans.deadline_tag(seconds)

        def job() -> Any:
            sc.setLocalProperty("spark.job.tags", f"SparkConnect_OperationTag_User__Session_x_Tag_{tag}")
            sc.setInterruptOnCancel(True)
            return sc.parallelize([0], 1).map(lambda _: time.sleep(20)).collect()

        return job

    stop = threading.Event()
    orphans.watch(spark, stop)
    try:
        overdue_thread, overdue = run_in_thread(tagged(-orphans.GRACE_S - 2))
        live_thread, live = run_in_thread(tagged(3600))
        overdue_thread.join(90)
        live_thread.join(90)
    finally:
        stop.set()
    assert "error" in overdue and "passed its deadline" in overdue["error"], overdue
    assert overdue["seconds"] < 15, overdue
    assert "error" not in live and live["seconds"] >= 19, live
