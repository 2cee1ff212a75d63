"""A Spark Connect server survives any single query (`spark_jobs/connect_supervisor.py`): its JVM killed for real,
or ended by a query that takes all its memory, is started again by the supervisor within seconds on the same address
and tokens, `spark status` says so meanwhile, the query that took it down fails alone with one paragraph, and the
next query is served. On a private server of this module with a small driver memory (`SMALL_MEMORY`, the least Spark
starts with and quick to exhaust), never the suite's shared one, which other tests are using. Real Spark, real
processes, real signals. CI runs one case of each test (`common_support.sampled`); IOX_TEST_ALL=1 runs all."""

from __future__ import annotations

import json
from dataclasses import asdict
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from common_support import assert_one_paragraph_error, run_cli, sampled
from connect_support import Server
from iox_planner.catalog.store import Catalog
from iox_planner.ingest.scenario import load_scenario, read_scenario

pytestmark = pytest.mark.spark

H2O = Path(__file__).resolve().parents[2] / "examples" / "h2o.yaml"
SMALL_MEMORY = "768m"
RESTART_WITHIN_S = 90
"""A restart is a JVM start: 10 to 20 s here, more on a loaded machine; never the 180 s a client used to wait."""


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java here: Spark cannot run")
    server = Server(tmp_path_factory.mktemp("small-connect") / "spark-connect.log", memory=SMALL_MEMORY)
    try:
        server.up()
        yield server
    finally:
        server.stop()


@pytest.fixture
def h2o(catalog: Catalog, db: str) -> str:
    load_scenario(catalog, read_scenario(H2O), db)
    return db


def states_until_running(server: Server, seconds: float) -> list[str]:
    """What `status` said, each change once, from now until the server answers again (or `seconds` pass)."""
    from iox_planner.spark.server import server_state

    seen: list[str] = []
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        state = server_state(server.server)
        if not seen or seen[-1] != state:
            seen.append(state)
        if state == "running" and len(seen) > 1:
            break
        time.sleep(0.2)
    return seen


def status_line(server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[int, str]:
    """What `iox-batch spark status` prints for `server` (recorded as the project's own in a state folder of the
    test's) and its exit status."""
    from dataclasses import asdict

    from iox_planner.cli import spark as cli_spark
    from iox_planner.spark import server as sparkserver

    monkeypatch.setattr(sparkserver, "state_dir", lambda: tmp_path)
    (tmp_path / "spark-connect.json").write_text(json.dumps(asdict(server.server)))
    printed: list[str] = []

    class Console:
        def print(self, text: str) -> None:
            printed.append(text)

    return cli_spark.status(None, Console()), "\n".join(printed)  # type: ignore[arg-type]


# A session opened directly (the planner refuses such queries at plan time, so it would not reach the server): each
# row's list grows to gigabytes of strings in the JVM's heap, and the JVM runs out of memory.
EXHAUST = textwrap.dedent("""
    import sys
    from iox_planner.spark.server import named_remote
    from spark_jobs.connect import remote_session, server_lost
    spark = remote_session(named_remote(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
    try:
        spark.sql("SELECT length(concat_ws(',', collect_list(repeat(CAST(id AS STRING), 10000000)))) AS n "
                  "FROM range(300)").collect()
    except Exception as err:
        lost = server_lost(err)
        print(f"error: {lost if lost is not None else err}", file=sys.stderr)
        sys.exit(75 if lost is not None else 1)
""")


@pytest.mark.parametrize("cause", sampled(["out of memory", "killed"], 1))
def test_a_server_whose_jvm_ends_restarts_by_itself(cause: str, small_server: Server, h2o: str,
                                                    monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each case one JVM restart (10 to 20 s, more under load): ended by a query that takes all its memory (CI's
    case: that query fails alone, in one paragraph), or killed for real (IOX_TEST_ALL=1). Either way the supervisor
    starts it again on the same address and tokens, and the next query is served. The supervisor's restart policy
    itself (however often a server ends) is tested without a JVM in test_supervisor_restarts.py."""
    from iox_planner.spark.server import read_report

    env = small_server.env()
    server = small_server.server
    (jvm,) = small_server.jvms()
    restarts = read_report(server).restarts
    if cause == "killed":
        os.kill(jvm, signal.SIGKILL)
        started = time.monotonic()
        time.sleep(1.5)  # the serving process ends with its JVM; the supervisor sees it within a second
        code, line = status_line(small_server, monkeypatch, tmp_path)
        assert code == 3 and line.startswith("restarting: "), line
        assert "killed (SIGKILL)" in line and f"restarted {restarts + 1} time" in line, line
        states = states_until_running(small_server, RESTART_WITHIN_S)
        assert states == ["restarting", "running"], (states, time.monotonic() - started)
        code, line = status_line(small_server, monkeypatch, tmp_path)
        assert code == 0 and line.startswith("running: "), line
    else:
        # A client with the same settings as before is served (its session opens and its query runs), and this
        # query takes the whole heap: it fails alone, in one paragraph, and the server comes back.
        result = subprocess.run([sys.executable, "-c", EXHAUST, server.url(), str(server.gate_port), server.token],
                                capture_output=True, text=True, timeout=300, env={**os.environ, **env})
        assert result.returncode == 75, (result.stderr[-2000:], small_server.log.read_text()[-2000:])
        assert_one_paragraph_error(result, "Spark Connect server", "went away")
        started = time.monotonic()
        states = states_until_running(small_server, RESTART_WITHIN_S)
        assert states[-1] == "running", (states, time.monotonic() - started)
        report = read_report(server)
        assert "ran out of memory" in report.reason, report
        assert "Terminating due to java.lang.OutOfMemoryError" in small_server.log.read_text()
    assert small_server.jvms() != [jvm]
    assert read_report(server).restarts == restarts + 1
    # Same address, ports and tokens: the CLI with the settings it had before is served.
    result = run_cli("query", "--db", h2o, "--format", "jsonl", "SELECT count(*) AS n FROM h2o", env=env)
    assert result.returncode == 0, result.stderr
    assert [json.loads(row) for row in result.stdout.splitlines()] == [{"n": 8}]


@pytest.mark.parametrize("why", sampled(["no Java", "a heap too small"], 1))
def test_a_server_that_cannot_start_is_not_started_again_and_status_says_why(why: str, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """No JVM at all (CI's case, a second), or a JVM that starts and Spark refuses to run in its heap
    (IOX_TEST_ALL=1, a JVM start): either way the first start failed, and nothing is started again."""
    from iox_planner.errors import SparkUnavailableError
    from iox_planner.spark import server as sparkserver

    if why == "no Java":
        monkeypatch.setenv("JAVA_HOME", "/nonexistent/java")
    conf = {"spark.driver.memory": "32m"} if why == "a heap too small" else None
    server, proc = sparkserver.launch(tmp_path / "spark-connect.log", conf=conf)
    try:
        with pytest.raises(SparkUnavailableError) as failed:
            sparkserver.wait_until_up(server, proc)
        assert proc.wait(timeout=30) == 1  # the supervisor gave up rather than starting it again
    finally:
        sparkserver.stop_server(server)
    assert "did not start" in str(failed.value) and "its first start failed" in str(failed.value), failed.value
    report = sparkserver.read_report(server)
    assert report is not None and report.state == "failed" and report.restarts == 0, report
    assert sparkserver.server_state(server) == "failed"
    # A query on the project's own server, so recorded, is refused at once with the reason, not started again.
    monkeypatch.setattr(sparkserver, "state_dir", lambda: tmp_path)
    (tmp_path / "spark-connect.json").write_text(json.dumps(asdict(server)))
    with pytest.raises(SparkUnavailableError, match="failed and is not restarted by itself: its first start failed"):
        sparkserver.ensure_running()
