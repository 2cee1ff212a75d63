"""The core of a materialization against a real Postgres catalog and a real warehouse (no Airflow, no Spark):
query-run records, run locks, registering a result as a catalog table (iox_planner.ingest.register), persist
candidates, and the run steps' publication and failure paths (iox_planner.runs)."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from common_support import catalog_counts, live_chunks, warehouse_files

from iox_planner.ingest import write as ingest
from iox_planner.catalog import runs
from iox_planner.ingest import register
from iox_planner.maintenance import persist
from iox_planner.catalog.store import Catalog, CatalogSource
from iox_planner.errors import BadInputError, CatalogError
from iox_planner.planner import plan_query
from iox_planner.planner.nodes import DeduplicateExec
from iox_planner.ingest.scenario import load_scenario, parse_scenario

H = 3600 * 10**9
DAY = 86400 * 10**9
T0 = 1704067200 * 10**9  # 2024-01-01T00:00:00Z


def result(rows: list[tuple[str, str, int, int, float]]) -> pa.Table:
    """A rollup result as Spark hands it over: tags as strings, time as a UTC microsecond timestamp."""
    return pa.table({
        "state": pa.array([r[0] for r in rows], pa.string()),
        "city": pa.array([r[1] for r in rows], pa.string()),
        "time": pa.array([r[2] // 1000 for r in rows], pa.timestamp("us", tz="UTC")),
        "samples": pa.array([r[3] for r in rows], pa.int64()),
        "temp_avg": pa.array([r[4] for r in rows], pa.float64()),
    })


def live(catalog: Catalog, db: str, table: str) -> list[dict[str, Any]]:
    return [c for c in live_chunks(catalog, db) if c["table_name"] == table]


def rows_of(warehouse: Path, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for chunk in chunks:
        out += pq.read_table(warehouse / chunk["path"]).to_pylist()
    return sorted(out, key=lambda r: (r["time"], r["state"], r["city"]))


def test_register_replaces_exactly_its_interval(catalog: Catalog, db: str, warehouse: Path) -> None:
    hour1 = (T0 + H, T0 + 2 * H)
    hour2 = (T0 + 2 * H, T0 + 3 * H)
    first = register.register_interval(catalog, db, "rollup", result([("CA", "SF", T0 + H, 2, 10.0),
                                                                 ("MA", "Boston", T0 + H, 1, 20.0)]),
                                  tags=["state", "city"], interval=hour1)
    assert [(f.partition, f.rows) for f in first.files] == [("2024-01-01", 2)] and first.retired == 0
    register.register_interval(catalog, db, "rollup", result([("CA", "SF", T0 + 2 * H, 5, 50.0)]),
                          tags=["state", "city"], interval=hour2)
    # Hour 1 again, with other rows: its earlier file goes, hour 2's stays.
    again = register.register_interval(catalog, db, "rollup", result([("CA", "SF", T0 + H, 3, 11.0)]),
                                  tags=["state", "city"], interval=hour1)
    assert again.retired == 1 and again.trimmed == 0
    chunks = live(catalog, db, "rollup")
    assert len(chunks) == 2 and all(c["kind"] == "parquet" for c in chunks)
    assert rows_of(warehouse, chunks) == [
        {"city": "SF", "state": "CA", "samples": 3, "temp_avg": 11.0, "time": T0 + H},
        {"city": "SF", "state": "CA", "samples": 5, "temp_avg": 50.0, "time": T0 + 2 * H},
    ]
    newest = max(chunks, key=lambda c: c["chunk_order"])
    assert (newest["min_time"], newest["max_time"], newest["row_count"]) == (T0 + H, T0 + H, 1)
    assert newest["sort_key"][-1] == "time" and set(newest["sort_key"]) == {"state", "city", "time"}
    # The registered table plans like any other: one file per hour, nothing overlaps, so no dedup.
    plan = plan_query("SELECT state, sum(samples) AS n FROM rollup GROUP BY state", CatalogSource(catalog, db))
    assert not [n for tree in plan.children for n in tree.walk() if isinstance(n, DeduplicateExec)]
    assert {c.path for c in plan.chunks().values()} == {c["path"] for c in chunks}


def test_register_rewrites_earlier_chunks_that_reach_outside_the_interval(
        catalog: Catalog, db: str, warehouse: Path) -> None:
    lines = "\n".join(f"rollup,state=CA,city=SF samples={n}i,temp_avg={n}.5 {T0 + n * H}" for n in range(4))
    load_scenario(catalog, parse_scenario({"chunks": [{"id": "OLD", "kind": "parquet", "lines": lines}]}), db=db)
    [old] = live(catalog, db, "rollup")
    got = register.register_interval(catalog, db, "rollup", result([("CA", "SF", T0 + H, 7, 7.0)]),
                                tags=["state", "city"], interval=(T0 + H, T0 + 3 * H))
    assert got.retired == 1 and got.trimmed == 1
    chunks = live(catalog, db, "rollup")
    trimmed = [c for c in chunks if c["label"] == "OLD"]
    assert len(trimmed) == 1 and trimmed[0]["chunk_order"] == old["chunk_order"]
    assert (trimmed[0]["min_time"], trimmed[0]["max_time"], trimmed[0]["row_count"]) == (T0, T0 + 3 * H, 2)
    assert [(r["time"], r["samples"]) for r in rows_of(warehouse, chunks)] == [(T0, 0), (T0 + H, 7), (T0 + 3 * H, 3)]


@pytest.mark.parametrize("data, tags, message", [
    (result([("CA", "SF", T0 + 5 * H, 1, 1.0)]), ["state", "city"], "outside the interval"),
    (result([("CA", "SF", T0 + H, 1, 1.0)]).drop_columns(["time"]), ["state"], "needs a `time` column"),
    (result([("CA", "SF", T0 + H, 1, 1.0)]), ["samples"], "must be a string column"),
    (result([("CA", "SF", T0 + H, 1, 1.0)]), ["state", "nope"], "does not have"),
    (result([("CA", "SF", T0 + H, 1, 1.0)]).append_column("when", pa.array([dt.date(2024, 1, 1)])), ["state"],
     "cannot hold"),
])
def test_register_rejects_results_that_do_not_fit(catalog: Catalog, db: str, warehouse: Path,
                                                   data: pa.Table, tags: list[str], message: str) -> None:
    before = (catalog_counts(catalog), warehouse_files(warehouse))
    with pytest.raises(BadInputError, match=message):
        register.register_interval(catalog, db, "rollup", data, tags=tags, interval=(T0 + H, T0 + 2 * H))
    assert (catalog_counts(catalog), warehouse_files(warehouse)) == before


def test_register_rejects_a_type_clash_and_changes_nothing(catalog: Catalog, db: str, warehouse: Path) -> None:
    register.register_interval(catalog, db, "rollup", result([("CA", "SF", T0 + H, 1, 1.0)]), tags=["state", "city"],
                          interval=(T0 + H, T0 + 2 * H))
    before = (catalog_counts(catalog), warehouse_files(warehouse))
    clash = result([("CA", "SF", T0 + H, 1, 1.0)]).set_column(3, "samples", pa.array([1.5]))
    with pytest.raises(BadInputError, match="samples .the table has it as integer, the result as float"):
        register.register_interval(catalog, db, "rollup", clash, tags=["state", "city"], interval=(T0 + H, T0 + 2 * H))
    assert (catalog_counts(catalog), warehouse_files(warehouse)) == before


def test_query_run_records(catalog: Catalog, db: str) -> None:
    run = runs.start_run(catalog, database=db, params={"sql": "SELECT 1"}, dag_id="d", run_id=f"r-{db}",
                        definition="x", interval=(1, 2), output="/tmp/o")
    runs.finish_run(catalog, run, runs.RunStatus.FAILED, error="first, specific")
    runs.finish_run(catalog, run, runs.RunStatus.FAILED, error="later, vague")
    assert runs.get_run(catalog, run)["error"] == "first, specific"
    # The same DAG run again (a retry) reuses and resets its row.
    again = runs.start_run(catalog, database=db, params={"sql": "SELECT 2"}, dag_id="d", run_id=f"r-{db}")
    assert again == run
    row = runs.get_run(catalog, run)
    assert (row["status"], row["error"], row["params"]) == ("running", None, {"sql": "SELECT 2"})
    runs.record_plan(catalog, run, {"node": "QueryExec"})
    runs.finish_run(catalog, run, runs.RunStatus.SUCCESS, row_count=42)
    row = runs.get_run(catalog, run)
    assert (row["status"], row["row_count"], row["plan"]) == ("success", 42, {"node": "QueryExec"})
    assert row["duration_s"] >= 0 and row["finished_at"] >= row["started_at"]


def test_run_lock_lets_one_run_of_an_interval_publish(catalog: Catalog, db: str) -> None:
    key = runs.RunKey(f"def_{db}", T0, T0 + DAY)
    a = runs.start_run(catalog, database=db, params={}, dag_id="d", run_id=f"a-{db}")
    b = runs.start_run(catalog, database=db, params={}, dag_id="d", run_id=f"b-{db}")
    runs.acquire_lock(catalog, key, "d/a", query_run=a, ttl_seconds=3600)
    with pytest.raises(CatalogError, match="is being computed by d/a"):
        runs.acquire_lock(catalog, key, "d/b", query_run=b, ttl_seconds=3600)
    runs.acquire_lock(catalog, key, "d/a", query_run=a, ttl_seconds=3600)  # a retry of the holder
    with catalog.engine.begin() as conn:
        runs.check_lock(conn, key, "d/a")
        with pytest.raises(CatalogError, match="no longer holds"):
            runs.check_lock(conn, key, "d/b")
    # Once the holder's run has finished, another run may take the interval at once.
    runs.finish_run(catalog, a, runs.RunStatus.FAILED, error="spark failed")
    runs.acquire_lock(catalog, key, "d/b", query_run=b, ttl_seconds=0.2)
    assert runs.lock_holder(catalog, key) == "d/b"
    with catalog.engine.begin() as conn, pytest.raises(CatalogError, match="held by d/b"):
        runs.check_lock(conn, key, "d/a")
    # An expired lock (its holder died while running) is taken over; the old holder then cannot publish.
    time.sleep(0.3)
    c = runs.start_run(catalog, database=db, params={}, dag_id="d", run_id=f"c-{db}")
    runs.acquire_lock(catalog, key, "d/c", query_run=c, ttl_seconds=3600)
    with catalog.engine.begin() as conn, pytest.raises(CatalogError, match="no longer holds"):
        runs.check_lock(conn, key, "d/b")
    assert not runs.release_lock(catalog, key, "d/b")
    assert runs.release_lock(catalog, key, "d/c")
    assert runs.lock_holder(catalog, key) is None


class Scheduler:
    """What a task's `ti.get_dagrun_state` would answer, kept by the test: DAG run states by (dag_id, run_id), and
    every question asked. `on_ask` runs as a question is answered (another process acting meanwhile)."""

    def __init__(self, states: dict[tuple[str, str], str]) -> None:
        self.states = states
        self.asked: list[tuple[str, str]] = []
        self.on_ask: Any = None

    def __call__(self, dag_id: str, run_id: str) -> str:
        self.asked.append((dag_id, run_id))
        if self.on_ask is not None:
            self.on_ask()
        return self.states[(dag_id, run_id)]  # KeyError: a run the scheduler does not know


def test_a_live_holder_is_never_taken_over_by_dag_run_state(catalog: Catalog, db: str) -> None:
    """The takeover of a killed run's lock (its Airflow DAG run ended while its query run says `running`) never
    touches a holder that may be alive: a DAG run still queued or running, a state that cannot be learned, a holder
    that renewed its lock after the state was asked; and the holder it does take over cannot publish."""
    key = runs.RunKey(f"dagstate_{db}", T0, T0 + DAY)
    a_id, b_id = f"a-{db}", f"b-{db}"
    a = runs.start_run(catalog, database=db, params={}, dag_id="d", run_id=a_id)
    b = runs.start_run(catalog, database=db, params={}, dag_id="d", run_id=b_id)
    runs.acquire_lock(catalog, key, f"d/{a_id}", query_run=a, ttl_seconds=3600)

    def lock_row() -> tuple[Any, ...]:
        with catalog.engine.connect() as conn:
            return tuple(conn.execute(sa.text(
                "SELECT holder, query_run_id, acquired_at, expires_at FROM iox_run_lock WHERE definition = :d"
            ).bindparams(d=key.definition)).one())

    before = lock_row()
    for alive in ("running", "queued", "restarting", "", None, 42):
        scheduler = Scheduler({("d", a_id): alive})  # type: ignore[dict-item]
        with pytest.raises(CatalogError, match=f"is being computed by d/{a_id}"):
            runs.acquire_lock(catalog, key, f"d/{b_id}", query_run=b, ttl_seconds=3600, holder_state=scheduler)
        assert scheduler.asked == [("d", a_id)], alive
        assert lock_row() == before and runs.get_run(catalog, a)["status"] == "running", alive
    # A DAG run the scheduler does not know, or a failure to ask: no proof of death, the lock holds.
    for scheduler in (Scheduler({}), Scheduler({("d", a_id): "failed"})):
        if scheduler.states:
            def broken() -> None:
                raise ConnectionError("the api-server did not answer")
            scheduler.on_ask = broken
        with pytest.raises(CatalogError, match=f"is being computed by d/{a_id}"):
            runs.acquire_lock(catalog, key, f"d/{b_id}", query_run=b, ttl_seconds=3600, holder_state=scheduler)
        assert lock_row() == before
    # The holder's DAG run ended, but while the question was out its task was cleared and took its lock again
    # (a retry of the same holder renews acquired_at): it is alive, it keeps the lock.
    scheduler = Scheduler({("d", a_id): "failed"})
    scheduler.on_ask = lambda: runs.acquire_lock(catalog, key, f"d/{a_id}", query_run=a, ttl_seconds=3600)
    with pytest.raises(CatalogError, match=f"is being computed by d/{a_id}"):
        runs.acquire_lock(catalog, key, f"d/{b_id}", query_run=b, ttl_seconds=3600, holder_state=scheduler)
    renewed = lock_row()
    assert renewed[0] == f"d/{a_id}" and renewed[2] > before[2] and runs.get_run(catalog, a)["status"] == "running"
    # A lock held under another name than its query run's DAG run (not an Airflow holder): never asked.
    c_id = f"c-{db}"
    c = runs.start_run(catalog, database=db, params={}, dag_id="d", run_id=c_id)
    other = runs.RunKey(f"dagstate_other_{db}", T0, T0 + DAY)
    runs.acquire_lock(catalog, other, "cli/someone", query_run=c, ttl_seconds=3600)
    scheduler = Scheduler({("d", c_id): "failed"})
    with pytest.raises(CatalogError, match="is being computed by cli/someone"):
        runs.acquire_lock(catalog, other, f"d/{b_id}", query_run=b, ttl_seconds=3600, holder_state=scheduler)
    assert scheduler.asked == []
    # Ended for real (failed: its commit task was killed): taken over at once, its run recorded as failed.
    for ended, taker in (("failed", b_id), ("success", a_id)):
        holder_run = a if taker == b_id else b
        holder_id = a_id if taker == b_id else b_id
        scheduler = Scheduler({("d", holder_id): ended})
        runs.start_run(catalog, database=db, params={}, dag_id="d", run_id=taker)  # a new try: running again
        runs.acquire_lock(catalog, key, f"d/{taker}", query_run=a if taker == a_id else b, ttl_seconds=3600,
                          holder_state=scheduler)
        assert runs.lock_holder(catalog, key) == f"d/{taker}", ended
        dead = runs.get_run(catalog, holder_run)
        assert dead["status"] == "failed" and f"its Airflow DAG run ended ({ended})" in dead["error"], dead
        # The holder taken over, should it come back (a zombie task, or cleared later), publishes nothing.
        with catalog.engine.begin() as conn, pytest.raises(CatalogError, match="no longer holds"):
            runs.check_lock(conn, key, f"d/{holder_id}")
        assert not runs.release_lock(catalog, key, f"d/{holder_id}")
    assert runs.release_lock(catalog, key, f"d/{a_id}") and runs.release_lock(catalog, other, "cli/someone")


def test_piled_up_partitions(catalog: Catalog, db: str) -> None:
    for n in range(3):
        ingest.write_line_protocol(catalog, db, f"cpu,host=a usage={n} {T0 + n}\nmem,host=a used={n} {T0 + n}")
    ingest.write_line_protocol(catalog, db, f"cpu,host=a usage=9 {T0 + DAY}")
    mine = [p for p in persist.piled_up_partitions(catalog, 3) if p.db == db]
    assert mine == [persist.PileUp(db, "cpu", "2024-01-01", 3), persist.PileUp(db, "mem", "2024-01-01", 3)]
    assert [p for p in persist.piled_up_partitions(catalog, 4) if p.db == db] == []
    assert persist.tables_to_persist(mine) == [(db, "cpu"), (db, "mem")]
    persist.persist(catalog, db, table="cpu")
    assert [p.table for p in persist.piled_up_partitions(catalog, 3) if p.db == db] == ["mem"]


def test_a_failure_never_overwrites_a_succeeded_run(catalog: Catalog, db: str) -> None:
    """A commit whose COMMIT answer was lost (Postgres restarted) reports a failure; the run may have succeeded."""
    run = runs.start_run(catalog, database=db, params={}, dag_id="core", run_id=f"lost-commit-{db}")
    runs.finish_run(catalog, run, runs.RunStatus.SUCCESS, row_count=3)
    runs.finish_run(catalog, run, runs.RunStatus.FAILED, error="the catalog's Postgres was unreachable")
    found = runs.get_run(catalog, run)
    assert found is not None and found["status"] == "success" and found["row_count"] == 3 and found["error"] is None


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_publishing_a_staged_result_leaves_it_for_a_retry(catalog: Catalog, tmp_path: Path, fmt: str) -> None:
    """Regression: the commit step moved the staged result into place, so a commit killed after the rename but
    before its transaction committed could not be retried (no staged result left: the run was failed)."""
    from iox_planner.catalog.publications import CatalogLedger
    from iox_planner.output import OutputFormat
    from iox_planner.output.publish import PinnedFolder, publishing_as
    from iox_planner.runs.commit import _publish
    from iox_planner.runs.staging import RunFiles, RunIdentity, Staging

    output = tmp_path / "out" / ("r" if fmt == "parquet" else "r.jsonl")
    output.parent.mkdir()
    staging = Staging.for_run(output, RunIdentity("core", "retry"))  # beside the output, as a run's is
    staging.root.mkdir()
    staged = staging.result(fmt)
    if fmt == "parquet":
        staged.mkdir()
        pq.write_table(pa.table({"x": [1, 2]}), staged / "part-00000.parquet")
    else:
        staged.write_text('{"x": 1}\n{"x": 2}\n')

    def published() -> list[Any]:
        if fmt == "parquet":
            return pq.read_table(output / "part-00000.parquet").column("x").to_pylist()
        return output.read_text().splitlines()

    with publishing_as("core/retry", CatalogLedger(catalog)), PinnedFolder(output.parent) as folder:
        files = RunFiles(folder, staging)
        try:
            for _ in range(2):  # the commit, then its retry
                _publish(files, staged.name, output, folder, OutputFormat(fmt))
                assert staged.exists() and published() in ([1, 2], ['{"x": 1}', '{"x": 2}'])
        finally:
            files.close()
    assert sorted(p.name for p in output.parent.iterdir()) == sorted([output.name, staging.root.name])


def test_a_plan_killed_after_taking_the_lock_is_recorded_by_the_failure_path(catalog: Catalog, db: str,
                                                                             tmp_path: Path) -> None:
    """A plan task killed outright after it took the lock pushed no handle and recorded nothing. The commit task
    (trigger rule all_done) then runs the failure path without a handle: it must find the run by its DAG run's
    ids, mark it failed and free its lock, and never touch a lock another run holds."""
    from iox_planner.runs.failure import fail
    from iox_planner.runs.request import QueryRequest
    from iox_planner.runs.settings import RunSettings
    from iox_planner.runs.staging import RunIdentity, Staging

    settings = RunSettings(output_root=tmp_path, output_roots=(tmp_path,))
    request = QueryRequest.from_params({"db": db, "sql": "SELECT * FROM h2o", "output": str(tmp_path / "o.jsonl"),
                                        "format": "jsonl"}, settings)
    killed = RunIdentity("iox_query", f"killed-plan-{db}")
    pk = runs.start_run(catalog, database=db, params={}, dag_id=killed.dag_id, run_id=killed.run_id)
    runs.acquire_lock(catalog, request.lock_key(), killed.holder, query_run=pk, ttl_seconds=3600)
    staging = Staging.for_run(request.output, killed)
    staging.reset()
    message = fail(request, killed, None, "task(s) plan failed")
    assert message == "task(s) plan failed"
    found = runs.get_run(catalog, pk)
    assert found["status"] == "failed" and found["error"] == "task(s) plan failed", found
    assert runs.lock_holder(catalog, request.lock_key()) is None and not staging.root.exists()
    # A plan killed before it got the lock (another run holds it): that run keeps it, and its run stays running.
    other = RunIdentity("iox_query", f"holder-{db}")
    other_pk = runs.start_run(catalog, database=db, params={}, dag_id=other.dag_id, run_id=other.run_id)
    runs.acquire_lock(catalog, request.lock_key(), other.holder, query_run=other_pk, ttl_seconds=3600)
    late = RunIdentity("iox_query", f"killed-early-{db}")
    late_pk = runs.start_run(catalog, database=db, params={}, dag_id=late.dag_id, run_id=late.run_id)
    fail(request, late, None, "task(s) plan failed")
    assert runs.get_run(catalog, late_pk)["status"] == "failed"
    assert runs.lock_holder(catalog, request.lock_key()) == other.holder
    assert runs.get_run(catalog, other_pk)["status"] == "running"
    assert runs.release_lock(catalog, request.lock_key(), other.holder)
