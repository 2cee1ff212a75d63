"""The plan step against a real Postgres catalog (no Spark, no Airflow): a `register_as` that would replace rows
it does not own is refused before anything runs, with the run recorded failed and nothing written."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from iox_planner.catalog import runs
from iox_planner.catalog.store import Catalog
from iox_planner.errors import BadInputError, RunFailed
from iox_planner.ingest import register
from iox_planner.ingest.write import write_line_protocol
from iox_planner.runs.definitions import MaterializedQuery, parse_definition
from iox_planner.runs.failure import fail
from iox_planner.runs.planning import plan
from iox_planner.runs.request import QueryRequest
from iox_planner.runs.settings import RunSettings
from iox_planner.runs.staging import RunIdentity, Staging

T0 = 1704067200 * 10**9  # 2024-01-01T00:00:00Z
DAY = 86_400 * 10**9
START = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


def _definition(db: str, name: str, table: str) -> MaterializedQuery:
    return parse_definition({
        "name": name, "db": db, "schedule": "@daily", "start_date": "2024-01-01", "format": "jsonl",
        "sql": "SELECT host, date_trunc('day', time) AS time, max(v) AS v FROM cpu GROUP BY 1, 2",
        "output": "{name}/{start:%Y-%m-%d}.jsonl", "register_as": {"table": table, "tags": ["host"]},
    }, f"{name}.yaml")


def _plan(definition: MaterializedQuery, settings: RunSettings) -> tuple[Any, Any, RunIdentity]:
    request = definition.request(START, START + dt.timedelta(days=1), settings)
    return request, plan, RunIdentity(f"materialize_{definition.name}", f"test__{uuid.uuid4().hex[:8]}")


def _refused(catalog: Catalog, definition: MaterializedQuery, settings: RunSettings, message: str) -> None:
    request, step, run = _plan(definition, settings)
    with pytest.raises(RunFailed) as err:
        step(request, run, settings)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
    recorded = runs.find_run(catalog, run.dag_id, run.run_id)
    assert recorded is not None and recorded["status"] == "failed" and message in recorded["error"]
    assert runs.lock_holder(catalog, request.lock_key()) is None
    assert not Staging.for_run(request.output, run).root.exists() and not request.output.exists()
    assert not request.output.parent.exists()  # `{name}/`, which the run would have made: a refused run leaves nothing


def _planned(catalog: Catalog, definition: MaterializedQuery, settings: RunSettings) -> None:
    """The plan step goes through (then the run is failed on purpose, which frees its lock)."""
    request, step, run = _plan(definition, settings)
    outcome = step(request, run, settings)
    fail(request, run, outcome.handle(), "test: planned only")
    assert runs.lock_holder(catalog, request.lock_key()) is None


def test_register_as_over_a_table_ingest_wrote_is_refused_when_the_run_plans(catalog: Catalog, db: str,
                                                                            tmp_path: Path) -> None:
    settings = RunSettings(output_root=tmp_path, output_roots=(tmp_path,))
    write_line_protocol(catalog, db, f"cpu,host=a v=1 {T0 + 1}\nh2o,city=b temp=1 {T0 + 2}")
    _refused(catalog, _definition(db, "over_h2o", "h2o"), settings,
             "register_as: table 'h2o' of database " + db + " holds data that was written to it (write)")
    # Registering over the query's own input is refused the same way; a table of its own is fine.
    _refused(catalog, _definition(db, "over_cpu", "cpu"), settings, "holds data that was written to it (write)")
    _planned(catalog, _definition(db, "own_table", "cpu_daily"), settings)


def test_register_as_may_replace_only_what_its_own_runs_registered(catalog: Catalog, db: str,
                                                                   tmp_path: Path) -> None:
    settings = RunSettings(output_root=tmp_path, output_roots=(tmp_path,))
    write_line_protocol(catalog, db, f"cpu,host=a v=1 {T0 + 1}")
    mine = _definition(db, "mine", "rollup")
    # An earlier run of `mine` registered the table: the table is `mine`'s from then on.
    rows = pa.table({"host": ["a"], "time": pa.array([T0], pa.int64()), "v": [1.0]})
    register.register_interval(catalog, db, "rollup", rows, tags=["host"], interval=(T0, T0 + DAY), owner="mine")
    _planned(catalog, mine, settings)
    # A rerun of that interval (a backfill reprocessing completed runs) resets its run row to `running` before it
    # plans: the table is still its own. Two intervals rerun at once both find it so.
    request = mine.request(START, START + dt.timedelta(days=1), settings)
    for n in range(2):
        runs.start_run(catalog, database=db, params=request.as_params(), dag_id="materialize_mine",
                       run_id=f"rerun-{n}-{db}", definition="mine", interval=(T0, T0 + DAY))
    _planned(catalog, mine, settings)
    _refused(catalog, _definition(db, "theirs", "rollup"), settings,
             "register_as: table 'rollup' of database " + db + " was registered by materialized query 'mine', not "
             "by an earlier run of 'theirs'")
    # The registration checks again in its own transaction (`theirs` planned before `mine` created the table).
    with pytest.raises(BadInputError, match="table 'rollup' of database .* belongs to materialized query 'mine'; "
                                            "materialized query 'theirs' may not replace its rows"):
        register.register_interval(catalog, db, "rollup", rows, tags=["host"], interval=(T0, T0 + DAY),
                                   owner="theirs")
    # A table no materialized query registered (registered by hand): nobody's to replace.
    register.register_interval(catalog, db, "by_hand", rows, tags=["host"], interval=(T0, T0 + DAY))
    _refused(catalog, _definition(db, "mine2", "by_hand"), settings, "was registered by no materialized query")


@pytest.mark.parametrize("sql", ["SELECT * FROM no_such_table", "SELECT nope FROM cpu", "DELETE FROM cpu"])
def test_a_triggered_run_refused_at_planning_leaves_no_folder(catalog: Catalog, db: str, tmp_path: Path,
                                                             sql: str) -> None:
    root = tmp_path / "out"
    root.mkdir()
    (root / "kept").mkdir()
    settings = RunSettings(output_root=root, output_roots=(root,))
    write_line_protocol(catalog, db, f"cpu,host=a v=1 {T0 + 1}")
    for output in ("deep/er/x.jsonl", "kept/new/x.jsonl"):
        request = QueryRequest.from_params({"db": db, "sql": sql, "output": output, "format": "jsonl"}, settings)
        run = RunIdentity("iox_query", f"test__{uuid.uuid4().hex[:8]}")
        with pytest.raises(RunFailed):
            plan(request, run, settings)
        assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == ["kept"]


def test_a_run_over_whole_days_just_outside_the_range_plans_and_is_recorded(catalog: Catalog, db: str,
                                                                           tmp_path: Path) -> None:
    """Probe: `time_start 1677-09-21T00:00:00Z`, `time_end 2262-04-12T00:00:00Z` ended the plan task in
    psycopg2's "bigint out of range" with no run recorded. The range is open on both sides, as recorded."""
    root = tmp_path / "out"
    root.mkdir()
    settings = RunSettings(output_root=root, output_roots=(root,))
    write_line_protocol(catalog, db, f"cpu,host=a v=1 {T0 + 1}")
    request = QueryRequest.from_params({"db": db, "sql": "SELECT host, v FROM cpu", "output": "x.jsonl",
                                        "format": "jsonl", "time_start": "1677-09-21T00:00:00Z",
                                        "time_end": "2262-04-12T00:00:00Z"}, settings)
    run = RunIdentity("iox_query", f"test__{uuid.uuid4().hex[:8]}")
    outcome = plan(request, run, settings)
    recorded = runs.find_run(catalog, run.dag_id, run.run_id)
    assert recorded is not None and recorded["status"] == "running"
    assert (recorded["params"]["time_start"], recorded["params"]["time_end"]) == (None, None)
    assert outcome.summary["chunks_scanned"] == 1
    fail(request, run, outcome.handle(), "test over")  # releases the lock and the staging folder
