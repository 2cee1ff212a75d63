"""Helpers of the Airflow tests: environments, running DAGs with real Airflow, reading what runs recorded."""

from __future__ import annotations

import json
import os
import contextlib
import queue
import secrets
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import sqlalchemy as sa
import yaml

from common_support import free_port
from iox_planner.catalog.store import Catalog

ROOT = Path(__file__).resolve().parents[2]
DAGS = ROOT / "dags"
DATA = Path(__file__).resolve().parent / "data"
BIN = Path(sys.executable).parent
RUNNER = Path(__file__).resolve().parent / "dagtest_runner.py"
PREFIX = "@@RESULT "


DAILY_SQL = """\
SELECT state, city, date_trunc('day', time) AS time, count(*) AS samples,
       avg(temp) AS temp_avg, max(temp) AS temp_max
FROM h2o
GROUP BY state, city, date_trunc('day', time)
"""
MONTHLY_SQL = """\
SELECT state, city, date_trunc('month', time) AS time, sum(samples) AS samples, max(temp_max) AS temp_max
FROM h2o_daily
GROUP BY state, city, date_trunc('month', time)
"""


def write_definitions(folder: Path, h2o3: str, fail: str) -> None:
    """The tests' materialized queries: a daily rollup registered as table h2o_daily, a monthly rollup of that
    rollup, and a daily rollup over the database the failure test breaks. Each ends in January 2024, so a
    running scheduler never makes a scheduled run of its own (only backfills and dag.test() run them)."""
    common = {"schedule": "@daily", "start_date": "2024-01-01", "end_date": "2024-02-01", "catchup": False}
    definitions = [
        {"name": "h2o_daily", "db": h2o3, "sql": DAILY_SQL, **common, "paused": False,
         "output": "h2o_daily/{start:%Y-%m-%d}.jsonl", "format": "jsonl",
         "register_as": {"table": "h2o_daily", "tags": ["state", "city"]}},
        {"name": "h2o_monthly", "db": h2o3, "sql": MONTHLY_SQL, **common, "schedule": "@monthly", "paused": False,
         "output": "h2o_monthly/{start:%Y-%m}.jsonl", "format": "jsonl"},
        {"name": "h2o_fail", "db": fail, "sql": DAILY_SQL, **common, "paused": True,
         "output": "h2o_fail/{start:%Y-%m-%d}", "format": "parquet",
         "register_as": {"table": "h2o_fail_daily", "tags": ["state", "city"]}},
    ]
    folder.mkdir(parents=True, exist_ok=True)
    for definition in definitions:
        (folder / f"{definition['name']}.yaml").write_text(yaml.safe_dump(definition, sort_keys=False))


T0 = 1704067200 * 10**9
DAY = 86_400 * 10**9


def overlapping_chunks() -> tuple[list[dict[str, Any]], dict[tuple[str, int], float]]:
    """Two partitions (2024-01-01 and 02) of three overlapping Parquet files each, as scenario chunks, and the
    test's own tally of the deduplicated rows (later orders overwrite: IOx's last write wins)."""
    chunks, want = [], {}
    for order in range(1, 7):
        day = order % 2
        points = [(f"h{i % 2}", T0 + day * DAY + i * 10**9, order * 100 + i) for i in range(order, order + 5)]
        chunks.append({"id": f"F{order}", "kind": "parquet", "order": order,
                       "lines": "\n".join(f"cpu,host={h} usage={v} {t}" for h, t, v in points)})
        for h, t, v in points:
            want[(h, t)] = float(v)
    return chunks, want


def base_env(catalog_url: str, home: Path, output: Path, definitions: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "IOX_"))}
    env.update({
        "IOX_HOME": str(ROOT),
        "IOX_CATALOG_URL": catalog_url,
        "IOX_WAREHOUSE": os.environ["IOX_WAREHOUSE"],
        "IOX_OUTPUT_ROOT": str(output),
        "IOX_MATERIALIZED_DIR": str(definitions),
        "IOX_SPARK_MASTER": "local[2]",
        "IOX_SPARK_RETRIES": "0",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(home / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__PARALLELISM": "2",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
    })
    return env


def setup_airflow(env: dict[str, str], *, reserialize: bool = False) -> None:
    args = [sys.executable, str(DAGS / "iox_airflow" / "setup_airflow.py")] + (["--reserialize"] if reserialize else [])
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


class DagRunner:
    """The test session's long-lived dagtest_runner.py process: real Airflow, started once, running `dag.test()`
    for every test that asks (see that file). Its process group is always stopped at the end."""

    def __init__(self, env: dict[str, str], stderr_log: Path, timeout: float = 300) -> None:
        self.stderr_log = stderr_log
        self._stderr = stderr_log.open("w")
        self.proc = subprocess.Popen([sys.executable, str(RUNNER)], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1,
                                     start_new_session=True)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self._read(timeout)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _read(self, timeout: float) -> tuple[Any, str]:
        deadline = time.monotonic() + timeout
        log: list[str] = []
        while True:
            try:
                line = self._lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"dag.test runner gave no answer within {timeout} s:\n"
                                     + "".join(log)[-4000:]) from None
            if line is None:
                raise AssertionError("dag.test runner exited:\n" + "".join(log)[-4000:]
                                     + self.stderr_log.read_text()[-4000:])
            if line.startswith(PREFIX):
                return json.loads(line[len(PREFIX):]), "".join(log)
            log.append(line)

    def run(self, specs: list[dict[str, Any]], env: dict[str, str] | None = None,
            timeout: float = 900) -> list[dict[str, Any]]:
        """`dag.test()` each spec in turn; `env` applies to these runs only."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps([{**spec, "env": {**(env or {}), **spec.get("env", {})}}
                                          for spec in specs]) + "\n")
        self.proc.stdin.flush()
        results, log = self._read(timeout)
        for result in results:
            result["log"] = log[-20000:]
        return list(results)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._stderr.close()


def airflow_cli(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "airflow"), *args], env=env, capture_output=True, text=True, timeout=timeout)


def query_runs(catalog: Catalog, **where: Any) -> list[dict[str, Any]]:
    """iox_query_run rows, read straight from the catalog."""
    clauses = " AND ".join(f"{k} = :{k}" for k in where) or "true"
    with catalog.engine.connect() as conn:
        rows = conn.execute(sa.text(f"SELECT * FROM iox_query_run WHERE {clauses} ORDER BY id").bindparams(**where))
        return [dict(r) for r in rows.mappings()]


def locks(catalog: Catalog) -> list[dict[str, Any]]:
    with catalog.engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text("SELECT * FROM iox_run_lock")).mappings()]


def leftovers(folder: Path) -> list[str]:
    """Staging folders or temporary files a run left behind."""
    if not folder.exists():
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if ".iox-run-" in p.name or p.name.endswith((".tmp", ".old")))


# --- a real scheduler and api-server ---------------------------------------------------------------------------


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


@contextlib.contextmanager
def scheduler_cluster(env: dict[str, str], home: Path) -> Iterator[dict[str, Any]]:
    """A real api-server and scheduler (LocalExecutor) on `env` (a `base_env` whose AIRFLOW_HOME is `home`), each
    in its own process group, started with bounded waits and always stopped. Yields the env it runs with and the
    processes (`scheduler`, `api_server`)."""
    port = free_port()
    env = {**env,
           "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
           "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
           "AIRFLOW__API__PORT": str(port),
           "AIRFLOW__API__HOST": "127.0.0.1",
           "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
           "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
           "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO"}
    setup_airflow(env, reserialize=True)
    api = _start(["api-server", "--port", str(port), "--workers", "1"], env, home / "api-server.log")
    scheduler = _start(["scheduler", "--skip-serve-logs"], env, home / "scheduler.log")
    procs = [api, scheduler]
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
        yield {"env": env, "home": home, "scheduler": scheduler, "api_server": api}
    finally:
        for proc in procs:
            _stop(proc)


def dag_run_state(home: Path, dag_id: str, run_id: str) -> str | None:
    """The state the scheduler recorded for one DAG run (the metadata DB, read only)."""
    with sqlite3.connect(f"file:{home / 'airflow.db'}?mode=ro", uri=True, timeout=30) as db:
        row = db.execute("SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", (dag_id, run_id)).fetchone()
    return None if row is None else str(row[0])
