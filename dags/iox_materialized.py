"""One DAG per materialized query definition (`dags/materialized/*.yaml`, or IOX_MATERIALIZED_DIR), named
`materialize_<name>`. Built from the YAML files alone: nothing here touches a database at import time.

Each run computes exactly its data interval, applied as the query's half-open time range, and overwrites that
interval's output, so reruns and backfills (`airflow backfill create --dag-id materialize_<name> --from-date ...
--to-date ...`) are idempotent. Its output is an Airflow Asset whose events carry the interval; with
`register_as` the result is also written as a catalog table, replacing that interval of the table.
"""

from __future__ import annotations

from typing import Any, Mapping

from airflow.sdk import DAG, Asset, CronDataIntervalTimetable

from iox_planner.runs.definitions import MaterializedQuery, load_definitions
from iox_planner.runs.request import QueryRequest
from iox_planner.runs.settings import RunSettings

from iox_airflow.pipeline import query_tasks

SETTINGS = RunSettings.from_env()


def output_asset(definition: MaterializedQuery, settings: RunSettings) -> Asset:
    pattern = definition.output_pattern(settings)
    # A local pattern is a path (a file:// asset); one under a store's output root is already an s3:// URI.
    uri = pattern if isinstance(pattern, str) else f"file://{pattern}"
    return Asset(name=f"iox_{definition.name}", uri=uri, group="iox-batch")


def table_asset(definition: MaterializedQuery) -> Asset | None:
    target = definition.register_as
    if target is None:
        return None
    db = target.db or definition.db
    return Asset(name=f"iox_table_{db}_{target.table}", uri=f"iox://{db}/{target.table}", group="iox-batch")


def build(definition: MaterializedQuery, settings: RunSettings) -> DAG:
    def request(context: Mapping[str, Any], now: RunSettings) -> QueryRequest:
        return definition.request(context["data_interval_start"], context["data_interval_end"], now)

    def event_extra(context: Mapping[str, Any], outcome: Any) -> dict[str, Any]:
        start, end = context["data_interval_start"], context["data_interval_end"]
        return {"definition": definition.name, "db": definition.db, "run_id": context["ti"].run_id,
                "interval_start": start.isoformat(), "interval_end": end.isoformat(),
                "output": outcome.output, "format": definition.format.value, "rows": outcome.rows,
                "registered": outcome.registered}

    outlets = [a for a in (output_asset(definition, settings), table_asset(definition)) if a is not None]
    with DAG(
        dag_id=definition.dag_id,
        description=definition.description or f"Materialized query {definition.name} ({definition.source})",
        schedule=CronDataIntervalTimetable(definition.cron, timezone="UTC"),
        start_date=definition.start_date,
        end_date=definition.end_date,
        catchup=definition.catchup,
        is_paused_upon_creation=definition.paused,
        tags=["iox-batch", "materialized", *definition.tags],
        doc_md=f"Materialized query `{definition.name}` from `{definition.source}`:\n\n```sql\n{definition.sql}\n```",
    ) as dag:
        query_tasks(request, settings, retries=definition.retries, outlets=outlets, event_extra=event_extra)
    return dag


for _definition in load_definitions(SETTINGS.materialized_dir):
    globals()[_definition.dag_id] = build(_definition, SETTINGS)
