"""`iox_compact`: compacts the partitions that need it (hot: L0 files into non-overlapping L1 files; cold: a quiet
partition's small L1 files into large L2 files), so queries stop paying for deduplication.

Every IOX_COMPACT_SCHEDULE (default hourly) `find_work` reads the compaction plan of every database
(IOX_COMPACT_DATABASES, default all); a run triggered by `iox_compact_request` events (a persist that left
partitions overlapping, see `iox_persist`) plans only the partitions the events name (in those databases). It
splits the partitions that need work into at most IOX_MAX_SPARK_JOBS batches of about equal rows; each batch is one mapped spark-submit of `spark_jobs/run_compact.py`. When no
partition needs a rewrite (promotions only: catalog updates), there is no spark-submit: `compact_batch` maps
over nothing and is skipped, and `promote` makes the promotions in its own process (it is skipped otherwise).
`report` sums the batches' reports (partitions, files and rows in and out, duplicates removed, files promoted)
and fails the run if a batch failed. Rerun-safe: a batch compacts what still needs it when it runs, and a
partition already compacted has nothing left to do. A failed batch changes nothing it did not finish: each
partition is swapped in its own catalog transaction, after its outputs are written, and a killed job's staged
outputs are swept later.

With `iox_persist`: both may run at once. A persist and a compaction's swap take the same partition row lock, so
they commit one after the other; persist never retires files and compaction never touches ingester chunks; the
swap re-checks the partition under that lock and skips (nothing registered) if a persist made its merge wrong. Two
compactions of one partition exclude each other with the partition's compaction lock (the second skips).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import DAG, AssetOrTimeSchedule, CronTriggerTimetable, XComArg, task
from airflow.utils.trigger_rule import TriggerRule

from iox_planner.runs.settings import RunSettings
from iox_planner.spark.conf import jobs_dir
from iox_planner.spark.jobs import CompactJob

from iox_airflow.assets import COMPACT_REQUEST
from iox_airflow.operators import IoxSparkSubmitOperator

SETTINGS = RunSettings.from_env()


def _job(batch: Any) -> CompactJob:
    """A batch (`maintenance/compact/batches.py` `Batch`) as its compaction job."""
    return CompactJob(report=batch.report, targets=batch.targets)

with DAG(
    dag_id="iox_compact",
    description="Compact overlapping Parquet files into non-overlapping L1 and L2 files",
    # On its schedule, and on each compaction request a persist emits (`iox_persist`), for just those partitions.
    schedule=AssetOrTimeSchedule(timetable=CronTriggerTimetable(SETTINGS.compact_schedule, timezone="UTC"),
                                 assets=[COMPACT_REQUEST]),
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    max_active_runs=1,
    # Paused when first deployed: it rewrites every database's files, so an operator turns it on
    # (`airflow dags unpause iox_compact`); `airflow dags test iox_compact` runs it either way.
    is_paused_upon_creation=True,
    tags=["iox-batch", "maintenance"],
    doc_md=__doc__,
):

    @task
    def find_work(**context: Any) -> list[list[str]]:
        from iox_planner.maintenance.compact.batches import plan_batches, report_folder

        from iox_planner.maintenance.compact.batches import parse_requests

        settings = RunSettings.from_env()
        # A run the compaction requests triggered compacts the partitions they name; a scheduled run, everything.
        events = context.get("triggering_asset_events") or {}
        extras = [event.extra for asset_events in events.values() for event in asset_events]
        only = parse_requests(extras) if extras else None
        batches = plan_batches(settings.compact_databases, settings.max_spark_jobs,
                               report_folder(str(context["run_id"])), only=only)
        # Each batch as its compaction job's arguments (`CompactJob.args`): what the mapped spark-submit takes.
        promote = [] if batches.promote is None else _job(batches.promote).args()
        context["ti"].xcom_push(key="promote", value=promote)
        return [_job(batch).args() for batch in batches.spark]

    @task(retries=SETTINGS.spark_retries, retry_delay=dt.timedelta(seconds=SETTINGS.spark_retry_delay_s))
    def promote(args: list[str]) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowSkipException

        from iox_planner.maintenance.compact.batches import Batch, promote_batch

        if not args:
            raise AirflowSkipException("some partition needs a rewrite: its batch makes the promotions on Spark")
        job = CompactJob.parse(args)
        assert job.report is not None
        return promote_batch(Batch(job.report, job.targets))

    @task(trigger_rule=TriggerRule.ALL_DONE)
    def report(batches: list[list[str]], promote_args: list[str]) -> dict[str, Any]:
        from iox_planner.maintenance.compact.batches import sum_reports

        jobs = [CompactJob.parse(args) for args in [*batches, *([promote_args] if promote_args else [])]]
        return sum_reports([job.report for job in jobs if job.report is not None])

    found = find_work()
    promote_only = XComArg(found.operator, key="promote")
    compact_batch = IoxSparkSubmitOperator.partial(
        task_id="compact_batch", application=str(jobs_dir() / CompactJob.script),
        retries=SETTINGS.spark_retries, retry_delay=dt.timedelta(seconds=SETTINGS.spark_retry_delay_s),
    ).expand(application_args=found)

    [compact_batch, promote(promote_only)] >> report(found, promote_only)
