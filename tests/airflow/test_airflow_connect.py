"""The DAGs over Spark Connect (IOX_RUNNER=connect) with real Airflow (`dag.test()`), a real Connect server and
real Postgres: a triggered `iox_query` and an `iox_compact` run publish what spark-submit publishes, with no JVM in
the Airflow process (JAVA_HOME points nowhere); a run past its budget is cancelled on the server and fails without
retries; a server lost mid-job fails the run task retryably; a connection that would pass a user id on is
refused; a materialized run and `iox_refresh` (a launcher of its own) run there too. The server's token is in no
task log, XCom or run record.

The server is named the way a deployment names it to Airflow: the `iox_spark_connect` connection (the provider's
`spark_connect` type, the server's token in its password, the gate's port in its extra). These runs have a dag.test
process of their own: a Spark Connect client switches its whole Python process to Connect mode, which the
spark-submit runs of the other tests must not inherit."""

from __future__ import annotations

import json
import os
import threading
import uuid
from pathlib import Path
from typing import Iterator

import pyarrow.parquet as pq
import pytest
import yaml
from airflow_support import T0, DagRunner, leftovers, locks, overlapping_chunks, query_runs
from common_support import live_chunks
from connect_support import SLOW, Server
from test_airflow_iox_query import EXPECTED, QUERY

from iox_airflow.spark import connect_connection
from iox_planner.catalog.store import Catalog
from iox_planner.ingest.scenario import load_scenario, parse_scenario

pytestmark = [pytest.mark.airflow, pytest.mark.spark]


@pytest.fixture(scope="module")
def connect_runner(airflow_env: dict[str, str], connect_server: Server,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagRunner]:
    """A dag.test process whose DAGs run on Connect, with no Java to start a JVM of its own."""
    env = {**airflow_env, "IOX_RUNNER": "connect", "JAVA_HOME": "/nonexistent/java"}
    runner = DagRunner(env, tmp_path_factory.mktemp("connect_runner") / "stderr.log")
    try:
        yield runner
    finally:
        runner.close()


def connection(server: Server) -> dict[str, str]:
    """The environment of a run: `iox_spark_connect` naming the private server (up again if a test killed it)."""
    server.up()
    s = server.server
    return {"AIRFLOW_CONN_IOX_SPARK_CONNECT": connect_connection(s.reach(), s.port, s.gate_port, s.token)}


def test_iox_query_and_iox_compact_over_connect_publish_what_spark_submit_does(
        connect_runner: DagRunner, connect_server: Server, catalog: Catalog, h2o_db: str, db: str,
        tmp_path: Path) -> None:
    chunks, want = overlapping_chunks()
    load_scenario(catalog, parse_scenario({"chunks": chunks}), db)
    output = tmp_path / "h2o.jsonl"
    env = {**connection(connect_server), "IOX_COMPACT_DATABASES": db, "IOX_MAX_SPARK_JOBS": "2"}
    query, compact = connect_runner.run([
        {"dag_id": "iox_query", "conf": {"db": h2o_db, "sql": QUERY, "output": str(output), "format": "jsonl"}},
        {"dag_id": "iox_compact"},
    ], env=env)

    assert query.get("state") == "success", (query.get("error"), query["log"][-4000:])
    assert query["tasks"] == {"plan": "success", "run[0]": "success", "merge": "skipped", "commit": "success"}
    assert [json.loads(line) for line in output.read_text().splitlines()] == EXPECTED
    [run] = query_runs(catalog, dag_id="iox_query", run_id=query["run_id"])
    assert run["status"] == "success" and run["row_count"] == 8
    assert "on the Spark Connect server at sc://" in query["log"] and "Spark-Submit cmd" not in query["log"]

    assert compact.get("state") == "success", (compact.get("error"), compact["log"][-4000:])
    assert compact["tasks"] == {"find_work": "success", "compact_batch[0]": "success",
                                "compact_batch[1]": "success", "promote": "skipped", "report": "success"}
    live = live_chunks(catalog, db)
    assert {(c["partition_key"], c["compaction_level"]) for c in live} == {("2024-01-01", 1), ("2024-01-02", 1)}
    got = {}
    for c in live:
        for r in pq.read_table(Path(os.environ["IOX_WAREHOUSE"]) / c["path"]).to_pylist():
            assert (r["host"], r["time"]) not in got
            got[(r["host"], r["time"])] = r["usage"]
    assert got == want
    assert "Spark-Submit cmd" not in compact["log"]
    assert leftovers(tmp_path) == [] and locks(catalog) == []
    # The server's token (the connection's password) is in no task log, XCom or run record of either run.
    token = connect_server.server.token
    records = query_runs(catalog, dag_id="iox_query", run_id=query["run_id"])
    for seen in (query["log"], compact["log"], *query["xcoms"], *compact["xcoms"], json.dumps(records, default=str)):
        assert token not in seen
    assert query["xcoms"] and compact["xcoms"]  # the check above read something


def test_a_budget_run_out_over_connect_fails_without_retries_and_a_lost_server_is_retried(
        connect_runner: DagRunner, connect_server: Server, catalog: Catalog, h2o_db: str, tmp_path: Path) -> None:
    # One retry allowed, at once: the budget's failure must not take it, the lost server's must.
    env = {"IOX_SPARK_RETRIES": "1", "IOX_SPARK_RETRY_DELAY_S": "0"}
    slow = tmp_path / "slow.jsonl"
    # And a connection that would pass a user id on: refused, its token never shown.
    s = connect_server.server
    secret = s.token
    foreign = json.dumps({"conn_type": "spark_connect", "host": s.reach(), "port": s.port, "login": "someone",
                          "password": secret, "extra": {"gate_port": s.gate_port}})
    budget, refused = connect_runner.run([
        {"dag_id": "iox_query", "conf": {"db": h2o_db, "sql": SLOW, "output": str(slow), "format": "jsonl",
                                         "timeout_s": 3}},
        {"dag_id": "iox_query", "conf": {"db": h2o_db, "sql": QUERY, "output": str(tmp_path / "no.jsonl"),
                                         "format": "jsonl"}, "env": {"AIRFLOW_CONN_IOX_SPARK_CONNECT": foreign}},
    ], env={**env, **connection(connect_server)})
    assert budget.get("state") == "failed", (budget.get("error"), budget["log"][-4000:])
    assert budget["tasks"]["run[0]"] == "failed" and budget["tries"]["run[0]"] == 1, budget["tries"]
    assert budget["seconds"] < 90, budget["seconds"]
    [run] = query_runs(catalog, dag_id="iox_query", run_id=budget["run_id"])
    assert run["status"] == "failed" and "time budget of 3 s" in run["error"], run["error"]
    assert not slow.exists()
    assert refused.get("state") == "failed" and refused["tasks"]["run[0]"] == "failed", refused.get("error")
    [run] = query_runs(catalog, dag_id="iox_query", run_id=refused["run_id"])
    assert "sets a user id" in run["error"] and secret not in run["error"], run["error"]
    assert secret not in refused["log"] and secret not in budget["log"]
    assert not (tmp_path / "no.jsonl").exists()

    # The server is killed while the job runs; the retry finds nothing listening, and fails the same way.
    lost = tmp_path / "lost.jsonl"
    run_env = {**env, **connection(connect_server)}
    killer = threading.Timer(12.0, connect_server.kill)
    killer.start()
    try:
        [gone] = connect_runner.run([{"dag_id": "iox_query", "conf": {
            "db": h2o_db, "sql": SLOW, "output": str(lost), "format": "jsonl", "timeout_s": 600}}], env=run_env)
    finally:
        killer.join()
    assert gone.get("state") == "failed", (gone.get("error"), gone["log"][-4000:])
    assert gone["tasks"]["run[0]"] == "failed" and gone["tries"]["run[0]"] == 2, gone["tries"]
    [run] = query_runs(catalog, dag_id="iox_query", run_id=gone["run_id"])
    assert run["status"] == "failed" and "could not be reached or went away" in run["error"], run["error"]
    assert "Traceback" not in run["error"]
    assert not lost.exists() and leftovers(tmp_path) == [] and locks(catalog) == []
    connect_server.up()  # for whoever comes next


def test_a_materialized_run_and_its_refresh_over_connect(connect_runner: DagRunner, connect_server: Server,
                                                         airflow_env: dict[str, str], catalog: Catalog,
                                                         tmp_path: Path) -> None:
    """`materialize_<name>` (the operator, as iox_query) publishes an hour; late data lands in it; `iox_refresh`
    (its own launcher choice) recomputes it over Connect."""
    from iox_planner.ingest import write as ingest

    suffix = uuid.uuid4().hex[:8]
    db, name = f"af_cx_{suffix}", f"cx_{suffix}"
    folder = tmp_path / "defs"
    folder.mkdir()
    (folder / f"{name}.yaml").write_text(yaml.safe_dump({
        "name": name, "db": db, "schedule": "@hourly", "start_date": "2024-01-01T00:00:00Z",
        "end_date": "2024-01-01T01:00:00Z", "paused": True, "format": "jsonl", "output": "{name}/{start:%H}.jsonl",
        "sql": "SELECT host, count(*) AS samples FROM cpu GROUP BY host"}))
    ingest.write_line_protocol(catalog, db, "\n".join(
        f"cpu,host={host} usage=1 {T0 + k * 10**9}" for k, host in enumerate(["h0", "h0", "h1"])))
    env = {**connection(connect_server), "IOX_MATERIALIZED_DIR": str(folder)}
    output = Path(airflow_env["IOX_OUTPUT_ROOT"]) / name / "00.jsonl"

    def samples() -> dict[str, int]:
        return {r["host"]: r["samples"] for r in map(json.loads, output.read_text().splitlines())}

    [first] = connect_runner.run([{"dag_id": f"materialize_{name}", "logical_date": "2024-01-01T01:00:00Z"}], env=env)
    assert first.get("state") == "success", ([r["error"] for r in query_runs(catalog, dag_id=f"materialize_{name}")],
                                             first["tasks"], first.get("error"))
    assert samples() == {"h0": 2, "h1": 1}
    ingest.write_line_protocol(catalog, db, f"cpu,host=h1 usage=2 {T0 + 60 * 10**9}")  # late, into that hour
    [refreshed] = connect_runner.run([{"dag_id": "iox_refresh"}], env=env)
    assert refreshed.get("state") == "success", (refreshed.get("error"), refreshed["log"][-4000:])
    assert refreshed["tasks"] == {"find_0": "success", "refresh_0[0]": "success"}
    assert samples() == {"h0": 2, "h1": 2}
    assert locks(catalog) == []
