"""A triggered `iox_query` run through real Airflow (`airflow dags test`), killed: its spark-submit child SIGKILLed
at a seeded random moment across the Spark job's measured lifetime, and its commit task killed (the whole Airflow
process group, at the named point inside the commit's catalog transaction). After each: the output is complete
(the old one) or absent, the catalog is consistent, and the next run publishes exactly seed 001's hand-computed
answer, leaving nothing beside the output (the dead run's staging folder included). CI runs the commit-task
case; IOX_FAULT_POINTS >= 5 adds that many spark-submit kill points (seeded by IOX_FAULT_SEED)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from af_support import BIN, ROOT, leftovers, locks, query_runs
from test_airflow_iox_query import EXPECTED, QUERY

from iox_planner.catalog.store import Catalog
from iox_planner.ingest.scenario import load_scenario, read_scenario

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

SEED = int(os.environ.get("IOX_FAULT_SEED", "11"))
POINTS = int(os.environ.get("IOX_FAULT_POINTS", "2"))
SPARK_POINTS = POINTS


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def _descendants(pid: int) -> list[int]:
    tree, found, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _spark_submit(root: int) -> int | None:
    for pid in _descendants(root):
        if "org.apache.spark.deploy.SparkSubmit" in _cmdline(pid) and "run_plan.py" in _cmdline(pid):
            return pid
    return None


def _trigger(env: dict[str, str], conf: dict[str, Any], *, kill_spark_after: float | None = None
             ) -> tuple[subprocess.CompletedProcess[str], float | None, bool]:
    """`airflow dags test iox_query` in a process group of its own. With `kill_spark_after`, the spark-submit
    child (and everything under it) is SIGKILLed that many seconds after it appears. Returns the result, how long
    spark-submit lived (None: not seen) and whether it was killed."""
    proc = subprocess.Popen([str(BIN / "airflow"), "dags", "test", "iox_query", "-c", json.dumps(conf)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen_at = gone_at = None
    killed = False
    output: list[str] = []
    import threading

    reader = threading.Thread(target=lambda: output.extend(proc.stdout or []), daemon=True)
    reader.start()
    deadline = time.monotonic() + 900
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError("airflow dags test did not finish in 900 s")
            pid = _spark_submit(proc.pid)
            now = time.monotonic()
            if pid is not None and seen_at is None:
                seen_at = now
            if pid is None and seen_at is not None and gone_at is None:
                gone_at = now
            if pid is not None and kill_spark_after is not None and not killed and now - seen_at >= kill_spark_after:
                for victim in [pid, *_descendants(pid)]:
                    try:
                        os.kill(victim, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                killed = True
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(timeout=10)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group
        except ProcessLookupError:
            pass
    lived = None if seen_at is None else (gone_at or time.monotonic()) - seen_at
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(output), ""), lived, killed


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def own_h2o(catalog: Catalog) -> str:
    db = f"af_fault_{uuid.uuid4().hex[:8]}"
    load_scenario(catalog, read_scenario(ROOT / "examples" / "h2o.yaml"), db=db)
    return db


def _output_locks(catalog: Catalog, output: Path) -> list[dict[str, Any]]:
    return [lock for lock in locks(catalog) if str(output) in str(lock.get("definition", ""))]


@pytest.mark.skipif(POINTS < 5, reason="three Airflow runs with Spark: the full run only (IOX_FAULT_POINTS >= 5)")
def test_spark_submit_killed_mid_job(airflow_env: dict[str, str], catalog: Catalog, own_h2o: str,
                                     tmp_path: Path) -> None:
    output = tmp_path / "h2o.jsonl"
    conf = {"db": own_h2o, "sql": QUERY, "output": str(output), "format": "jsonl"}
    first, lived, _ = _trigger(airflow_env, conf)
    assert first.returncode == 0 and "state=success" in first.stdout, first.stdout[-4000:]
    assert lived is not None, "no spark-submit child was seen"
    assert _rows(output) == EXPECTED
    rng = random.Random(f"{SEED}:airflow-spark-submit")
    killed_count = 0
    for point in range(SPARK_POINTS):
        delay = rng.uniform(0, lived)
        context = (f"[replay: IOX_FAULT_SEED={SEED} IOX_FAULT_POINTS={POINTS}, operation airflow iox_query "
                   f"spark-submit, kill point {point} (SIGKILL {delay:.2f} s into its {lived:.2f} s)]")
        done, _, killed = _trigger(airflow_env, conf, kill_spark_after=delay)
        killed_count += killed
        # Complete (the old output, which is also the answer) or, had it been the first run, absent.
        assert _rows(output) == EXPECTED, context
        assert leftovers(tmp_path) == [], f"{context}: {leftovers(tmp_path)}"
        assert _output_locks(catalog, output) == [], context
        runs = query_runs(catalog, dag_id="iox_query", output=str(output))
        assert runs[-1]["status"] == ("failed" if killed else "success"), (context, runs[-1])
        if killed:
            assert "Traceback" not in (runs[-1]["error"] or ""), context
    again, _, _ = _trigger(airflow_env, conf)
    assert again.returncode == 0 and "state=success" in again.stdout, again.stdout[-4000:]
    assert _rows(output) == EXPECTED and leftovers(tmp_path) == []
    print(f"airflow spark-submit: {SPARK_POINTS} kill points, {killed_count} killed mid-job, 0 partial outputs")


def test_commit_task_killed_inside_its_transaction(airflow_env: dict[str, str], catalog: Catalog, own_h2o: str,
                                                   tmp_path: Path) -> None:
    """Regression: the killed run's staging folder (`.<output>.iox-run-...`) stayed beside the output forever."""
    output = tmp_path / "h2o.jsonl"
    conf = {"db": own_h2o, "sql": QUERY, "output": str(output), "format": "jsonl"}
    context = f"[replay: IOX_FAULT_SEED={SEED}, operation airflow iox_query commit task, kill point commit.before_commit]"
    # Its lock expires after 1 s (IOX_RUN_LOCK_TTL_S, hours by default) so that the next run may take it over.
    killed, _, _ = _trigger({**airflow_env, "IOX_FAULT_KILL_AT": "commit.before_commit", "IOX_RUN_LOCK_TTL_S": "1"},
                            conf)
    assert killed.returncode == -signal.SIGKILL, f"{context}: the kill point was not reached: {killed.stdout[-4000:]}"
    # Published just before the transaction (the rename precedes the run's own records), complete.
    assert not output.exists() or _rows(output) == EXPECTED, context
    [dead] = query_runs(catalog, dag_id="iox_query", output=str(output))
    assert dead["status"] == "running", context  # it never got to say otherwise
    assert any(".iox-run-" in name for name in leftovers(tmp_path)), context
    time.sleep(1.5)
    again, _, _ = _trigger({**airflow_env, "IOX_RUN_LOCK_TTL_S": "1"}, conf)
    assert again.returncode == 0 and "state=success" in again.stdout, f"{context}: {again.stdout[-4000:]}"
    assert _rows(output) == EXPECTED, context
    assert leftovers(tmp_path) == [], f"{context}: {leftovers(tmp_path)}"
    assert _output_locks(catalog, output) == [], context
