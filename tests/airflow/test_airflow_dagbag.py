"""Every DAG loads with real Airflow, with no import errors, without touching any database."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from airflow_support import DAGS

pytestmark = pytest.mark.airflow

LOADER = r"""
import json, sys
from airflow.dag_processing.dagbag import BundleDagBag
bag = BundleDagBag(dag_folder=sys.argv[1], bundle_path=sys.argv[1], bundle_name="dags-folder")
out = {"import_errors": bag.import_errors, "dags": {}}
for dag in bag.dags.values():
    out["dags"][dag.dag_id] = {
        "file": dag.fileloc,
        "timetable": type(dag.timetable).__name__,
        "timezone": str(getattr(dag.timetable, "timezone", "")),
        "params": {k: dag.params.get_param(k).resolve(suppress_exception=True) for k in dag.params},
        "tasks": {t.task_id: {"type": type(t).__name__,
                              "trigger_rule": getattr(t.trigger_rule, "value", t.trigger_rule),
                              "mapped": "MappedOperator" in type(t).__name__,
                              "outlets": [a.uri for a in getattr(t, "outlets", [])]} for t in dag.tasks},
        "paused_upon_creation": dag.is_paused_upon_creation,
        "catchup": dag.catchup,
    }
print(json.dumps(out, default=str))
"""


def load_dags(env: dict[str, str]) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", LOADER, str(DAGS)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), time.monotonic() - started


def test_every_dag_loads_without_import_errors_and_without_a_database(airflow_env: dict[str, str]) -> None:
    # Nothing may be reached at import time: point the catalog at a port where nothing listens.
    env = {**airflow_env, "IOX_CATALOG_URL": "postgresql+psycopg2://nobody@127.0.0.1:9/nowhere",
           "IOX_MATERIALIZED_DIR": str(DAGS / "materialized")}
    bag, seconds = load_dags(env)
    assert bag["import_errors"] == {}
    dags = bag["dags"]
    examples = sorted(f"materialize_{p.stem}" for p in (DAGS / "materialized").glob("*.yaml"))
    assert sorted(dags) == sorted(["iox_query", "iox_persist", "iox_compact", "iox_refresh", "iox_bulk_load",
                                   *examples])
    assert seconds < 60

    query = dags["iox_query"]
    assert query["timetable"] == "NullTimetable"
    assert set(query["params"]) == {"db", "sql", "args", "time_start", "time_end", "output", "format", "timeout_s",
                                    "changes_since"}
    assert query["params"]["format"] == "parquet" and query["params"]["args"] == {}
    assert query["params"]["timeout_s"] is None
    assert list(query["tasks"]) == ["plan", "run", "merge", "commit"]
    assert query["tasks"]["run"]["mapped"] and not query["tasks"]["merge"]["mapped"]
    assert query["tasks"]["commit"]["trigger_rule"] == "all_done"

    hourly = dags["materialize_cpu_hourly"]
    assert hourly["timetable"] == "CronDataIntervalTimetable" and hourly["timezone"] == "UTC"
    assert hourly["paused_upon_creation"] is True and hourly["catchup"] is False
    assert hourly["tasks"]["commit"]["outlets"] == [
        f"file://{airflow_env['IOX_OUTPUT_ROOT']}/cpu_hourly/*/*00.parquet", "iox://tsbs/cpu_hourly"]

    persist = dags["iox_persist"]
    assert persist["tasks"]["persist_table"]["mapped"]
    # A persist that leaves partitions overlapping requests their compaction; iox_compact runs on that too.
    assert persist["tasks"]["request_compaction"]["outlets"] == ["iox://maintenance/compact-request"]

    compact = dags["iox_compact"]
    assert compact["timetable"] == "AssetOrTimeSchedule"
    assert list(compact["tasks"]) == ["find_work", "compact_batch", "promote", "report"]
    assert compact["tasks"]["compact_batch"]["mapped"] and compact["tasks"]["report"]["trigger_rule"] == "all_done"
    # One level (cpu_hourly reads no registered table): find, then the stale intervals as mapped tasks.
    refresh = dags["iox_refresh"]
    assert refresh["timetable"] == "CronTriggerTimetable" and refresh["catchup"] is False
    assert sorted(refresh["tasks"]) == ["find_0", "refresh_0"] and refresh["tasks"]["refresh_0"]["mapped"]


def test_a_broken_definition_is_an_import_error_naming_its_file(airflow_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("name: broken\ndb: x\nsql: SELECT 1\nschedule: every hour\n"
                                          "start_date: 2024-01-01\noutput: broken/{start:%H}.jsonl\n")
    bag, _ = load_dags({**airflow_env, "IOX_MATERIALIZED_DIR": str(tmp_path)})
    [(path, error)] = bag["import_errors"].items()
    assert path.endswith("iox_materialized.py")
    assert "broken.yaml: `schedule`: 'every hour' is not a cron expression" in error
    assert "iox_query" in bag["dags"] and "iox_refresh" in bag["dags"]
