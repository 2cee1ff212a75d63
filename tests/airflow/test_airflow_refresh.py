"""`iox_refresh` with real Airflow (`dag.test()`), real Postgres and Spark: three hourly intervals and a daily rollup
of them are materialized; late data lands in the second hour; status shows exactly that interval stale (and still
only that one after a persist); one `iox_refresh` run recomputes that hour with ONE Spark job (one mapped task,
one query run), then, in the next level, the daily rollup the re-registration made stale; both outputs hold the
test's own expected counts; everything is fresh after. (The refreshed output against a from-scratch materialization
of the interval, and a failing refresh: tests/runs/test_materialized_refresh.py, through the same refresh steps.)

The initial intervals are computed in this process (the same plan and commit steps a materialize run takes, Spark
in-process) to keep spark-submit start-ups for the runs under test. """

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from airflow_support import DagRunner, leftovers, locks

from iox_planner.catalog.store import Catalog
from iox_planner.cli.main import main
from iox_planner.maintenance import persist
from iox_planner.ingest import write as ingest

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

H = 3600 * 10**9
T0 = 1704067200 * 10**9  # 2024-01-01T00:00:00Z
SQL = ("SELECT host, date_trunc('hour', time) AS time, count(*) AS samples, sum(usage) AS usage_sum "
       "FROM cpu GROUP BY host, date_trunc('hour', time)")


def cpu(hour: int, n: int, base: float) -> str:
    return "\n".join(f"cpu,host=h{i % 2} usage={base + i} {T0 + hour * H + (i + int(base)) * 10**6}"
                     for i in range(n))


def rows(path: Path) -> list[dict[str, Any]]:
    return sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda r: r["host"])


def test_iox_refresh_reruns_exactly_the_stale_interval_then_the_rollup(
        airflow_env: dict[str, str], dag_runner: DagRunner, catalog: Catalog, spark: object,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_jobs.launch import InProcessLauncher
    from iox_planner.runs import refresh
    from iox_planner.runs.definitions import load_definitions
    from iox_planner.runs.settings import RunSettings
    from iox_planner.runs.staging import RunIdentity

    suffix = uuid.uuid4().hex[:8]
    db = f"af_late_{suffix}"
    hourly, daily, table = f"late_{suffix}", f"daily_{suffix}", f"hourly_{suffix}"
    folder = tmp_path / "defs"
    folder.mkdir()
    common = {"db": db, "schedule": "@hourly", "start_date": "2024-01-01T00:00:00Z",
              "end_date": "2024-01-01T03:00:00Z", "format": "jsonl", "sql": SQL, "paused": True}
    docs = [
        {**common, "name": hourly, "output": "{name}/{start:%H}.jsonl",
         "register_as": {"table": table, "tags": ["host"]}},
        {**common, "name": daily, "schedule": "@daily", "end_date": "2024-01-02",
         "output": "{name}/{start:%Y-%m-%d}.jsonl",
         "sql": f"SELECT host, date_trunc('day', time) AS time, sum(samples) AS samples FROM {table} "
                "GROUP BY host, date_trunc('day', time)"},
    ]
    for doc in docs:
        (folder / f"{doc['name']}.yaml").write_text(yaml.safe_dump(doc))
    for key in ("IOX_OUTPUT_ROOT", "IOX_OUTPUT_ROOTS"):
        monkeypatch.setenv(key, airflow_env[key])
    monkeypatch.setenv("IOX_MATERIALIZED_DIR", str(folder))
    settings = RunSettings.from_env()
    found = load_definitions(folder)
    out = settings.output_root

    def materialize(name: str, start: int, end: int) -> None:
        run = RunIdentity(f"materialize_{name}", f"scheduled__{start}")
        result = refresh.refresh_interval(refresh.pick(found, name), start, end, run, settings,
                                          launcher=InProcessLauncher())
        assert result.ok, result.error

    def states(name: str) -> list[tuple[int, str]]:
        report = refresh.status(catalog, refresh.pick(found, name), never_run=False)
        return [((i.start - T0) // H, i.state) for i in report.intervals]

    for hour in range(3):
        ingest.write_line_protocol(catalog, db, cpu(hour, 4, 1.0))
    persist.persist(catalog, db)  # a first file, so that the late data's persist leaves two for compaction
    for hour in range(3):
        materialize(hourly, T0 + hour * H, T0 + (hour + 1) * H)
    materialize(daily, T0, T0 + 24 * H)
    ingest.write_line_protocol(catalog, db, cpu(1, 3, 100.0))  # late, into the second hour
    assert states(hourly) == [(0, "fresh"), (1, "stale"), (2, "fresh")]
    persist.persist(catalog, db)
    assert states(hourly) == [(0, "fresh"), (1, "stale"), (2, "fresh")]
    # Compaction moves data without changing it: the same interval, and only it, stays stale.
    assert main(["compact", "--db", db]) == 0
    assert states(hourly) == [(0, "fresh"), (1, "stale"), (2, "fresh")]
    assert states(daily) == [(0, "fresh")]
    [late] = refresh.status(catalog, refresh.pick(found, hourly)).stale[0].late
    assert (late["table"], late["chunks"], late["rows"]) == ("cpu", 1, 3)

    [result] = dag_runner.run([{"dag_id": "iox_refresh", "env": {"IOX_MATERIALIZED_DIR": str(folder)}}])
    assert result.get("state") == "success", result.get("log", result)
    # Level 0 (hourly): one mapped refresh, the stale hour. Level 1 (daily): found after level 0.
    assert result["tasks"] == {"find_0": "success", "refresh_0[0]": "success",
                               "find_1": "success", "refresh_1[0]": "success"}
    with catalog.engine.connect() as conn:
        runs = conn.execute(sa.text(
            "SELECT definition, interval_start, status, started_at, finished_at FROM iox_query_run "
            "WHERE dag_id = 'iox_refresh' AND definition IN (:a, :b) ORDER BY started_at"
        ).bindparams(a=hourly, b=daily)).all()
    assert [(r.definition, r.interval_start, r.status) for r in runs] == [
        (hourly, T0 + H, "success"), (daily, T0, "success")]
    assert runs[0].finished_at <= runs[1].started_at  # the rollup after its input, never before

    assert {r["host"]: r["samples"] for r in rows(out / hourly / "01.jsonl")} == {"h0": 4, "h1": 3}
    assert {r["host"]: r["samples"] for r in rows(out / daily / "2024-01-01.jsonl")} == {"h0": 8, "h1": 7}
    assert states(hourly) == [(0, "fresh"), (1, "fresh"), (2, "fresh")]
    assert states(daily) == [(0, "fresh")]
    assert locks(catalog) == [] and leftovers(out) == []
