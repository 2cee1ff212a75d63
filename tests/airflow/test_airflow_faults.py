"""A triggered `iox_query` run through real Airflow (`airflow dags test`), killed: its spark-submit child SIGKILLed
at a seeded random moment across the Spark job's measured lifetime, and its commit task killed (the whole Airflow
process group) at seeded random moments across the commit task's measured duration and at the named points around
its publication and its catalog transaction. After each: the output is complete or absent, the catalog consistent,
and a retry of the commit task (`airflow tasks test iox_query commit <run id>`, what clearing the task does) or the
next run publishes exactly seed 001's hand-computed answer, leaving nothing beside the output.

The commit-task cases reuse ONE Spark result. Every run there is a real `airflow dags test` whose `run` task is
marked successful instead of started (`--mark-success-pattern`), paused as its commit task starts
(IOX_FAULT_PAUSE_AT=commit.start, plugins/iox_planner/faults.py); the first one's Spark job runs in this process's
shared SparkSession on the plan its plan task wrote, and that result is put where each later run's Spark job
would have written it (the same plan over the same catalog: the same rows). Then the run is continued and killed:
the process killed is the real Airflow process running the real commit task. The Postgres cases use a cluster of
the module's own (never the other tests' catalog).

CI samples the named point inside the commit's transaction, killed, and Postgres stopped there (a fixed seed makes
a CI "random" point one fixed case anyway); IOX_FAULT_POINTS >= 5 runs that many seeded random points
plus every named point, that many Postgres restarts in the commit task and while the Spark job runs, and that
many spark-submit kill points (seeded by IOX_FAULT_SEED)."""

from __future__ import annotations

import json
import shutil
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from airflow_support import BIN, ROOT, leftovers, locks, query_runs
from test_airflow_iox_query import EXPECTED, QUERY

from iox_planner.catalog.store import Catalog
from iox_planner.ingest.scenario import load_scenario, read_scenario

# The fault suite's own-cluster helpers (tests/faults/fault_support.py): the Postgres tests below stop and restart
# a cluster of their own, never the one the other tests' catalog lives in.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "faults"))
from fault_support import FaultWorld, Restarter, own_world, proc_stats  # noqa: E402

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

SEED = int(os.environ.get("IOX_FAULT_SEED", "11"))
POINTS = int(os.environ.get("IOX_FAULT_POINTS", "2"))
SPARK_POINTS = POINTS


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for pid, fields in proc_stats():
        out.setdefault(int(fields[1]), []).append(pid)
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


def _trigger(env: dict[str, str], conf: dict[str, Any], *, kill_spark_after: float | None = None,
             when_spark_starts: Callable[[], None] | None = None,
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
                if when_spark_starts is not None:
                    when_spark_starts()
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


# --- the commit task, killed; the catalog's Postgres restarted -------------------------------------------------

NAMED_POINTS = ("publish.before_rename", "publish.after_rename", "commit.before_commit", "commit.after_commit")
FULL = POINTS >= 5
# CI: the named point inside the transaction (the retry that regressed) and one Postgres restart in the commit.
COMMIT_POINTS = POINTS if FULL else 0
CI_NAMED = ("commit.before_commit",)
RESTARTS = POINTS if FULL else 1


class Paused:
    """An Airflow command in a process group of its own, its output in a file (a stopped process must not block
    on a full pipe)."""

    def __init__(self, env: dict[str, str], args: list[str], log: Path) -> None:
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen([str(BIN / "airflow"), *args], env=env, stdout=self._out,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait_paused(self, timeout: float = 600) -> bool:
        """True once the process stopped itself at its pause point; False if it exited first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # WNOWAIT: an exit stays for Popen to reap; a stop is reported once and is all we wait for.
            info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
            if info is not None and info.si_pid == self.proc.pid:
                return info.si_code == os.CLD_STOPPED
            time.sleep(0.02)
        self.kill()
        raise AssertionError(f"no pause point reached in {timeout} s: {self.output()[-4000:]}")

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def finish(self, timeout: float = 600) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            self.kill()  # stragglers of the group
            self.proc.wait()
            self._out.close()
        return code

    def output(self) -> str:
        if not self._out.closed:
            self._out.flush()
        return self.log.read_text(errors="replace")


class AfWorld:
    """The module's own Postgres cluster holding a catalog with seed 001's h2o, its own warehouse, one output, and
    the ONE Spark result the commit-task cases reuse (see the module's docstring)."""

    def __init__(self, airflow_env: dict[str, str], fw: FaultWorld, db: str, folder: Path) -> None:
        self.fw, self.catalog, self.folder = fw, fw.catalog, folder
        self.env = {**airflow_env, "IOX_CATALOG_URL": fw.url, "IOX_WAREHOUSE": str(fw.warehouse)}
        self.output = folder / "out" / "h2o.jsonl"
        self.output.parent.mkdir()
        self.conf = {"db": db, "sql": QUERY, "output": str(self.output), "format": "jsonl"}
        self.spark_result = folder / "spark-result"
        self._commit_seconds: float | None = None
        self.logs = 0

    def start(self, args: list[str], **env: str) -> Paused:
        self.logs += 1
        return Paused({**self.env, **env}, args, self.folder / f"airflow-{self.logs}.log")

    def staging(self) -> Path:
        [staging] = [p for p in self.output.parent.iterdir() if p.name.startswith(f".{self.output.name}.iox-run-")]
        return staging

    def armed(self, pause_also: str | None = None, **env: str) -> Paused:
        """A new run, paused as its commit task starts, with the Spark result in its staging folder. The first
        one's Spark job runs here, in this process's shared SparkSession (no JVM start of its own), on the plan its
        plan task wrote; its result is kept for the later runs. `pause_also`: a later point it stops at too."""
        pause = "commit.start" + (f",{pause_also}" if pause_also else "")
        run = self.start(["dags", "test", "iox_query", "-c", json.dumps(self.conf), "--mark-success-pattern", "run"],
                         IOX_FAULT_PAUSE_AT=pause, **env)
        if not run.wait_paused():
            run.finish()
            raise AssertionError(f"the run never reached its commit: {run.output()[-4000:]}")
        staging = self.staging()
        assert not (staging / "metrics.json").exists(), "the run task was to be marked successful, not run"
        if not self.spark_result.exists():
            self._spark_job(staging / "plan.json")
        for name in ("result.jsonl", "metrics.json"):
            shutil.copy2(self.spark_result / name, staging / name)
        return run

    def _spark_job(self, plan_file: Path) -> None:
        from iox_planner.catalog.publications import CatalogLedger
        from iox_planner.output import OutputFormat
        from iox_planner.output.publish import publishing_as
        from iox_planner.spark.budget import query_timeout_s
        from iox_planner.spark.jobs import PlanJob
        from spark_jobs.launch import InProcessLauncher

        folder = self.folder / "spark-job"
        folder.mkdir()
        with publishing_as("fault test spark job", CatalogLedger(self.catalog)):
            InProcessLauncher().run(PlanJob(plan_file, folder / "result.jsonl", OutputFormat.JSONL,
                                            query_timeout_s(), self.fw.warehouse, report=folder / "metrics.json"))
        folder.rename(self.spark_result)

    def commit_seconds(self) -> float:
        """How long the commit task takes: from its continuing at commit.start to Airflow's "end task" line for
        it (measured once, uninterrupted). What follows in the process (Airflow finishing the DAG run) is not
        the commit task's, and random moments drawn across it would mostly miss the commit."""
        if self._commit_seconds is None:
            run = self.armed()
            started = time.monotonic()
            run.resume()
            while "end task task_id=commit" not in run.output() and run.proc.poll() is None:
                time.sleep(0.005)
            self._commit_seconds = time.monotonic() - started
            assert run.finish() == 0 and "state=success" in run.output(), run.output()[-4000:]
            assert "end task task_id=commit" in run.output(), run.output()[-4000:]
            self.check_done("the measured run")
        return self._commit_seconds

    def rerun(self, context: str) -> None:
        """A new run of the same conf, to its end."""
        run = self.armed()
        run.resume()
        assert run.finish() == 0 and "state=success" in run.output(), f"{context}: {run.output()[-4000:]}"

    def retry_commit(self, run_id: str) -> str:
        """The killed commit task run again in its own DAG run, as `airflow tasks clear` would have it."""
        done = subprocess.run([str(BIN / "airflow"), "tasks", "test", "iox_query", "commit", run_id,
                               "-t", json.dumps(self.conf)], env=self.env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        return done.stdout + done.stderr

    def last_run(self) -> dict[str, Any]:
        return query_runs(self.catalog, dag_id="iox_query", output=str(self.output))[-1]

    def check_visible(self, context: str) -> dict[str, Any]:
        """After a kill or a restart: the output is complete (the answer every run here publishes), the run's
        record and the output's lock agree."""
        assert _rows(self.output) == EXPECTED, f"{context}: a partial output is visible"
        visible = [p.name for p in self.output.parent.iterdir() if not p.name.startswith(".")]
        assert visible == [self.output.name], f"{context}: {visible}"
        run = self.last_run()
        held = _output_locks(self.catalog, self.output)
        assert (held != []) == (run["status"] == "running"), f"{context}: run {run['status']} but locks {held}"
        assert "Traceback" not in (run["error"] or ""), context
        return run

    def check_done(self, context: str) -> None:
        assert _rows(self.output) == EXPECTED, f"{context}: the answer"
        assert leftovers(self.output.parent) == [], f"{context}: {leftovers(self.output.parent)}"
        assert _output_locks(self.catalog, self.output) == [], context
        run = self.last_run()
        assert run["status"] == "success" and run["row_count"] == len(EXPECTED), (context, run["status"], run["error"])


@pytest.fixture(scope="module")
def af_world(airflow_env: dict[str, str], spark: object, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[AfWorld]:
    with own_world("af_faults", tmp_path_factory.mktemp("af_fault_warehouse")) as fw:
        db = "af_fault_h2o"
        load_scenario(fw.catalog, read_scenario(ROOT / "examples" / "h2o.yaml"), db=db, warehouse=fw.warehouse)
        yield AfWorld(airflow_env, fw, db, tmp_path_factory.mktemp("af_fault"))


def _replay(operation: str, point: object) -> str:
    return f"[replay: IOX_FAULT_SEED={SEED} IOX_FAULT_POINTS={POINTS}, operation {operation}, kill point {point}]"


def test_commit_task_killed_at_random_and_named_points(af_world: AfWorld) -> None:
    """Regression (commit.before_commit, publish.after_rename): the commit moved the staged result into place, so
    a commit killed after that rename but before its transaction committed could not be retried: the retry found
    no staged result and marked the run failed over an output it had already replaced."""
    w = af_world
    rng = random.Random(f"{SEED}:airflow-commit-task")
    seconds = w.commit_seconds() if COMMIT_POINTS else 0.0
    points: list[tuple[str, float | None]] = [(f"random {i}", rng.uniform(0, seconds * 1.1))
                                              for i in range(COMMIT_POINTS)]
    points += [(name, None) for name in (NAMED_POINTS if FULL else CI_NAMED)]
    found = {"killed": 0, "finished first": 0, "run left running": 0, "run left succeeded": 0}
    for point, delay in points:
        when = f"SIGKILL {delay:.3f} s into its {seconds:.3f} s" if delay is not None else "named"
        context = _replay("airflow iox_query commit task", f"{point} ({when})")
        run = w.armed(**({} if delay is not None else {"IOX_FAULT_KILL_AT": point}))
        run.resume()
        if delay is not None:
            time.sleep(delay)
            killed = run.proc.poll() is None
            run.kill()
            code = run.finish()
            assert killed or code == 0, f"{context}: {run.output()[-4000:]}"
        else:
            killed = run.finish() == -signal.SIGKILL
            assert killed, f"{context}: the kill point was not reached: {run.output()[-4000:]}"
        found["killed" if killed else "finished first"] += 1
        dead = w.check_visible(context)
        found["run left running" if dead["status"] == "running" else "run left succeeded"] += 1
        retried = w.retry_commit(dead["run_id"])
        w.check_done(f"{context}, after the retry: {retried[-3000:]}")
    report = (f"airflow commit task: {COMMIT_POINTS} random + {len(points) - COMMIT_POINTS} named kill points, "
              f"{found}, 0 partial outputs, 0 tracebacks")
    print(report)


@pytest.mark.skipif(not FULL, reason="the next run's cleanup: full run only (CI retries the killed commit instead)")
def test_killed_commit_is_cleaned_by_the_next_run(af_world: AfWorld) -> None:
    """Regression: the killed run's staging folder (`.<output>.iox-run-...`) stayed beside the output forever.
    Here nobody retries the killed commit: the next run (its lock expired, IOX_RUN_LOCK_TTL_S=1) removes it."""
    w = af_world
    context = _replay("airflow iox_query commit task, not retried", "commit.before_commit")
    run = w.armed(IOX_FAULT_KILL_AT="commit.before_commit", IOX_RUN_LOCK_TTL_S="1")
    run.resume()
    assert run.finish() == -signal.SIGKILL, f"{context}: the kill point was not reached: {run.output()[-4000:]}"
    dead = w.check_visible(context)
    assert dead["status"] == "running", context  # it never got to say otherwise
    assert any(".iox-run-" in name for name in leftovers(w.output.parent)), context
    time.sleep(1.5)
    w.rerun(context)
    w.check_done(context)


# Postgres stopped while the commit task is stopped at a named point: inside its open transaction (the COMMIT
# then meets a dead connection; CI runs this one) and just after it committed.
RESTART_POINTS = ["commit.before_commit", "commit.after_commit"] if FULL else ["commit.before_commit"]


def _restart_outcome(w: AfWorld, context: str, outcomes: dict[str, int]) -> None:
    dead = w.check_visible(context)
    assert dead["status"] in ("success", "failed"), f"{context}: the run is left {dead['status']}"
    if dead["status"] == "failed":
        assert "catalog's Postgres was unreachable" in dead["error"], (context, dead["error"])
        outcomes["failed retryably"] += 1
        w.rerun(context)
    else:
        outcomes["succeeded"] += 1
    w.check_done(context)


def test_postgres_restarted_during_the_commit_task(af_world: AfWorld) -> None:
    """The catalog's Postgres (this module's own cluster) stopped, immediate mode, and started again 0.7 s later:
    at named points where the commit task is held (inside its transaction, before the COMMIT; just after it), and
    in the full run also at seeded random moments across the commit task's measured duration. The run either
    succeeds or fails with the retryable catalog error recorded (once Postgres is back: run failed, lock released,
    nothing partial); never left running. A new run then publishes the answer."""
    w = af_world
    rng = random.Random(f"{SEED}:airflow-commit-postgres")
    outcomes = {"succeeded": 0, "failed retryably": 0}
    for name in RESTART_POINTS:
        context = _replay("airflow iox_query commit task + Postgres restart", name)
        run = w.armed(pause_also=name)
        run.resume()
        assert run.wait_paused(), f"{context}: the commit never reached {name}: {run.output()[-4000:]}"
        w.fw.stop_pg("immediate")
        run.resume()
        time.sleep(0.7)
        w.fw.start_pg()
        run.finish()
        if name == "commit.before_commit":  # a COMMIT sent on a dead connection cannot have committed
            assert w.last_run()["status"] == "failed", f"{context}: {w.last_run()}"
        _restart_outcome(w, context, outcomes)
    seconds = w.commit_seconds() if FULL else 0.0
    for point in range(RESTARTS if FULL else 0):
        delay = rng.uniform(0, seconds * 1.1)
        context = _replay("airflow iox_query commit task + Postgres restart",
                          f"{point} (stop {delay:.3f} s into its {seconds:.3f} s)")
        run = w.armed()
        with Restarter(w.fw, delay):
            run.resume()
            run.finish()
        _restart_outcome(w, context, outcomes)
    print(f"airflow commit task + Postgres restart: {len(RESTART_POINTS)} named points + "
          f"{RESTARTS if FULL else 0} random moments, {outcomes}, 0 partial outputs")


@pytest.mark.skipif(not FULL, reason="a Spark job per point: full run only (IOX_FAULT_POINTS >= 5)")
def test_postgres_restarted_while_the_spark_job_runs(af_world: AfWorld) -> None:
    """The same, the stop drawn across the spark-submit's measured lifetime (the Spark job publishes its result
    into the run's staging through the catalog's publication ledger)."""
    w = af_world
    first, lived, _ = _trigger(w.env, w.conf)
    assert first.returncode == 0 and "state=success" in first.stdout and lived is not None, first.stdout[-4000:]
    w.check_done("uninterrupted run")
    rng = random.Random(f"{SEED}:airflow-spark-postgres")
    outcomes = {"succeeded": 0, "failed retryably": 0, "failed": 0}
    for point in range(RESTARTS):
        delay = rng.uniform(0, lived)
        context = _replay("airflow iox_query Spark job + Postgres restart",
                          f"{point} (stop {delay:.2f} s into its {lived:.2f} s)")
        restarter = Restarter(w.fw, delay)
        try:
            _trigger(w.env, w.conf, when_spark_starts=restarter.__enter__)
        finally:
            if restarter.thread.is_alive() or restarter.thread.ident is not None:
                restarter.__exit__(None, None, None)
        dead = w.check_visible(context)
        assert dead["status"] in ("success", "failed"), f"{context}: the run is left {dead['status']}"
        if dead["status"] == "failed":
            retryable = "catalog" in (dead["error"] or "").lower()
            outcomes["failed retryably" if retryable else "failed"] += 1
            w.rerun(context)
        else:
            outcomes["succeeded"] += 1
        w.check_done(context)
    print(f"airflow Spark job + Postgres restart: {RESTARTS} restarts, {outcomes}, 0 partial outputs")
