"""Materialized query DAGs and fan-out with real Airflow (`dag.test()`), real Postgres and local Spark."""

from __future__ import annotations

import csv
import datetime as dt
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from airflow_support import DagRunner, leftovers, locks, query_runs
from common_support import live_chunks

from iox_planner.catalog.store import Catalog

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

DAY3 = dt.datetime(2024, 1, 3, tzinfo=dt.timezone.utc)
DAY3_NS = 1704240000 * 10**9


def test_failed_spark_task_publishes_nothing_and_a_rerun_succeeds(
        airflow_env: dict[str, str], dag_runner: DagRunner, catalog: Catalog, fail_db: str,
        warehouse: Path) -> None:
    output_root = Path(airflow_env["IOX_OUTPUT_ROOT"])
    output = output_root / "h2o_fail" / "2024-01-03"
    [chunk] = [c for c in live_chunks(catalog, fail_db) if c["label"] == "I3"]
    chunk_file = str(warehouse / chunk["path"])
    aside = chunk_file + ".aside"
    run = {"dag_id": "materialize_h2o_fail", "logical_date": "2024-01-04T00:00:00Z"}
    try:
        # The chunk file is gone for the first run, back for the second: the same interval, run twice.
        failed, ok = dag_runner.run([{**run, "move_first": [[chunk_file, aside]], "paths_after": [str(output)]},
                                     {**run, "move_first": [[aside, chunk_file]]}])
    finally:
        if Path(aside).exists():
            Path(aside).rename(chunk_file)

    # The run's interval is exactly the day: [2024-01-03, 2024-01-04).
    assert failed["data_interval"] == ["2024-01-03T00:00:00+00:00", "2024-01-04T00:00:00+00:00"]
    assert failed["state"] == "failed", failed["log"][-4000:]
    assert failed["tasks"]["plan"] == "success" and failed["tasks"]["run[0]"] == "failed"
    assert failed["tasks"]["commit"] == "failed"
    assert failed["asset_events"] == []
    assert failed["paths_after"] == {str(output): False}  # nothing published
    [run] = query_runs(catalog, run_id=failed["run_id"])
    assert run["status"] == "failed" and run["definition"] == "h2o_fail"
    assert "is missing from the warehouse" in run["error"] and "I3" in run["error"]
    assert (run["interval_start"], run["interval_end"]) == (DAY3_NS, DAY3_NS + 86400 * 10**9)
    assert locks(catalog) == []

    # The file is back: the same interval reruns cleanly and publishes.
    assert ok["state"] == "success", ok["log"][-4000:]
    assert ok["tasks"]["merge"] == "skipped"
    rows = sorted(pq.read_table(output).to_pylist(), key=lambda r: r["state"])
    assert rows == [
        {"state": "CA", "city": "SF", "time": DAY3, "samples": 2, "temp_avg": 58.0, "temp_max": 103.0},
        {"state": "MA", "city": "Boston", "time": DAY3, "samples": 2, "temp_avg": 38.0, "temp_max": 43.0},
    ]
    # Published by this run, as the catalog records it (no marker file inside the output).
    with catalog.engine.connect() as conn:
        runs_recorded = conn.execute(sa.text("SELECT run FROM iox_output_publication WHERE path = :p ORDER BY id")
                                     .bindparams(p=str(output.resolve()))).scalars().all()
    assert runs_recorded and runs_recorded[-1].startswith("materialize_") and not (output / ".iox-batch").exists()
    assert leftovers(output_root) == []

    # Registered as a catalog table: one duplicate-free file in the day's partition, time as int64 ns.
    [registered] = [c for c in live_chunks(catalog, fail_db) if c["table_name"] == "h2o_fail_daily"]
    assert registered["kind"] == "parquet" and registered["partition_key"] == "2024-01-03"
    assert registered["row_count"] == 2 and registered["min_time"] == registered["max_time"] == DAY3_NS
    table = pq.read_table(warehouse / registered["path"])
    assert table.schema.field("time").type == "int64"
    assert sorted(table.to_pylist(), key=lambda r: r["state"]) == [
        {"city": "SF", "state": "CA", "samples": 2, "temp_avg": 58.0, "temp_max": 103.0, "time": DAY3_NS},
        {"city": "Boston", "state": "MA", "samples": 2, "temp_avg": 38.0, "temp_max": 43.0, "time": DAY3_NS},
    ]

    # Asset events carry the interval.
    events = {e["asset"]: e for e in ok["asset_events"]}
    assert events["iox_h2o_fail"]["extra"]["registered"]["retired"] == 0  # the failed run registered nothing
    assert set(events) == {"iox_h2o_fail", f"iox_table_{fail_db}_h2o_fail_daily"}
    extra = events["iox_h2o_fail"]["extra"]
    assert extra["interval_start"] == "2024-01-03T00:00:00+00:00"
    assert extra["interval_end"] == "2024-01-04T00:00:00+00:00"
    assert extra["output"] == str(output) and extra["rows"] == 2
    assert events["iox_h2o_fail"]["uri"] == f"file://{output_root}/h2o_fail/*"
    [run] = query_runs(catalog, run_id=ok["run_id"])
    assert run["status"] == "success" and run["row_count"] == 2 and run["output"] == str(output)
    assert locks(catalog) == []


def test_fan_out_splits_the_scans_and_publishes_all_parts_together(
        dag_runner: DagRunner, catalog: Catalog, h2o3_db: str, tmp_path: Path) -> None:
    output = tmp_path / "h2o3.csv"
    conf = {"db": h2o3_db, "output": str(output), "format": "csv",
            "sql": "SELECT state, city, temp, hum, time FROM h2o WHERE temp > :low ORDER BY time, state, city",
            "args": {"low": 0}, "time_start": "2024-01-01T00:00:00Z", "time_end": "2024-01-04T00:00:00Z"}
    [result] = dag_runner.run([{"dag_id": "iox_query", "conf": conf}], env={"IOX_MAX_SPARK_JOBS": "2"})
    assert result["state"] == "success", result["log"][-4000:]
    # Three overlapping day groups, two Spark jobs (never one per group), then the final SQL step.
    assert {t: s for t, s in result["tasks"].items() if t.startswith(("run", "merge"))} == {
        "run[0]": "success", "run[1]": "success", "merge": "success"}
    with output.open() as fh:
        rows = list(csv.DictReader(fh))
    expected = []
    for d in (1, 2, 3):
        day = f"2024-01-0{d}"
        expected += [
            {"state": "CA", "city": "SF", "temp": f"{10 + d}.0", "hum": "50", "time": f"{day}T01:00:00Z"},
            {"state": "MA", "city": "Boston", "temp": f"{30 + d}.0", "hum": "", "time": f"{day}T01:00:00Z"},
            {"state": "CA", "city": "SF", "temp": f"{100 + d}.0", "hum": "", "time": f"{day}T02:00:00Z"},
            {"state": "MA", "city": "Boston", "temp": f"{40 + d}.0", "hum": "", "time": f"{day}T03:00:00Z"},
        ]
    assert rows == expected
    assert leftovers(tmp_path) == []
    [run] = query_runs(catalog, run_id=result["run_id"])
    assert run["status"] == "success" and run["row_count"] == 12
