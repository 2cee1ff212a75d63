"""A real backfill: `airflow backfill create` queues runs, a real scheduler and api-server (each in its own process
group, bounded waits, always stopped) execute them with local Spark against the real catalog.

Two days of the daily rollup (registered as table h2o_daily) give two outputs with the right rows; the same
backfill again, reprocessing completed runs, still leaves two outputs and two live files of the table, not four,
none of them the first pass's; a monthly rollup over the registered table (a rollup of a rollup) then sums the two
days, and only them (the data holds a third day, which no daily run covered).

Two days, not three: the scheduler runs two tasks at once, so both intervals run side by side (each backfill is
one round of Spark jobs, not two) and every promise above still needs more than one interval. The module has a
database of its own, so it passes whichever other Airflow tests ran before it in the same process.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sqlite3
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import sqlalchemy as sa
from af_support import (BIN, DATA, airflow_cli, base_env, leftovers, locks, query_runs, setup_airflow,
                        write_definitions)
from helpers import live_chunks

from iox_planner.catalog.store import Catalog
from iox_planner.ingest.scenario import load_scenario, read_scenario

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

DAYS = ("2024-01-01", "2024-01-02")
RUNS_TIMEOUT_S = 480


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([str(BIN / "airflow"), *args], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the whole process group (the scheduler's executor workers, the api-server's workers)."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def backfill_db(catalog: Catalog) -> str:
    """The three days of h2o in a database only this module writes to (its h2o_daily table included)."""
    db = f"af_backfill_{uuid.uuid4().hex[:8]}"
    load_scenario(catalog, read_scenario(DATA / "h2o_3days.yaml"), db=db)
    return db


@pytest.fixture(scope="module")
def cluster(catalog_url: str, backfill_db: str, fail_db: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("airflow_backfill_home")
    definitions = tmp_path_factory.mktemp("materialized_backfill")
    write_definitions(definitions, backfill_db, fail_db)
    port = _free_port()
    env = base_env(catalog_url, home, tmp_path_factory.mktemp("output_backfill"), definitions)
    env.update({
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",  # only the definitions saying `paused: false` run
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
    })
    setup_airflow(env, reserialize=True)
    procs = [_start(["api-server", "--port", str(port), "--workers", "1"], env, home / "api-server.log"),
             _start(["scheduler", "--skip-serve-logs"], env, home / "scheduler.log")]
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            dead = [p for p in procs if p.poll() is not None]
            logs = [(home / name).read_text()[-3000:] for name in ("api-server.log", "scheduler.log")]
            assert not dead, "\n".join(logs)
            assert time.monotonic() < deadline, "the api-server did not answer within 120 s"
            time.sleep(1)
        yield {"env": env, "home": home, "output": Path(env["IOX_OUTPUT_ROOT"])}
    finally:
        for proc in procs:
            _stop(proc)


def dag_runs(home: Path, dag_id: str) -> list[tuple[str, str, str]]:
    with sqlite3.connect(f"file:{home / 'airflow.db'}?mode=ro", uri=True, timeout=30) as db:
        return [tuple(r) for r in db.execute(
            "SELECT run_id, state, data_interval_start FROM dag_run WHERE dag_id = ? AND run_type = 'backfill' "
            "ORDER BY data_interval_start",
            (dag_id,))]


def backfill(cluster: dict[str, Any], dag_id: str, start: str, end: str, *extra: str) -> None:
    done = airflow_cli(cluster["env"], "backfill", "create", "--dag-id", dag_id, "--from-date", start,
                       "--to-date", end, *extra)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def backfills_open(home: Path, dag_id: str) -> int:
    with sqlite3.connect(f"file:{home / 'airflow.db'}?mode=ro", uri=True, timeout=30) as db:
        return int(db.execute("SELECT count(*) FROM backfill WHERE dag_id = ? AND completed_at IS NULL",
                              (dag_id,)).fetchone()[0])


def wait_for_runs(cluster: dict[str, Any], dag_id: str, count: int,
                  *, closed: bool = False) -> list[tuple[str, str, str]]:
    """Until `count` backfill runs of the DAG exist and none is queued or running; with `closed`, also until the
    scheduler has marked the backfill complete (it looks every 30 s; only then may another backfill of the same
    DAG start). Bounded."""
    deadline = time.monotonic() + RUNS_TIMEOUT_S
    while True:
        runs = dag_runs(cluster["home"], dag_id)
        if (len(runs) >= count and all(state in ("success", "failed") for _, state, _ in runs)
                and (not closed or backfills_open(cluster["home"], dag_id) == 0)):
            return runs
        if time.monotonic() > deadline:
            home = cluster["home"]
            raise AssertionError(f"runs of {dag_id} did not finish within {RUNS_TIMEOUT_S} s: {runs}\n"
                                 + (home / "scheduler.log").read_text()[-4000:])
        time.sleep(2)


def daily_rows(output: Path, day: str) -> list[dict[str, Any]]:
    return sorted((json.loads(line) for line in (output / "h2o_daily" / f"{day}.jsonl").read_text().splitlines()),
                  key=lambda r: r["state"])


def expected_day(d: int) -> list[dict[str, Any]]:
    time_text = f"2024-01-0{d}T00:00:00Z"
    keys = ("state", "city", "time", "samples", "temp_avg", "temp_max")
    return [dict(zip(keys, ("CA", "SF", time_text, 2, 55.0 + d, 100.0 + d))),
            dict(zip(keys, ("MA", "Boston", time_text, 2, 35.0 + d, 40.0 + d)))]


def registered_files(catalog: Catalog, db: str) -> list[dict[str, Any]]:
    return [c for c in live_chunks(catalog, db) if c["table_name"] == "h2o_daily"]


def test_backfill_two_days_twice_then_a_rollup_of_the_rollup(cluster: dict[str, Any], catalog: Catalog,
                                                             backfill_db: str) -> None:
    output = cluster["output"]
    started = time.monotonic()
    phases: list[str] = []

    def phase(name: str) -> None:
        phases.append(f"{name} {time.monotonic() - started:.0f} s")

    backfill(cluster, "materialize_h2o_daily", DAYS[0], DAYS[-1])
    wait_for_runs(cluster, "materialize_h2o_daily", len(DAYS))
    phase("first pass")
    runs = wait_for_runs(cluster, "materialize_h2o_daily", len(DAYS), closed=True)
    phase("closed")
    assert [state for _, state, _ in runs] == ["success"] * len(DAYS), runs
    assert sorted(p.name for p in (output / "h2o_daily").glob("*.jsonl")) == [f"{d}.jsonl" for d in DAYS]
    for d, day in enumerate(DAYS, start=1):
        assert daily_rows(output, day) == expected_day(d)
    first_files = registered_files(catalog, backfill_db)
    assert sorted(f["partition_key"] for f in first_files) == list(DAYS)

    # The same backfill again, reprocessing the completed runs: each interval is replaced, never added to.
    with catalog.engine.connect() as conn:
        mark = conn.execute(sa.text("SELECT now()")).scalar_one()
    backfill(cluster, "materialize_h2o_daily", DAYS[0], DAYS[-1], "--reprocess-behavior", "completed")
    deadline = time.monotonic() + RUNS_TIMEOUT_S
    while True:  # the reprocessed DAG runs update their query-run rows: wait until all of them ran again
        recorded = query_runs(catalog, definition="h2o_daily")
        if len(recorded) == len(DAYS) and all(r["status"] != "running" and r["started_at"] > mark
                                              for r in recorded):
            break
        assert time.monotonic() < deadline, recorded
        time.sleep(2)
    runs = wait_for_runs(cluster, "materialize_h2o_daily", len(DAYS))
    phase("second pass")
    assert [state for _, state, _ in runs] == ["success"] * len(DAYS), runs
    assert sorted(p.name for p in (output / "h2o_daily").iterdir() if not p.name.startswith(".")) == \
        [f"{d}.jsonl" for d in DAYS]
    for d, day in enumerate(DAYS, start=1):
        assert daily_rows(output, day) == expected_day(d)
    second_files = registered_files(catalog, backfill_db)
    assert sorted(f["partition_key"] for f in second_files) == list(DAYS)
    assert not {f["id"] for f in second_files} & {f["id"] for f in first_files}  # replaced, not added to
    runs_recorded = query_runs(catalog, definition="h2o_daily")  # one row per DAG run, updated by its rerun
    assert len(runs_recorded) == len(DAYS) and all(r["status"] == "success" for r in runs_recorded)
    assert all(r["database_name"] == backfill_db for r in runs_recorded)
    assert sorted({(r["interval_start"], r["interval_end"]) for r in runs_recorded}) == [
        (1704067200 * 10**9 + d * 86400 * 10**9, 1704067200 * 10**9 + (d + 1) * 86400 * 10**9)
        for d in range(len(DAYS))]

    # A rollup of the rollup: the monthly DAG reads table h2o_daily like any other table. The data's third day
    # was never rolled up, so the month holds two days: 2 + 2 samples, the larger day's maximum (expected_day).
    backfill(cluster, "materialize_h2o_monthly", "2024-01-01", "2024-01-01")
    [(_, state, _)] = wait_for_runs(cluster, "materialize_h2o_monthly", 1)
    phase("monthly")
    assert state == "success"
    monthly = sorted((json.loads(line) for line in (output / "h2o_monthly" / "2024-01.jsonl").read_text().splitlines()),
                     key=lambda r: r["state"])
    assert monthly == [
        {"state": "CA", "city": "SF", "time": "2024-01-01T00:00:00Z", "samples": 4, "temp_max": 102.0},
        {"state": "MA", "city": "Boston", "time": "2024-01-01T00:00:00Z", "samples": 4, "temp_max": 42.0},
    ]
    assert leftovers(output) == []
    assert locks(catalog) == []
    print("\nbackfill of two days, twice, then the monthly rollup: " + ", ".join(phases))
