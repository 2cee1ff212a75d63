"""`iox_refresh`: recomputes exactly the materialized intervals that are stale because data arrived after they ran.

Every IOX_REFRESH_SCHEDULE (default every 15 minutes) it walks the definitions in chain order (`refresh_levels`: a
definition reading another's `register_as` table comes after it). Per level, `find_<k>` asks the catalog for the
stale intervals (catalog/freshness.py: one indexed query per definition) and `refresh_<k>` recomputes each one as
its own mapped task instance, at most IOX_REFRESH_CONCURRENCY at a time, through the plan and commit steps every
materialize run uses (run lock per interval, atomic publication, `register_as` replacing the interval, what the
run read recorded when it publishes). Level k+1 looks only after level k finished without failures: a rollup's
intervals go stale when its parent's intervals are re-registered, so it must be found and refreshed after that.
A failed interval fails its task, publishes nothing and stays stale; the next run tries it again.
Why mapped tasks here rather than clearing `materialize_<name>` runs or triggering backfills: dags/README.md.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import DAG, TriggerRule, task

from iox_planner.errors import IoxError
from iox_planner.runs.definitions import load_definitions
from iox_planner.runs.refresh import refresh_levels
from iox_planner.runs.settings import RunSettings

SETTINGS = RunSettings.from_env()
try:
    LEVELS = [[d.name for d in level] for level in refresh_levels(load_definitions(SETTINGS.materialized_dir))]
except IoxError:
    # A broken definition is reported once, as iox_materialized.py's import error; here the DAG still loads and
    # its find task fails with the same message at run time.
    LEVELS = [[]]


def _find(names: list[str]) -> list[dict[str, Any]]:
    from iox_planner.catalog.store import open_catalog
    from iox_planner.runs import refresh
    from iox_planner.timeutil import format_time

    settings = RunSettings.from_env()
    definitions = load_definitions(settings.materialized_dir)  # a broken definition fails here, named
    work: list[dict[str, Any]] = []
    with open_catalog() as catalog:
        for name in names:
            definition = refresh.pick(definitions, name)
            for state in refresh.status(catalog, definition, never_run=False).intervals:
                if refresh.needs_refresh(state):
                    print(f"{name} [{format_time(state.start)}, {format_time(state.end)}): "
                          + "; ".join(state.reasons))
                    work.append({"name": name, "start": state.start, "end": state.end})
    return work


def _refresh(item: dict[str, Any], context: Any) -> dict[str, Any]:
    from contextlib import nullcontext

    from airflow.sdk import get_current_context
    from airflow.sdk.exceptions import AirflowFailException

    from iox_planner.runs import refresh
    from iox_planner.runs.staging import RunIdentity
    from iox_planner.spark.launch import SubmitLauncher
    from iox_planner.timeutil import format_time

    from iox_airflow.spark import connect_launcher, uses_connect

    settings = RunSettings.from_env()
    definition = refresh.pick(load_definitions(settings.materialized_dir), item["name"])
    ti = context["ti"]
    label: Any = get_current_context()
    label["refresh_target"] = f"{item['name']} {format_time(item['start'])}"  # the mapped task's label
    # One query run (and one run lock holder) per interval of this DAG run.
    run = RunIdentity(ti.dag_id, f"{ti.run_id}:{item['name']}:{format_time(item['start'])}")
    # Its Spark jobs over Spark Connect (IOX_RUNNER=connect: the connection's server, the operator's way), else
    # through spark-submit from this task; either way no Spark session of the worker's own.
    with connect_launcher() if uses_connect() else nullcontext(SubmitLauncher()) as launcher:
        result = refresh.refresh_interval(definition, int(item["start"]), int(item["end"]), run, settings,
                                          launcher=launcher, holder_state=ti.get_dagrun_state)
    print(refresh.describe(result))
    if not result.ok:
        raise AirflowFailException(refresh.describe(result))
    return {"name": result.definition, "rows": result.rows, "spark_jobs": result.spark_jobs}


with DAG(
    dag_id="iox_refresh",
    description="Recompute the materialized intervals that late data made stale",
    schedule=SETTINGS.refresh_schedule,
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    max_active_runs=1,
    tags=["iox-batch", "materialized", "maintenance"],
    doc_md=__doc__,
):
    previous: Any = None
    for k, names in enumerate(LEVELS):

        @task(task_id=f"find_{k}", trigger_rule=TriggerRule.NONE_FAILED)
        def find(names: list[str]) -> list[dict[str, Any]]:
            return _find(names)

        @task(task_id=f"refresh_{k}", retries=0, max_active_tis_per_dagrun=SETTINGS.refresh_concurrency,
              map_index_template="{{ refresh_target }}")
        def refresh_one(item: dict[str, Any], **context: Any) -> dict[str, Any]:
            return _refresh(item, context)

        found = find(names)
        if previous is not None:
            previous >> found
        previous = refresh_one.expand(item=found)
