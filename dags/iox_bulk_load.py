"""`iox_bulk_load`: a triggered bulk load of a folder (or one file) of line protocol on Spark, the backfill
companion of `iox-batch write --spark`.

    airflow dags test iox_bulk_load -c '{"db": "demo", "folder": "2024-01"}'

Params: `db` (created by the load if new), `folder` (relative to IOX_BULK_LOAD_ROOT, or absolute inside it) and
`precision` (ns, us, ms, s). `check` resolves the folder and refuses anything outside the root (`..`, a symlink
leading out, an absolute path elsewhere) before anything is read; `load` is one spark-submit of
`spark_jobs/run_bulk_load.py`, which parses the folder's files in parallel and registers every chunk in one
catalog transaction (all or nothing, the plain write's errors); `summary` logs what it registered. Rerunning a
failed run is safe: a failed load registered nothing. Rerunning a successful one writes the data again (newer
chunks with the same values: queries answer the same).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import DAG, Param, task

from iox_planner.ingest.lineprotocol import Precision
from iox_planner.runs.settings import RunSettings
from iox_planner.spark.conf import jobs_dir
from iox_planner.spark.jobs import BulkLoadJob

from iox_airflow.operators import IoxSparkSubmitOperator

SETTINGS = RunSettings.from_env()

PARAMS = {
    "db": Param(type="string", pattern=r"^[A-Za-z0-9_-]{1,64}$", description="The database to load into."),
    "folder": Param(type="string", minLength=1, maxLength=4096,
                    description="A folder (or file) of line protocol under IOX_BULK_LOAD_ROOT."),
    "precision": Param(Precision.NS.value, type="string", enum=Precision.choices(),
                       description="The unit of the lines' timestamps."),
}

with DAG(
    dag_id="iox_bulk_load",
    description="Load a folder of line protocol files on Spark, all or nothing",
    schedule=None,
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    params=PARAMS,
    tags=["iox-batch"],
    doc_md=__doc__,
):

    @task
    def check(**context: Any) -> list[str]:
        from iox_planner.runs.bulk_load import load_job

        return load_job(context["params"], RunSettings.from_env(), str(context["run_id"])).args()

    @task
    def summary(**context: Any) -> dict[str, Any]:
        from iox_planner.runs.bulk_load import summary as read_summary

        done = read_summary(str(context["run_id"]))
        print(f"bulk load: {done['rows']:,} rows in {done['chunks']} chunk(s) of {', '.join(done['tables'])}")
        return done

    checked = check()
    load = IoxSparkSubmitOperator(
        task_id="load", application=str(jobs_dir() / BulkLoadJob.script),
        application_args=checked,  # type: ignore[arg-type]
        retries=SETTINGS.spark_retries, retry_delay=dt.timedelta(seconds=SETTINGS.spark_retry_delay_s),
    )
    load >> summary()
