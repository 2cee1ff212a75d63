"""`iox_compact` with real Airflow (`dag.test()`), real spark-submit and a real catalog: a loaded database is
compacted (every partition's L0 files become L1 files holding exactly the deduplicated rows); a second run finds
nothing to do and changes nothing."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from airflow_support import DAY, T0, DagRunner, overlapping_chunks
from common_support import live_chunks, tree_digest

from iox_planner.catalog.store import Catalog
from iox_planner.ingest.scenario import load_scenario, parse_scenario

pytestmark = pytest.mark.airflow

def test_iox_compact_compacts_a_loaded_database_and_a_second_run_does_nothing(
        dag_runner: DagRunner, catalog: Catalog, db: str) -> None:
    # Two partitions, three overlapping files each; the test keeps its own tally of the deduplicated rows.
    chunks, want = overlapping_chunks()
    # And a file overlapping nothing: promoted to L1 in place, not rewritten (not counted in "files in").
    chunks.append({"id": "F7", "kind": "parquet", "order": 7, "lines": f"cpu,host=h9 usage=7 {T0 + 3600 * 10**9}"})
    want[("h9", T0 + 3600 * 10**9)] = 7.0
    load_scenario(catalog, parse_scenario({"chunks": chunks}), db)
    env = {"IOX_COMPACT_DATABASES": db, "IOX_MAX_SPARK_JOBS": "2"}
    [first] = dag_runner.run([{"dag_id": "iox_compact"}], env=env)
    assert first["state"] == "success", first["log"][-4000:]
    assert first["tasks"] == {"find_work": "success", "compact_batch[0]": "success", "compact_batch[1]": "success",
                              "promote": "skipped", "report": "success"}, first["tasks"]
    assert "Spark-Submit cmd" in first["log"]  # the log the promotions-only test reads shows a spark-submit so
    live = live_chunks(catalog, db)
    assert {(c["partition_key"], c["compaction_level"]) for c in live} == {("2024-01-01", 1), ("2024-01-02", 1)}
    warehouse = Path(__import__("os").environ["IOX_WAREHOUSE"])
    got = {}
    for c in live:
        for r in pq.read_table(warehouse / c["path"]).to_pylist():
            assert (r["host"], r["time"]) not in got
            got[(r["host"], r["time"])] = r["usage"]
    assert got == want
    assert "compacted 2 partition(s): 6 file(s) in, 2 out" in first["log"]
    assert "1 file(s) (1 rows) promoted to L1 in place" in first["log"]
    assert any(c["label"] == "F7" and c["compaction_level"] == 1 for c in live)  # the same catalog row, now L1

    before = (sorted(map(str, live_chunks(catalog, db))), tree_digest(warehouse / str(live[0]["path"]).split("/")[0]))
    [second] = dag_runner.run([{"dag_id": "iox_compact"}], env=env)
    assert second["state"] == "success", second["log"][-4000:]
    assert second["tasks"]["find_work"] == "success" and "nothing to compact" in second["log"]
    assert not [t for t, state in second["tasks"].items() if t.startswith("compact_batch") and state == "success"]
    after = (sorted(map(str, live_chunks(catalog, db))), tree_digest(warehouse / str(live[0]["path"]).split("/")[0]))
    assert after == before


def test_iox_compact_makes_promotions_only_without_a_spark_submit(
        dag_runner: DagRunner, catalog: Catalog, db: str) -> None:
    """Every partition needs promotions only (files overlapping nothing): the run starts no spark-submit
    (`compact_batch` maps over nothing and is skipped; `promote` makes the promotions in its own process), and the
    files are L1 in place, reported as before."""
    chunks = [{"id": f"F{k}", "kind": "parquet", "order": k,
               "lines": f"cpu,host=h{k} usage={k} {T0 + (k % 2) * DAY + k * 3600 * 10**9}"} for k in range(1, 4)]
    load_scenario(catalog, parse_scenario({"chunks": chunks}), db)
    before = {c["label"]: (c["path"], c["chunk_order"], c["compaction_level"]) for c in live_chunks(catalog, db)}
    assert {v[2] for v in before.values()} == {0}
    [run] = dag_runner.run([{"dag_id": "iox_compact"}], env={"IOX_COMPACT_DATABASES": db})
    assert run["state"] == "success", run["log"][-4000:]
    assert run["tasks"] == {"find_work": "success", "compact_batch": "skipped", "promote": "success",
                            "report": "success"}, run["tasks"]
    assert "Spark-Submit cmd" not in run["log"]  # what SparkSubmitHook logs as it starts one
    after = {c["label"]: (c["path"], c["chunk_order"], c["compaction_level"]) for c in live_chunks(catalog, db)}
    assert after == {k: (path, order, 1) for k, (path, order, _) in before.items()}
    assert "compacted 2 partition(s): 0 file(s) in, 0 out" in run["log"]
    assert "3 file(s) (3 rows) promoted to L1 in place" in run["log"]
