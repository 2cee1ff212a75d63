"""Run DAGs with real Airflow's `dag.test()` in one long-lived process, so Airflow starts once (its import and
the in-process Execution API cost about 8 s, most of a short run) and every test's runs reuse it.

The process reads one request per line on standard input, a JSON list of specs, and answers each with one line
`@@RESULT <json>` on standard output (Airflow's own log lines come before it):

    [{"dag_id": "iox_query", "conf": {...}}, {"dag_id": "materialize_x", "logical_date": "2024-01-04T00:00:00Z"}]

A spec may also carry `"env": {...}` (environment for that run only: tasks run in this process and read their
settings when they run), `"move_first": [[from, to], ...]` (files to move before the run, to break or repair
data) and `"paths_after": [path, ...]` (paths whose existence to report right after the run).

For each run: the DAG run's state and data interval, every task instance's state and tries, the asset events it
emitted, and any exception `dag.test` raised (a param that fails its JSON schema raises before the run exists).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

PREFIX = "@@RESULT "


def run_one(spec: dict[str, Any], dags: Path) -> dict[str, Any]:
    from airflow.dag_processing.dagbag import BundleDagBag
    from airflow.models.asset import AssetEvent
    from airflow.settings import Session
    from sqlalchemy import select

    for source, target in spec.get("move_first", []):
        os.replace(source, target)
    # A freshly parsed DAG per run: dag.test() runs tasks in this process, and a run's conf would otherwise stay in
    # the DAG's Param objects and leak into the next run's params (a real worker parses the file per task).
    bag = BundleDagBag(dag_folder=str(dags), bundle_path=str(dags), bundle_name="dags-folder")
    if bag.import_errors:
        return {"dag_id": spec["dag_id"], "error": f"import errors: {bag.import_errors}"}
    dag = bag.get_dag(spec["dag_id"])
    kwargs: dict[str, Any] = {"run_conf": spec.get("conf")}
    if spec.get("logical_date"):
        kwargs["logical_date"] = dt.datetime.fromisoformat(spec["logical_date"].replace("Z", "+00:00"))
    out: dict[str, Any] = {"dag_id": spec["dag_id"]}
    started = time.monotonic()
    try:
        run = dag.test(**kwargs)
    except Exception as err:  # noqa: BLE001 - reported to the test, which decides
        out.update(error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc()[-2000:])
        return out
    out["seconds"] = round(time.monotonic() - started, 1)
    with Session() as session:
        out["run_id"] = run.run_id
        out["state"] = str(getattr(run.state, "value", run.state))
        out["data_interval"] = [d.isoformat() if d else None for d in (run.data_interval_start,
                                                                       run.data_interval_end)]
        out["tasks"] = {(ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"):
                        str(getattr(ti.state, "value", ti.state)) for ti in run.get_task_instances(session=session)}
        out["tries"] = {(ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"): ti.try_number
                        for ti in run.get_task_instances(session=session)}
        events = session.scalars(select(AssetEvent).where(AssetEvent.source_run_id == run.run_id,
                                                          AssetEvent.source_dag_id == run.dag_id)).all()
        out["asset_events"] = [{"asset": e.asset.name, "uri": e.asset.uri, "extra": e.extra} for e in events]
        from airflow.models.xcom import XComModel

        out["xcoms"] = [json.dumps(x.value, default=str) for x in session.scalars(select(XComModel).where(
            XComModel.run_id == run.run_id, XComModel.dag_id == run.dag_id))]
    out["paths_after"] = {p: os.path.exists(p) for p in spec.get("paths_after", [])}
    return out


def main() -> int:
    dags = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    import airflow  # noqa: F401 - start Airflow before the first request

    print(PREFIX + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        results = []
        for spec in json.loads(line):
            saved = {k: os.environ.get(k) for k in spec.get("env", {})}
            os.environ.update(spec.get("env", {}))
            try:
                results.append(run_one(spec, dags))
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
        print(PREFIX + json.dumps(results, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
