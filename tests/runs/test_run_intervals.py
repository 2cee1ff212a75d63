"""`iox-batch materialized run|refresh` over many intervals (`runs/refresh.py` `run_intervals`), against a real
Postgres catalog: a failure that is not an interval's own (an unknown database, a definition that cannot plan, a
database dropped meanwhile, an unreachable catalog or Spark) stops the whole command at once with one paragraph; an
interval's own failure lets the others go on; more intervals than IOX_MAX_RUN_INTERVALS are refused before any
runs; a long run tells its progress. The runs that publish on Spark: tests/catalog/test_lifecycle.py."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from common_support import materialized_env
from spark_support import cli

from iox_planner.catalog.drops import drop_database
from iox_planner.catalog.store import Catalog
from iox_planner.errors import BadInputError, CatalogError, IoxError
from iox_planner.ingest.write import write_line_protocol
from iox_planner.runs import refresh
from iox_planner.runs.definitions import parse_definition
from iox_planner.runs.settings import RunSettings

H = 3600 * 10**9
T0 = 1704067200 * 10**9  # 2024-01-01T00:00:00Z


@pytest.fixture
def defs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    _, folder = materialized_env(tmp_path, monkeypatch)
    folder.mkdir()
    return folder


def _define(folder: Path, db: str, start: str = "2021-01-01T00:00:00Z", sql: str = "SELECT host, v FROM cpu") -> str:
    name = f"hourly_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.yaml").write_text(yaml.safe_dump({
        "name": name, "db": db, "schedule": "@hourly", "start_date": start, "format": "jsonl",
        "output": "{name}/{start:%Y%m%dT%H}.jsonl", "sql": sql}))
    return name


def _runs(catalog: Catalog, name: str) -> int:
    with catalog.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM iox_query_run WHERE definition = :d")
                                .bindparams(d=name)).scalar_one())


def test_an_unknown_database_stops_the_run_at_once(defs: Path, catalog: Catalog) -> None:
    """Probe: 25,000 hourly intervals of a database that does not exist printed the same failure 25,000 times for
    20 minutes. Now: one paragraph, before any interval runs (here 8,760: a year)."""
    name = _define(defs, f"nope_{uuid.uuid4().hex[:8]}")
    started = time.monotonic()
    result = cli("materialized", "run", name, "--from", "2021-01-01T00:00:00Z", "--to", "2022-01-01T00:00:00Z")
    assert result.returncode == 3, result.stderr
    assert result.stderr.startswith(f"error: {name}: stopped after 0 of 8,760 interval(s) (0 published, 0 failed) "
                                    "by a failure that is not any interval's own: database 'nope_"), result.stderr
    assert "does not exist" in result.stderr and result.stderr.count("\n") == 1 and "FAILED" not in result.stdout
    assert _runs(catalog, name) == 0 and time.monotonic() - started < 60


def test_a_definition_that_cannot_plan_stops_the_run_at_once(defs: Path, catalog: Catalog, db: str) -> None:
    write_line_protocol(catalog, db, f"cpu,host=a v=1 {T0 + 1}")
    name = _define(defs, db, sql="SELECT host, nope FROM cpu")
    result = cli("materialized", "run", name, "--from", "2021-01-01T00:00:00Z", "--to", "2021-02-01T00:00:00Z")
    assert result.returncode == 2 and "stopped after 0 of 744 interval(s)" in result.stderr, result.stderr
    assert "nope" in result.stderr and "FAILED" not in result.stdout and _runs(catalog, name) == 0


def test_more_intervals_than_the_bound_are_refused_before_any_runs(defs: Path, catalog: Catalog, db: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    name = _define(defs, db, start="2020-01-01T00:00:00Z")
    # 366 + 365 + 310 days (2020, 2021, 2022 to November 7) of 24 hours, and 8 hours: 24,992 hourly intervals.
    result = cli("materialized", "run", name, "--from", "2020-01-01T00:00:00Z", "--to", "2022-11-07T08:00:00Z")
    assert result.returncode == 2 and result.stderr.startswith(
        f"error: {name}: 24,992 intervals to run, more than the 10,000 one command takes (IOX_MAX_RUN_INTERVALS); "
        "nothing was run"), result.stderr
    monkeypatch.setenv("IOX_MAX_RUN_INTERVALS", "2")
    result = cli("materialized", "run", name, "--from", "2020-01-01T00:00:00Z", "--to", "2020-01-01T03:00:00Z")
    assert result.returncode == 2 and "3 intervals to run, more than the 2 one command takes" in result.stderr
    assert _runs(catalog, name) == 0


# --- run_intervals itself, with a run_one of the test's own: what each kind of failure does -------------------------


def _definition(db: str) -> Any:
    return parse_definition({"name": f"d_{uuid.uuid4().hex[:8]}", "db": db, "schedule": "@hourly",
                             "start_date": "2024-01-01", "output": "{name}/{start:%H}.jsonl", "format": "jsonl",
                             "sql": "SELECT host, v FROM cpu"}, "d.yaml")


INTERVALS = [(T0, T0 + H), (T0 + H, T0 + 2 * H), (T0 + 2 * H, T0 + 3 * H)]


def _settings(tmp_path: Path) -> RunSettings:
    return RunSettings(output_root=tmp_path, output_roots=(tmp_path,))


def _failed(definition: Any, start: int, end: int, exit_code: int) -> refresh.RefreshResult:
    return refresh.RefreshResult(definition.name, start, end, False, error="it failed", exit_code=exit_code)


def test_an_interval_s_own_failure_lets_the_others_go_on(catalog: Catalog, db: str, tmp_path: Path) -> None:
    write_line_protocol(catalog, db, f"cpu,host=a v=1 {T0 + 1}")
    definition, seen = _definition(db), []

    def run_one(start: int, end: int) -> refresh.RefreshResult:
        seen.append(start)  # the middle one fails as its lock held or its data would make it: exit status 1 or 2
        ok = start != INTERVALS[1][0]
        return refresh.RefreshResult(definition.name, start, end, ok, exit_code=0 if ok else 2)

    got = refresh.run_intervals(definition, INTERVALS, run_one, _settings(tmp_path), report=lambda r: None)
    assert got == (2, 1) and seen == [a for a, _ in INTERVALS]


def test_a_database_dropped_meanwhile_stops_at_the_failure(catalog: Catalog, db: str, tmp_path: Path) -> None:
    from iox_planner.config import warehouse

    write_line_protocol(catalog, db, f"cpu,host=a v=1 {T0 + 1}")
    definition, seen = _definition(db), []

    def run_one(start: int, end: int) -> refresh.RefreshResult:
        seen.append(start)
        drop_database(catalog, db, warehouse())
        return _failed(definition, start, end, 3)

    with pytest.raises(CatalogError) as raised:
        refresh.run_intervals(definition, INTERVALS, run_one, _settings(tmp_path), report=lambda r: None)
    assert seen == [T0] and "stopped after 1 of 3 interval(s) (0 published, 1 failed)" in str(raised.value)
    assert f"database {db!r} does not exist" in str(raised.value)


def test_an_unreachable_catalog_or_spark_stops_at_the_failure(catalog: Catalog, db: str, tmp_path: Path) -> None:
    write_line_protocol(catalog, db, f"cpu,host=a v=1 {T0 + 1}")
    definition, seen = _definition(db), []

    def run_one(start: int, end: int) -> refresh.RefreshResult:
        seen.append(start)
        return _failed(definition, start, end, 75)

    with pytest.raises(IoxError) as raised:
        refresh.run_intervals(definition, INTERVALS, run_one, _settings(tmp_path), report=lambda r: None)
    assert seen == [T0] and raised.value.exit_code == 75 and "stopped after 1 of 3" in str(raised.value)


def test_a_long_run_tells_its_progress(catalog: Catalog, db: str, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    write_line_protocol(catalog, db, f"cpu,host=a v=1 {T0 + 1}")
    definition, told = _definition(db), []
    monkeypatch.setattr(refresh, "PROGRESS_EVERY_S", 0.0)
    refresh.run_intervals(definition, INTERVALS, lambda a, b: refresh.RefreshResult(definition.name, a, b, a != T0),
                          _settings(tmp_path), report=lambda r: None, progress=told.append)
    assert told == [f"{definition.name}: 1 of 3 interval(s) done (1 failed)",
                    f"{definition.name}: 2 of 3 interval(s) done (1 failed)"]
    monkeypatch.setattr(refresh, "PROGRESS_EVERY_S", 3600.0)  # a short run says nothing
    told.clear()
    refresh.run_intervals(definition, INTERVALS, lambda a, b: refresh.RefreshResult(definition.name, a, b, True),
                          _settings(tmp_path), report=lambda r: None, progress=told.append)
    assert told == []


def test_the_bound_is_the_run_settings(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="IOX_MAX_RUN_INTERVALS"):
        RunSettings(max_run_intervals=0)
    assert RunSettings.from_env({"IOX_MAX_RUN_INTERVALS": "3"}).max_run_intervals == 3
