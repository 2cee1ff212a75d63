"""The task layout every iox-batch query DAG shares:

    plan ──> run (one Spark job per part, dynamically mapped) ──> merge (final Spark step, when split) ──> commit

- `plan` reads the catalog, takes the run lock (taking it over from a run whose Airflow DAG run has ended, a
  killed one say) and writes the plan into the run's staging folder; bad input fails here with the planner's
  message and nothing published. It pushes the Spark jobs (the mapping), a summary (`summary`) and a
  handle on the run (`handle`) to XCom.
- `run` is `IoxSparkSubmitOperator` mapped over the jobs: one job for the whole plan, or at most N parts.
- `merge` runs the query's SQL over the parts; it skips itself when the plan was not split.
- `commit` runs whatever happened upstream (trigger rule all_done): after a failure it marks the run failed,
  releases the run lock and removes the staging folder; otherwise it publishes everything together (and registers
  the output as a table when asked), records the run and emits the outlets' asset events with the interval.

The DAG file says how a run's `QueryRequest` comes about (from params, or from a definition and the data
interval); that callable runs inside the tasks only.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Callable, Mapping, Sequence

from airflow.sdk import Asset, TriggerRule, XComArg, task
from airflow.sdk.exceptions import AirflowFailException

from iox_planner.runs.request import QueryRequest
from iox_planner.spark.conf import jobs_dir
from iox_planner.spark.jobs import MergeJob
from iox_planner.runs.settings import RunSettings

from iox_airflow.operators import IoxSparkSubmitOperator

RequestFactory = Callable[[Mapping[str, Any], RunSettings], QueryRequest]
FAILED_STATES = frozenset({"failed", "upstream_failed"})


def _identity(context: Mapping[str, Any]) -> Any:
    from iox_planner.runs.staging import RunIdentity

    ti = context["ti"]
    return RunIdentity(ti.dag_id, ti.run_id)


def query_tasks(
    make_request: RequestFactory,
    settings: RunSettings,
    *,
    retries: int | None = None,
    outlets: Sequence[Asset] = (),
    event_extra: Callable[[Mapping[str, Any], Any], dict[str, Any]] | None = None,
) -> None:
    """Add plan, run, merge and commit to the DAG being defined."""
    spark_retries = settings.spark_retries if retries is None else retries
    retry_delay = dt.timedelta(seconds=settings.spark_retry_delay_s)

    @task(task_id="plan", retries=spark_retries, retry_delay=retry_delay)
    def plan(**context: Any) -> list[dict[str, Any]]:
        from iox_planner.errors import IoxError, RunFailed
        from iox_planner.runs.failure import reject
        from iox_planner.runs.planning import plan as plan_run

        now = RunSettings.from_env()
        run = _identity(context)
        try:
            request = make_request(context, now)
        except IoxError as err:
            reject(context.get("params") or {}, run, str(err))
            raise AirflowFailException(f"nothing was run: {err}") from err
        try:
            # The scheduler's view of another run's DAG run: a lock whose holder's DAG run has ended is taken
            # over at once instead of after IOX_RUN_LOCK_TTL_S (catalog/runs.py acquire_lock says why).
            outcome = plan_run(request, run, now, holder_state=context["ti"].get_dagrun_state)
        except RunFailed as err:
            raise AirflowFailException(f"nothing was run: {err}") from err
        ti = context["ti"]
        ti.xcom_push(key="summary", value=outcome.summary)
        ti.xcom_push(key="handle", value=outcome.handle())
        merge = outcome.merge
        ti.xcom_push(key="merge", value=merge.args() if merge is not None else [])  # []: no merge step
        ti.xcom_push(key="merge_fast_start", value=merge is not None and merge.starts_fast())
        print(f"plan: {outcome.summary}")
        return [job.operator_kwargs() for job in outcome.jobs]

    planned = plan()
    spark = IoxSparkSubmitOperator.partial(
        task_id="run", retries=spark_retries, retry_delay=retry_delay,
    ).expand_kwargs(planned)
    merge = IoxSparkSubmitOperator(
        task_id="merge", application=str(jobs_dir() / MergeJob.script), retries=spark_retries, retry_delay=retry_delay,
        application_args=XComArg(planned.operator, key="merge"),  # type: ignore[arg-type]
        fast_start=XComArg(planned.operator, key="merge_fast_start"),  # type: ignore[arg-type]
    )

    @task(task_id="commit", trigger_rule=TriggerRule.ALL_DONE, retries=0, outlets=list(outlets))
    def commit(**context: Any) -> dict[str, Any]:
        from iox_planner.errors import IoxError, RunFailed
        from iox_planner.runs.commit import commit as commit_run
        from iox_planner.runs.failure import fail

        ti = context["ti"]
        run = _identity(context)
        states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id], task_ids=["plan", "run", "merge"])
        upstream = states.get(ti.run_id, {})
        failed = sorted(t for t, s in upstream.items() if s == "failed") or sorted(
            t for t, s in upstream.items() if s in FAILED_STATES)
        handle = ti.xcom_pull(task_ids="plan", key="handle")
        try:
            request = make_request(context, RunSettings.from_env())
        except IoxError as err:
            raise AirflowFailException(f"nothing was published: the plan task rejected the run: {err}") from err
        if failed or handle is None:
            message = fail(request, run, handle, f"task(s) {', '.join(failed) or 'plan'} failed")
            raise AirflowFailException(f"nothing was published: {message}")
        try:
            outcome = commit_run(request, run, handle)
        except RunFailed as err:
            raise AirflowFailException(f"nothing was published: {err}") from err
        extra = event_extra(context, outcome) if event_extra else {}
        for asset in outlets:
            context["outlet_events"][asset].extra = extra
        print(f"published {outcome.rows} rows at {outcome.output}"
              + (f"; registered {outcome.registered}" if outcome.registered else ""))
        return {"query_run": outcome.query_run, "output": outcome.output, "rows": outcome.rows,
                "registered": outcome.registered}

    spark >> merge >> commit()
