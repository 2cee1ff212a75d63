"""The `connect` runner (IOX_RUNNER=connect) on a real Spark Connect server and real Postgres: queries end to end
as a user runs them (the whole `iox-batch` process, with no Java to start a JVM of its own), the last gate on the
server's parser with the same cases as the in-process gate and its endpoint's token, a budget that cancels the
query on the server, compaction and a bulk load on the server's workers, two queries at once, and a lost server as
the retryable error (75).

The tests share the private server of the whole run (`tests/connect_support.py`, started once, about 20 s; the
test that kills it runs last) with the end-to-end cases and the fuzzer's Connect leg, never
the project's own (`iox-batch spark start`), which a developer may be using. Skipped only where there is no Java.
A Connect client switches its whole Python process to Connect mode, so every client here is a child process: the
CLI, or a small script for the gate."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from common_support import assert_one_paragraph_error, live_chunks, run_cli
from connect_support import SLOW, Server, kills_the_server
from gate_support import GATE_ALLOWED, GATE_REFUSED
from iox_planner.catalog.store import Catalog
from iox_planner.ingest.scenario import load_scenario, read_scenario

pytestmark = pytest.mark.spark

H2O = Path(__file__).resolve().parents[2] / "examples" / "h2o.yaml"
QUERY = "SELECT state, city, min_temp, max_temp, area, time FROM h2o ORDER BY state, city, time"
# Seed 001's rows, as `iox-batch query --format jsonl` prints them (tests/spark_jobs/test_e2e.py has the same).
ROWS = [
    {"state": "CA", "city": "SF", "min_temp": 68.4, "max_temp": 85.7, "area": 500, "time": "1970-01-01T00:00:00.0000006Z"},
    {"state": "CA", "city": "SF", "min_temp": 68.4, "max_temp": 85.7, "area": 500,
     "time": "1970-01-01T00:00:00.00000065Z"},
    {"state": "CA", "city": "SJ", "min_temp": 68.5, "max_temp": 90.0, "area": None,
     "time": "1970-01-01T00:00:00.0000006Z"},
    {"state": "CA", "city": "SJ", "min_temp": 75.5, "max_temp": 84.08, "area": None,
     "time": "1970-01-01T00:00:00.0000007Z"},
    {"state": "MA", "city": "Bedford", "min_temp": None, "max_temp": 80.75, "area": 742,
     "time": "1970-01-01T00:00:00.0000004Z"},
    {"state": "MA", "city": "Bedford", "min_temp": None, "max_temp": 88.75, "area": 742,
     "time": "1970-01-01T00:00:00.0000006Z"},
    {"state": "MA", "city": "Boston", "min_temp": 65.4, "max_temp": 82.67, "area": None,
     "time": "1970-01-01T00:00:00.0000004Z"},
    {"state": "MA", "city": "Boston", "min_temp": 67.4, "max_temp": None, "area": None,
     "time": "1970-01-01T00:00:00.00000055Z"},
]


@pytest.fixture
def h2o(catalog: Catalog, db: str) -> str:
    load_scenario(catalog, read_scenario(H2O), db)
    return db


def server_log_tail(server: Server, lines: int = 60) -> str:
    """The end of the private server's log, for a failure's message: what the server was doing meanwhile."""
    try:
        return "\n".join(server.log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as err:
        return f"(no server log: {err})"


def jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_a_query_over_connect_gives_the_deduplicated_rows_in_every_format(connect: dict[str, str], h2o: str,
                                                                          tmp_path: Path) -> None:
    result = run_cli("query", "--db", h2o, "--format", "jsonl", QUERY, env=connect)
    assert result.returncode == 0, result.stderr
    assert jsonl(result.stdout) == ROWS

    # Parquet is written by the server's executors, into the staging folder this process holds open.
    result = run_cli("query", "--db", h2o, "--format", "parquet", "--output", str(tmp_path / "out"), QUERY, env=connect)
    assert result.returncode == 0, result.stderr
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "out").sort_by([("state", "ascending"), ("city", "ascending")])
    assert table.column("city").to_pylist() == [r["city"] for r in ROWS]

    result = run_cli("explain", "--analyze", "--db", h2o, QUERY, env=connect)
    assert result.returncode == 0, result.stderr
    assert "metrics=[output_rows=8" in result.stdout and "analyze: 8 result rows" in result.stdout


GATE_SCRIPT = textwrap.dedent("""
    import json, sys
    from iox_planner.spark.server import remote
    from spark_jobs.connect import remote_session
    from spark_jobs.gate import check_query_text
    spark = remote_session(remote())
    spark.sql("SELECT 1 AS city").createOrReplaceTempView("__iox_scan_0")
    tables = lambda: sorted(t.name for t in spark.catalog.listTables())
    before = tables()
    out = []
    for text in json.loads(sys.stdin.read()):
        try:
            check_query_text(spark, text, ["__iox_scan_0"], ["city"])
            out.append([text, None, ""])
        except Exception as err:
            out.append([text, type(err).__name__, str(err)])
    print(json.dumps({"results": out, "tables_changed": tables() != before}))
""")


def test_the_last_gate_over_connect_refuses_and_lets_through_what_it_does_in_process(connect: dict[str, str]) -> None:

    # EXPLAIN would analyze the text, and analysis runs EXECUTE IMMEDIATE's statement: the table would exist.
    refused = [*GATE_REFUSED, ("EXECUTE IMMEDIATE 'CREATE TABLE pwned_by_gate AS SELECT 1'", "not as a read-only")]
    texts = [text for text, _ in refused] + GATE_ALLOWED
    probe = subprocess.run([sys.executable, "-c", GATE_SCRIPT], input=json.dumps(texts),
                           capture_output=True, text=True, timeout=600, env={**os.environ, **connect})
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout.splitlines()[-1])
    results = {text: (kind, message) for text, kind, message in found["results"]}
    for text, needle in refused:
        kind, message = results[text]
        assert kind in ("UnsupportedError", "BadQueryError") and needle in message, (text, kind, message)
    for text in GATE_ALLOWED:
        assert results[text] == (None, ""), text
    assert not found["tables_changed"]
    assert not Path("/tmp/iox_gate_pwned").exists()


def gate_call(server: Any, body: bytes, token: str | None, method: str = "POST", path: str = "/parse",
              length: str | None = None) -> tuple[int, dict[str, Any]]:
    import http.client

    conn = http.client.HTTPConnection(server.reach(), server.gate_port, timeout=60)
    try:
        conn.putrequest(method, path)
        if token is not None:
            conn.putheader("Authorization", f"Bearer {token}")
        conn.putheader("Content-Length", length if length is not None else str(len(body)))
        conn.endheaders()
        if length is None:
            conn.send(body)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_the_gate_endpoint_parses_one_text_for_the_token_only(connect_server: Server) -> None:
    server = connect_server.server
    status, answer = gate_call(server, b"SELECT city FROM __iox_scan_0", server.token)
    assert status == 200
    assert "UnresolvedRelation" in answer["plan"] and "__iox_scan_0" in answer["plan"]
    assert gate_call(server, b"SELEC oops", server.token)[1]["error"] == "parse"
    # Parsed, not analyzed: the table is named in the plan, never created.
    status, answer = gate_call(server, b"EXECUTE IMMEDIATE 'CREATE TABLE pwned_by_endpoint AS SELECT 1'", server.token)
    assert status == 200 and "ExecuteImmediate" in answer["plan"]
    for token in (None, "", server.token[:-1] + ("0" if server.token[-1] != "0" else "1")):
        assert gate_call(server, b"SELECT 1", token)[0] == 401
    assert gate_call(server, b"", server.token, length=str(5 * 1_048_576))[0] == 413
    assert gate_call(server, b"\xff\xfe", server.token)[0] == 400
    assert gate_call(server, b"", server.token, method="GET")[0] == 405
    assert gate_call(server, b"SELECT 1", server.token, path="/other")[0] == 404


def test_the_gate_endpoint_refuses_a_text_past_the_planners_limits_before_sparks_parser(
        connect_server: Server) -> None:
    server = connect_server.server
    texts = {"SELECT " + "(" * 200_000 + "1" + ")" * 200_000: "nests",  # 400 KB of nesting
             "SELECT 1 FROM t WHERE a IN (" + ",".join(["1"] * 2_000_000) + ")": "list of"}  # 4 MB, 2M values
    for text, needle in texts.items():
        started = time.monotonic()
        status, answer = gate_call(server, text.encode(), server.token)
        took = time.monotonic() - started
        assert status == 200 and answer["error"] == "parse" and needle in answer["message"], (status, answer)
        assert took < 20, took
    status, answer = gate_call(server, b"SELECT city FROM __iox_scan_0 WHERE a IN (1, 2)", server.token)
    assert status == 200 and "UnresolvedRelation" in answer["plan"], answer


def test_a_query_is_refused_when_the_gate_refuses_the_token_or_does_not_answer(
        connect: dict[str, str], h2o: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    bad = {**connect, "IOX_SPARK_GATE_TOKEN": "f" * 64}
    result = run_cli("query", "--db", h2o, "--format", "jsonl", "SELECT count(*) AS n FROM h2o", env=bad)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert_one_paragraph_error(result, "refused the token", "IOX_SPARK_GATE_TOKEN")
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        down = {**connect, "IOX_SPARK_GATE_PORT": str(closed.getsockname()[1])}
        result = run_cli("query", "--db", h2o, "--format", "jsonl", "SELECT count(*) AS n FROM h2o", env=down)
    assert result.returncode == 75, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert_one_paragraph_error(result, "did not answer", "not run")
    missing = {k: v for k, v in connect.items() if k != "IOX_SPARK_GATE_TOKEN"}
    monkeypatch.delenv("IOX_SPARK_GATE_TOKEN", raising=False)
    result = run_cli("query", "--db", h2o, "SELECT 1", env=missing)
    assert result.returncode == 2
    assert_one_paragraph_error(result, "IOX_SPARK_GATE_TOKEN is not set")
    # An empty value is not taken as unset: every setting is taken exactly.
    result = run_cli("query", "--db", h2o, "SELECT 1", env={**missing, "IOX_SPARK_GATE_TOKEN": ""})
    assert result.returncode == 2
    assert_one_paragraph_error(result, "IOX_SPARK_GATE_TOKEN=", "it is empty")


def test_a_budget_cancels_the_query_on_the_server_which_serves_the_next(connect: dict[str, str], h2o: str,
                                                                       connect_server: Server) -> None:
    warm = run_cli("query", "--db", h2o, "--format", "jsonl", "SELECT count(*) AS n FROM h2o", env=connect)
    assert warm.returncode == 0 and jsonl(warm.stdout) == [{"n": 8}], warm.stderr
    started = time.monotonic()
    result = run_cli("query", "--db", h2o, "--timeout", "3", SLOW, env=connect)
    elapsed = time.monotonic() - started
    assert result.returncode == 124, (result.stdout, result.stderr)
    # The paragraph names what was left for Spark after planning (main's budget covers planning too).
    assert_one_paragraph_error(result, "ran past its time budget of", "and was cancelled")
    assert elapsed < 3 + 20, elapsed
    # The cancelled tasks gave their cores back: the next query answers at once, in full.
    after = run_cli("query", "--db", h2o, "--format", "jsonl", "--timeout", "60", QUERY, env=connect)
    assert after.returncode == 0, (after.stderr, server_log_tail(connect_server))
    assert jsonl(after.stdout) == ROWS


def test_a_query_whose_client_is_killed_or_interrupted_stops_using_the_server(connect: dict[str, str], h2o: str,
                                                                              connect_server: Server) -> None:
    exe = Path(sys.executable).parent / "iox-batch"
    # The budget is an hour: what stops the query on the server is its client gone, not its deadline.
    for sig in (signal.SIGKILL, signal.SIGINT):
        proc = subprocess.Popen([str(exe), "query", "--db", h2o, "--timeout", "3600", SLOW],
                                env={**os.environ, **connect}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            assert connect_server.wait_busy(120), ("the query never ran on the server", server_log_tail(connect_server))
            proc.send_signal(sig)
            _, stderr = proc.communicate(timeout=60)
        finally:
            proc.kill()
        if sig == signal.SIGINT:
            assert proc.returncode == 130 and stderr.strip() == "interrupted", (proc.returncode, stderr)
        took = connect_server.idle_within(60)
        assert took is not None and took < 30, (sig, took, server_log_tail(connect_server))
    after = run_cli("query", "--db", h2o, "--format", "jsonl", "SELECT count(*) AS n FROM h2o", env=connect)
    assert after.returncode == 0 and jsonl(after.stdout) == [{"n": 8}], after.stderr


# A client that never interrupts its own query (as one stopped or cut off would not): the server's watch does, at the
# deadline its tag carries.
DEADLINE_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from iox_planner.spark.server import remote
    from spark_jobs.connect import remote_session
    from spark_jobs.orphans import deadline_tag
    spark = remote_session(remote())
    spark.addTag(deadline_tag(float(sys.argv[1])))
    started = time.monotonic()
    try:
        spark.sql(sys.argv[2]).collect()
        error = None
    except Exception as err:
        error = type(err).__name__ + ": " + str(err)[:300]
    print(json.dumps({"seconds": time.monotonic() - started, "error": error}))
""")


def test_the_server_stops_a_query_at_its_deadline_whatever_its_client_does(connect: dict[str, str],
                                                                           connect_server: Server) -> None:
    from spark_jobs.orphans import GRACE_S

    # SLOW without the catalog: cancellable at every row (a cross join's inner loop checks only between batches).
    slow = SLOW.replace("FROM h2o", "FROM range(8)")
    probe = subprocess.run([sys.executable, "-c", DEADLINE_SCRIPT, "3", slow], capture_output=True, text=True,
                           timeout=300, env={**os.environ, **connect})
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout.splitlines()[-1])
    assert found["error"] is not None and "CANCEL" in found["error"].upper(), found
    assert found["seconds"] < 3 + GRACE_S + 15, found
    assert "past its query's deadline" in connect_server.log.read_text()
    took = connect_server.idle_within(30)
    assert took is not None and took < 10, (took, server_log_tail(connect_server))


def test_compaction_and_a_bulk_load_run_their_tasks_over_connect(connect: dict[str, str], catalog: Catalog, db: str,
                                                                   tmp_path: Path) -> None:
    from iox_planner.ingest import write as ingest
    from iox_planner.maintenance import persist

    t0 = 1704067200 * 10**9
    # Two persisted files of one partition, the second overriding a point of the first: a rewrite, one Spark task.
    ingest.write_line_protocol(catalog, db, f"m,k=a v=1 {t0}\nm,k=b v=2 {t0 + 10**9}")
    persist.persist(catalog, db)
    ingest.write_line_protocol(catalog, db, f"m,k=a v=10 {t0}")
    persist.persist(catalog, db)
    # On the server's workers although the rows are few (a run this small merges in the driver by default).
    result = run_cli("compact", "--db", db, env={**connect, "IOX_COMPACT_DRIVER_ROWS": "0"})
    assert result.returncode == 0, result.stderr
    assert {c["compaction_level"] for c in live_chunks(catalog, db)} == {1}
    assert len(live_chunks(catalog, db)) == 1
    # Many ranges, a task each, on the server's workers; then a bad line, reported as a plain write reports it.
    lp = tmp_path / "in.lp"
    lp.write_text("".join(f"n,k=h{i} v={i} {t0 + i}\n" for i in range(200)))
    result = run_cli("write", "--spark", "--db", db, str(lp), env={**connect, "IOX_BULK_RANGE_BYTES": "4096"})
    assert result.returncode == 0, result.stderr
    lp.write_text("n,k=x v=1 1\nnot line protocol\n")
    bad = run_cli("write", "--spark", "--db", db, str(lp), env=connect)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "error: nothing was written from" in bad.stderr and "1 bad line: line 2" in bad.stderr
    got = run_cli("query", "--db", db, "--format", "jsonl",
                  "SELECT (SELECT count(*) FROM n) AS n, (SELECT sum(v) FROM m) AS m", env=connect)
    assert got.returncode == 0, got.stderr
    assert jsonl(got.stdout) == [{"n": 200, "m": 12.0}]


def test_two_queries_at_once_and_a_failing_one_leave_the_server_serving(connect: dict[str, str], h2o: str) -> None:
    exe = Path(sys.executable).parent / "iox-batch"
    env = {**os.environ, **connect}
    procs = [subprocess.Popen([str(exe), "query", "--db", h2o, "--format", "jsonl", QUERY], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr
        assert jsonl(stdout) == ROWS
    failing = run_cli("query", "--db", h2o, "SELECT 1 / 0 AS x FROM h2o", env=connect)
    assert failing.returncode == 2
    assert_one_paragraph_error(failing, "DIVIDE_BY_ZERO")
    after = run_cli("query", "--db", h2o, "--format", "jsonl", "SELECT count(*) AS n FROM h2o", env=connect)
    assert after.returncode == 0 and jsonl(after.stdout) == [{"n": 8}], after.stderr


@kills_the_server
def test_a_server_lost_during_a_query_or_not_there_is_the_retryable_error(connect_server: Server,
                                                                          connect: dict[str, str], h2o: str) -> None:
    started = time.monotonic()
    warm = run_cli("query", "--db", h2o, "--format", "jsonl", "SELECT count(*) AS n FROM h2o", env=connect)
    assert warm.returncode == 0, warm.stderr
    # The kill must come once the slow query runs on the server, past its last gate (a gate that does not answer
    # is another paragraph): later than a whole warm query takes, which grows with the machine's load.
    killer = threading.Timer(max(4.0, 1.5 * (time.monotonic() - started)), connect_server.kill)
    killer.start()
    try:
        result = run_cli("query", "--db", h2o, SLOW, env=connect)
    finally:
        killer.join()
    assert result.returncode == 75, (result.stdout, result.stderr)
    assert_one_paragraph_error(result, "Spark Connect server", "could not be reached or went away", "again")
    # Nothing listens there now.
    result = run_cli("query", "--db", h2o, "SELECT 1", env=connect)
    assert result.returncode == 75, (result.stdout, result.stderr)
    assert_one_paragraph_error(result, "Spark Connect server")


def test_a_recorded_server_whose_process_is_gone_or_another_is_stale(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    from iox_planner.spark import server as sparkserver

    monkeypatch.setattr(sparkserver, "state_dir", lambda: tmp_path)
    assert sparkserver.status() == (None, "stopped")
    gone = subprocess.Popen(["true"])
    gone.wait()
    for pid in (gone.pid, os.getpid()):  # ended; alive but not a Connect server (a pid reused)
        (tmp_path / "spark-connect.json").write_text(json.dumps(
            {"pid": pid, "host": "127.0.0.1", "port": 1, "gate_port": 2, "token": "t" * 64,
             "log_file": str(tmp_path / "log")}))
        assert sparkserver.status()[1] == "stale"
        assert sparkserver.stop() is not None  # forgets it, signals nothing
        assert sparkserver.status() == (None, "stopped")


@pytest.mark.parametrize("url", ["sc://127.0.0.1:15002/;token=x", "http://127.0.0.1:15002", "sc://a b:1",
                                 "sc://127.0.0.1:99999", "sc://127.0.0.1"])
def test_a_remote_that_is_not_sc_host_port_is_refused(url: str, h2o: str) -> None:
    result = run_cli("query", "--db", h2o, "SELECT 1", env={"IOX_RUNNER": "connect", "IOX_SPARK_REMOTE": url})
    assert result.returncode == 2
    assert_one_paragraph_error(result, "IOX_SPARK_REMOTE", "sc://HOST:PORT")
    assert "token=x" not in result.stderr  # a token in the URL is never repeated
