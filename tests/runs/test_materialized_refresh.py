"""`iox-batch materialized status|refresh` end to end, in this process (real Postgres, the shared local
SparkSession): late data makes exactly its interval stale, persist changes nothing, refresh recomputes exactly that
interval (and then the daily rollup over the hourly table, in that order), a failed refresh keeps the old output
and the stale mark, and a rerun fixes both. The same scenario through Airflow's `iox_refresh`:
tests/airflow/test_airflow_refresh.py."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

import pytest
import sqlalchemy as sa
import yaml
from common_support import live_chunks, materialized_env

from iox_planner.catalog.store import Catalog
from iox_planner.cli.main import main
from iox_planner.maintenance import persist
from iox_planner.ingest import write as ingest

pytestmark = [pytest.mark.spark]

H = 3600 * 10**9
T0 = 1704067200 * 10**9  # 2024-01-01T00:00:00Z
HOURLY_SQL = ("SELECT host, date_trunc('hour', time) AS time, count(*) AS samples, sum(usage) AS usage_sum "
              "FROM cpu GROUP BY host, date_trunc('hour', time)")


def definitions(folder: Path, db: str, suffix: str) -> dict[str, str]:
    """An hourly rollup registered as a table, the same query without registration (the from-scratch reference),
    and a daily rollup over the hourly table."""
    names = {"hourly": f"late_{suffix}", "scratch": f"scratch_{suffix}", "daily": f"daily_{suffix}"}
    table = f"hourly_{suffix}"
    hourly = {"db": db, "schedule": "@hourly", "start_date": "2024-01-01T00:00:00Z",
              "end_date": "2024-01-01T03:00:00Z", "format": "jsonl", "sql": HOURLY_SQL}
    docs = [
        {**hourly, "name": names["hourly"], "output": "{name}/{start:%H}.jsonl",
         "register_as": {"table": table, "tags": ["host"]}},
        {**hourly, "name": names["scratch"], "output": "{name}/{start:%H}.jsonl"},
        {"name": names["daily"], "db": db, "schedule": "@daily", "start_date": "2024-01-01",
         "end_date": "2024-01-02", "format": "jsonl", "output": "{name}/{start:%Y-%m-%d}.jsonl",
         "sql": f"SELECT host, date_trunc('day', time) AS time, sum(samples) AS samples, "
                f"sum(usage_sum) AS usage_sum FROM {table} GROUP BY host, date_trunc('day', time)"},
    ]
    folder.mkdir()
    for doc in docs:
        (folder / f"{doc['name']}.yaml").write_text(yaml.safe_dump(doc))
    return names


class Tally:
    """The test's own account of what was written: per (hour, host) the samples and their sum."""

    def __init__(self) -> None:
        self.cells: dict[tuple[int, str], list[float]] = defaultdict(list)
        self.step = 0

    def lines(self, hour: int, n: int) -> str:
        out = []
        for i in range(n):
            self.step += 1
            host, value = f"h{i % 2}", float(self.step)
            self.cells[(hour, host)].append(value)
            # Distinct timestamps (no duplicates to merge): each line is its own sample.
            out.append(f"cpu,host={host} usage={value} {T0 + hour * H + self.step * 10**6}")
        return "\n".join(out)

    def hour(self, hour: int) -> list[dict[str, Any]]:
        return sorted(({"host": host, "samples": len(v), "usage_sum": sum(v)}
                       for (h, host), v in self.cells.items() if h == hour), key=lambda r: r["host"])

    def day(self) -> list[dict[str, Any]]:
        hosts: dict[str, list[float]] = defaultdict(list)
        for (_, host), v in self.cells.items():
            hosts[host] += v
        return [{"host": h, "samples": len(v), "usage_sum": sum(v)} for h, v in sorted(hosts.items())]


def rows(path: Path) -> list[dict[str, Any]]:
    got = [json.loads(line) for line in path.read_text().splitlines()]
    return sorted(({k: v for k, v in r.items() if k != "time"} for r in got), key=lambda r: r["host"])


@pytest.fixture
def setup(tmp_path: Path, catalog: Catalog, db: str, spark: object,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    suffix = uuid.uuid4().hex[:8]
    out, folder = materialized_env(tmp_path, monkeypatch)
    yield {"names": definitions(folder, db, suffix), "out": out}


def materialize(name: str, start: int, end: int) -> None:
    """One interval the way a materialize run computes it (plan and commit steps of runs.py), Spark in-process."""
    from spark_jobs.launch import InProcessLauncher
    from iox_planner.runs import refresh
    from iox_planner.runs.definitions import load_definitions
    from iox_planner.runs.settings import RunSettings
    from iox_planner.runs.staging import RunIdentity

    settings = RunSettings.from_env()
    definition = refresh.pick(load_definitions(settings.materialized_dir), name)
    run = RunIdentity(f"materialize_{name}", f"scheduled__{start}")
    result = refresh.refresh_interval(definition, start, end, run, settings, launcher=InProcessLauncher())
    assert result.ok, result.error


def status(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, dict[str, Any]]:
    capsys.readouterr()
    assert main(["materialized", "status", *args, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    return {d["name"]: d for d in doc["definitions"]}


def states(report: dict[str, Any]) -> list[tuple[str, str]]:
    return [(i["start"][11:16], i["state"]) for i in report["intervals"]]


def run_count(catalog: Catalog, definition: str) -> int:
    with catalog.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM iox_query_run WHERE definition = :d")
                                .bindparams(d=definition)).scalar_one())


@pytest.mark.parametrize("warehouse_kind", ["local", "s3"])
def test_refresh_recomputes_exactly_the_stale_interval_then_its_rollup(
        setup: dict[str, Any], catalog: Catalog, db: str, warehouse_kind: str, request: pytest.FixtureRequest,
        capsys: pytest.CaptureFixture[str]) -> None:
    """On a local warehouse and on an `s3://` one (the registered hourly table's files are put on the store)."""
    from iox_planner.config import warehouse_root

    if warehouse_kind == "s3":
        request.getfixturevalue("s3_warehouse")
    root = warehouse_root()
    names, out = setup["names"], setup["out"]
    hourly, daily = names["hourly"], names["daily"]
    tally = Tally()
    for hour in range(3):
        ingest.write_line_protocol(catalog, db, tally.lines(hour, 4))
    persist.persist(catalog, db)  # the first file; the late data's persist makes a second, compaction merges both
    for hour in range(3):
        materialize(hourly, T0 + hour * H, T0 + (hour + 1) * H)
    materialize(daily, T0, T0 + 24 * H)
    report = status(capsys)
    assert states(report[hourly]) == [("00:00", "fresh"), ("01:00", "fresh"), ("02:00", "fresh")]
    assert states(report[daily]) == [("00:00", "fresh")]
    assert [(n["start"], n["intervals"]) for n in report[names["scratch"]]["never_run"]] == [
        ("2024-01-01T00:00:00Z", 3)]

    # Late data into the second hour: exactly that interval is stale, with the reason.
    ingest.write_line_protocol(catalog, db, tally.lines(1, 3))
    report = status(capsys, hourly)
    assert states(report[hourly]) == [("00:00", "fresh"), ("01:00", "stale"), ("02:00", "fresh")]
    assert report[hourly]["intervals"][1]["late"] == [
        {"db": db, "table": "cpu", "chunks": 1, "rows": 3, "partitions": ["2024-01-01"], "dropped": False,
         "table_dropped": False}]
    # Persisting moves the late rows into a second file spanning the three hours (a newer order over every hour):
    # still only the second hour is stale, and the daily rollup (its input table has not changed yet) is fresh.
    persist.persist(catalog, db)
    assert len([c for c in live_chunks(catalog, db) if c["table_name"] == "cpu"]) == 2
    report = status(capsys, "--stale-only")
    assert [(n, states(r)) for n, r in report.items() if r["intervals"]] == [(hourly, [("01:00", "stale")])]
    # Compaction rewrites both files into L1 (the newest order, every hour): it moves data without changing it, so
    # the same interval, and only it, is stale.
    capsys.readouterr()
    assert main(["compact", "--db", db]) == 0
    capsys.readouterr()
    levels = [c["compaction_level"] for c in live_chunks(catalog, db) if c["table_name"] == "cpu"]
    assert levels and set(levels) == {1}, levels
    report = status(capsys, "--stale-only")
    assert [(n, states(r)) for n, r in report.items() if r["intervals"]] == [(hourly, [("01:00", "stale")])]

    before = {n: run_count(catalog, n) for n in (hourly, daily)}
    capsys.readouterr()
    assert main(["materialized", "refresh", hourly, "--dry-run"]) == 0
    assert "would refresh" in capsys.readouterr().out and run_count(catalog, hourly) == before[hourly]
    assert main(["materialized", "refresh", hourly]) == 0
    printed = capsys.readouterr().out
    # One Spark job for the hourly definition, not three; then the daily one, which the refresh made stale.
    assert {n: run_count(catalog, n) - before[n] for n in before} == {hourly: 1, daily: 1}
    assert printed.index(hourly) < printed.index(daily)
    assert rows(out / hourly / "01.jsonl") == tally.hour(1)
    materialize(names["scratch"], T0 + H, T0 + 2 * H)
    assert rows(out / hourly / "01.jsonl") == rows(out / names["scratch"] / "01.jsonl")
    assert rows(out / daily / "2024-01-01.jsonl") == tally.day()
    report = status(capsys)
    assert {i["state"] for n in (hourly, daily) for i in report[n]["intervals"]} == {"fresh"}

    # A refresh that fails (the late chunk's file is missing) publishes nothing and leaves the mark.
    ingest.write_line_protocol(catalog, db, tally.lines(2, 2))
    newest = max(live_chunks(catalog, db), key=lambda c: c["chunk_order"])
    kept = root.read_bytes(newest["path"])
    old_output = (out / hourly / "02.jsonl").read_bytes()
    assert root.delete(newest["path"])
    try:
        assert main(["materialized", "refresh", hourly]) != 0
        assert (out / hourly / "02.jsonl").read_bytes() == old_output
        report = status(capsys)
        assert states(report[hourly])[2] == ("02:00", "stale")
        assert report[hourly]["intervals"][2]["late"][0]["rows"] == 2
        assert "is missing from the warehouse" in report[hourly]["intervals"][2]["error"]
        assert states(report[daily]) == [("00:00", "fresh")]  # its input did not change
    finally:
        root.put_bytes(kept, newest["path"])
    # The file is back: the same command fixes both the output and the mark.
    assert main(["materialized", "refresh", hourly]) == 0
    assert rows(out / hourly / "02.jsonl") == tally.hour(2)
    assert rows(out / daily / "2024-01-01.jsonl") == tally.day()
    report = status(capsys)
    assert {i["state"] for n in (hourly, daily) for i in report[n]["intervals"]} == {"fresh"}


def test_refresh_of_an_unknown_definition_is_one_paragraph(setup: dict[str, Any],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["materialized", "refresh", "nope"]) != 0
    assert "no materialized query named 'nope'" in capsys.readouterr().err


def test_an_interval_published_before_reads_were_recorded_is_stale_until_refreshed(
        setup: dict[str, Any], catalog: Catalog, db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """After the upgrade to migration 0006, intervals materialized before it have a successful run but no record of
    what they read: they cannot be judged, so status shows them stale (never silently fresh, never hidden), and one
    refresh records their reads."""
    hourly = setup["names"]["hourly"]
    ingest.write_line_protocol(catalog, db, Tally().lines(0, 4))
    materialize(hourly, T0, T0 + H)
    with catalog.engine.begin() as conn:  # as the catalog looks for an interval published before 0006
        conn.execute(sa.text("DELETE FROM iox_materialized_read WHERE definition = :d").bindparams(d=hourly))
    report = status(capsys, hourly)
    [interval] = report[hourly]["intervals"]
    assert interval["state"] == "stale" and "before iox-batch recorded what runs read" in str(interval)
    assert main(["materialized", "refresh", hourly]) == 0
    assert states(status(capsys, hourly)[hourly]) == [("00:00", "fresh")]
