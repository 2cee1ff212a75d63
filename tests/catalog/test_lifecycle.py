"""The life of data (issue 26), end to end on the real catalog and the shared local SparkSession: retention cut to
the nanosecond, a table drop racing a query planned before it, and `materialized run` from the CLI (a changes consumer:
test_changes.py)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import sqlalchemy as sa
import yaml
from common_support import live_chunks, materialized_env
from spark_support import cli, plan, run_jsonl

from iox_planner.catalog.store import Catalog
from iox_planner.cli.runner import run as run_query
from iox_planner.errors import IoxError
from iox_planner.ingest import write as ingest
from iox_planner.maintenance import persist
from iox_planner.maintenance.sweeps import collect_garbage, expire_partitions
from iox_planner.output import OutputFormat
from iox_planner.planner import render
from iox_planner.planner.serde import plan_from_json, plan_to_json

pytestmark = [pytest.mark.spark]

S = 10**9
H = 3600 * S
T0 = 1704067200 * S  # 2024-01-01T00:00:00Z


def db_id(catalog: Catalog, db: str) -> int:
    with catalog.engine.connect() as conn:
        return int(catalog.database_id(conn, db))


def run_plan(query_plan: Any) -> list[dict[str, Any]]:
    import io

    out = io.StringIO()
    run_query(query_plan, OutputFormat.JSONL, None, out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


# --- retention --------------------------------------------------------------------------------------------------


def test_retention_cuts_at_the_nanosecond_in_files_and_chunks(spark: object, catalog: Catalog, db: str,
                                                             warehouse: Path) -> None:
    now = T0 + 2 * H + 123_456_000  # whole microseconds: the planner truncates now() to them
    cut = now - H  # a 1h retention: rows at or before `cut` are gone
    # Persisted first (persist expires partitions by the wall clock: the database has no retention yet), on
    # both sides of the cut and on the day before; then the same around the cut as ingester chunks.
    ingest.write_line_protocol(catalog, db, "\n".join(
        [f"m,k=file v=1 {cut - 1}", f"m,k=file v=2 {cut}", f"m,k=file v=3 {cut + 1}", f"m,k=old v=0 {T0 - H}"]))
    persist.persist(catalog, db)
    ingest.write_line_protocol(catalog, db, f"m,k=chunk v=4 {cut - 1}\nm,k=chunk v=5 {cut}\nm,k=chunk v=6 {cut + 1}")
    assert cli("database", "update", db, "--retention", "1h").returncode == 0

    sql = "SELECT k, v, time FROM m ORDER BY k"
    query_plan = plan(catalog, db, sql, now_ns=now)
    got = run_jsonl(spark, catalog, db, sql, now_ns=now)
    assert [(r["k"], r["v"]) for r in got] == [("chunk", 6.0), ("file", 3.0)]
    # The day before is pruned whole; the boundary day's file and chunks are read and filtered exactly.
    (pruning,) = query_plan.pruning
    assert pruning.pruned_by_retention == 1 and pruning.partitions_pruned == 1
    assert "retention: 1h, rows at or before 2024-01-01T01:00:00.123456Z excluded" in render(query_plan, "tree")
    # The cutoff travels with the plan: the same JSON reruns to the same rows whatever the clock says.
    again = plan_from_json(plan_to_json(query_plan))
    assert again.retention == (H, cut)
    assert run_plan(again) == got

    # A microsecond later (now() has microsecond steps), the row at cut + 1 is at or before the cutoff too.
    assert run_jsonl(spark, catalog, db, sql, now_ns=now + 1_000) == []
    # A microsecond earlier, all six rows around the cut are inside; the day before still is not.
    assert sorted(r["v"] for r in run_jsonl(spark, catalog, db, sql, now_ns=now - 1_000)) == [1, 2, 3, 4, 5, 6]

    # Maintenance retires the partition wholly past the cut (the day before), then deletes its file after the
    # grace period; the boundary day stays. Expiry logs no write.
    with catalog.engine.connect() as conn:
        events = conn.execute(sa.text("SELECT count(*) FROM iox_write_event WHERE database_id = :d")
                              .bindparams(d=db_id(catalog, db))).scalar_one()
    retired = expire_partitions(catalog, db_id(catalog, db), now_ns=now)
    assert [(p.partition, n) for p, n in retired] == [("2023-12-31", 1)]
    old = [c for c in live_chunks(catalog, db) if c["partition_key"] == "2023-12-31"]
    assert old == []
    collect_garbage(catalog, warehouse, 0)
    assert not any("2023-12-31" in str(p) for p in (warehouse / str(db_id(catalog, db))).rglob("*.parquet"))
    with catalog.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM iox_write_event WHERE database_id = :d")
                            .bindparams(d=db_id(catalog, db))).scalar_one() == events


def test_database_create_and_update_check_their_input(catalog: Catalog, db: str) -> None:
    assert cli("database", "create", db, "--retention", "30d").returncode == 0
    shown = cli("show", "--db", db)
    assert shown.returncode == 0 and "retention 30d" in shown.stdout
    again = cli("database", "create", db)
    assert again.returncode != 0 and "already exists" in again.stderr
    for bad in ("30", "0d", "1m", "36501d", "-1d", "30d;drop"):
        result = cli("database", "update", db, f"--retention={bad}")
        assert result.returncode != 0 and result.stderr.startswith("error: --retention"), (bad, result.stderr)
    assert cli("database", "update", db, "--retention", "none").returncode == 0
    with catalog.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT retention_ns FROM iox_database WHERE name = :n")
                            .bindparams(n=db)).scalar_one() is None


# --- dropping a table -------------------------------------------------------------------------------------------


def test_drop_table_races_a_query_planned_before_it(spark: object, catalog: Catalog, db: str,
                                                    warehouse: Path) -> None:
    ingest.write_line_protocol(catalog, db, f"cpu,host=a u=1 {T0}\ncpu,host=b u=2 {T0 + 1}\nmem,host=a f=9 {T0}")
    persist.persist(catalog, db)
    ingest.write_line_protocol(catalog, db, f"cpu,host=c u=3 {T0 + 2}")
    before = plan(catalog, db, "SELECT host, u FROM cpu ORDER BY host")
    refused = cli("drop", "--db", db, "--table", "cpu")
    assert refused.returncode != 0 and "--yes" in refused.stderr

    dropped = cli("drop", "--db", db, "--table", "cpu", "--yes")
    assert dropped.returncode == 0, dropped.stderr
    assert "2 chunk(s) retired" in dropped.stdout
    # The query planned before the drop still reads every file it planned (retired, kept for the grace period).
    assert [(r["host"], r["u"]) for r in run_plan(before)] == [("a", 1.0), ("b", 2.0), ("c", 3.0)]
    # A query planned after it does not know the table; the other table is untouched.
    with pytest.raises(IoxError):
        plan(catalog, db, "SELECT host, u FROM cpu")
    assert run_jsonl(spark, catalog, db, "SELECT host, f FROM mem") == [{"host": "a", "f": 9.0}]
    # The name is free at once: a new table, with none of the old rows.
    ingest.write_line_protocol(catalog, db, f"cpu,host=z u=7 {T0}")
    assert run_jsonl(spark, catalog, db, "SELECT host, u FROM cpu") == [{"host": "z", "u": 7.0}]
    # After the grace period the dropped table's files go, and the query planned before fails cleanly.
    collect_garbage(catalog, warehouse, 0)
    with pytest.raises(IoxError):
        run_plan(before)
    missing = cli("drop", "--db", db, "--table", "nope", "--yes")
    assert missing.returncode != 0 and "does not exist" in missing.stderr


# --- materialized run from the CLI; drops make dependants stale; a registering run blocks a drop ------------------


@pytest.fixture
def defs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    out, folder = materialized_env(tmp_path, monkeypatch)
    folder.mkdir()
    yield out


def test_materialized_run_publishes_never_run_intervals_and_a_drop_makes_them_stale(
        defs: Path, catalog: Catalog, db: str, spark: object, capsys: pytest.CaptureFixture[str]) -> None:
    name, table = f"hourly_{uuid.uuid4().hex[:8]}", f"rollup_{uuid.uuid4().hex[:8]}"
    (defs.parent / "defs" / f"{name}.yaml").write_text(yaml.safe_dump({
        "name": name, "db": db, "schedule": "@hourly", "start_date": "2024-01-01T00:00:00Z",
        "end_date": "2024-01-01T03:00:00Z", "format": "jsonl", "output": "{name}/{start:%H}.jsonl",
        "register_as": {"table": table, "tags": ["host"]},
        "sql": "SELECT host, date_trunc('hour', time) AS time, count(*) AS n FROM cpu "
               "GROUP BY host, date_trunc('hour', time)"}))
    lines = [f"cpu,host=h{i % 2} u={i} {T0 + (i % 3) * H + i * S}" for i in range(12)]
    ingest.write_line_protocol(catalog, db, "\n".join(lines))

    result = cli("materialized", "run", name, "--from", "2024-01-01T00:00:00Z", "--to", "2024-01-01T02:00:00Z")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(": published, ") == 2 and "2 interval(s) published" in result.stdout
    for hour in (0, 1):
        got = sorted((r["host"], r["n"]) for r in map(json.loads, (defs / name / f"{hour:02d}.jsonl")
                                                        .read_text().splitlines()))
        assert got == [("h0", 2), ("h1", 2)]
    assert not (defs / name / "02.jsonl").exists()
    status = cli("materialized", "status", name, "--format", "json")
    (report,) = json.loads(status.stdout)["definitions"]
    assert [i["state"] for i in report["intervals"]] == ["fresh", "fresh"]
    assert [(n["start"], n["intervals"]) for n in report["never_run"]] == [("2024-01-01T02:00:00Z", 1)]
    with catalog.engine.connect() as conn:  # the same record as an Airflow run: a run row, reads recorded
        runs = conn.execute(sa.text("SELECT status, dag_id FROM iox_query_run WHERE definition = :d")
                            .bindparams(d=name)).all()
    assert sorted(runs) == [("success", "iox-batch"), ("success", "iox-batch")]
    empty = cli("materialized", "run", name, "--from", "2024-01-01T05:00:00Z", "--to", "2024-01-01T06:00:00Z")
    assert empty.returncode != 0 and "nothing was run" in empty.stderr

    # A run that registers into `table` holds its lock (planned, not committed): the drop is refused.
    from iox_planner.runs.definitions import load_definitions
    from iox_planner.runs.failure import fail
    from iox_planner.runs.planning import plan as plan_run
    from iox_planner.runs.refresh import _dt, pick
    from iox_planner.runs.settings import RunSettings
    from iox_planner.runs.staging import RunIdentity

    settings = RunSettings.from_env()
    definition = pick(load_definitions(settings.materialized_dir), name)
    request = definition.request(_dt(T0 + 2 * H), _dt(T0 + 3 * H), settings)
    run = RunIdentity("test", "holder")
    outcome = plan_run(request, run, settings)
    try:
        refused = cli("drop", "--db", db, "--table", table, "--yes")
        assert refused.returncode != 0 and "is being registered by materialized query" in refused.stderr
    finally:
        fail(request, run, outcome.handle(), "released by the test")
    # Dropping the source table makes both published intervals stale, with the reason.
    assert cli("drop", "--db", db, "--table", "cpu", "--yes").returncode == 0
    (report,) = json.loads(cli("materialized", "status", name, "--format", "json").stdout)["definitions"]
    states = [(i["state"], i["reasons"]) for i in report["intervals"] if i["start"] < "2024-01-01T02"]
    assert states == [("stale", [f"table {db}.cpu was dropped after it ran"])] * 2
    # And with its table gone the drop of the registered table goes through.
    assert cli("drop", "--db", db, "--table", table, "--yes").returncode == 0
