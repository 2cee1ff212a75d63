"""`iox_persist` with real Airflow (`dag.test()`) and a real catalog: partitions whose ingester chunks pile up are
persisted; the others are left alone."""

from __future__ import annotations

import pytest
from airflow_support import DagRunner
from common_support import live_chunks

from iox_planner.ingest import write as ingest
from iox_planner.catalog.store import Catalog

pytestmark = pytest.mark.airflow

T0 = 1704067200 * 10**9


def test_iox_persist_persists_partitions_whose_ingester_chunks_pile_up(
        dag_runner: DagRunner, catalog: Catalog, db: str) -> None:
    for n in range(3):
        ingest.write_line_protocol(catalog, db, f"cpu,host=a usage={n} {T0 + n}\ncpu,host=a usage={n + 10} {T0}")
    ingest.write_line_protocol(catalog, db, f"mem,host=a used=1 {T0}")  # one chunk: below the threshold
    [result] = dag_runner.run([{"dag_id": "iox_persist"}],
                              env={"IOX_PERSIST_CHUNK_THRESHOLD": "3", "IOX_PERSIST_DATABASES": db})
    assert result["state"] == "success", result["log"][-4000:]
    # Nothing overlaps the new file: no compaction is requested.
    assert result["tasks"] == {"expire": "success", "find_piles": "success", "persist_table[0]": "success",
                               "request_compaction": "skipped"}
    chunks = {(c["table_name"], c["kind"]): c for c in live_chunks(catalog, db)}
    assert set(chunks) == {("cpu", "parquet"), ("mem", "ingester")}
    # Three chunks of two writes each, merged by IOx rules: (a, T0) last written 12, (a, T0+1) 1, (a, T0+2) 2.
    assert chunks[("cpu", "parquet")]["row_count"] == 3


def test_iox_persist_requests_compaction_of_the_partitions_it_left_overlapping(
        dag_runner: DagRunner, catalog: Catalog, db: str) -> None:
    from iox_planner.maintenance.persist import persist

    ingest.write_line_protocol(catalog, db, f"cpu,host=a usage=1 {T0}\ncpu,host=b usage=1 {T0}")
    [first] = persist(catalog, db)  # a file of the day; then late writes to it pile up in the ingester
    for n in range(3):
        ingest.write_line_protocol(catalog, db, f"cpu,host=a usage={n + 2} {T0}")
    [result] = dag_runner.run([{"dag_id": "iox_persist"}],
                              env={"IOX_PERSIST_CHUNK_THRESHOLD": "3", "IOX_PERSIST_DATABASES": db})
    assert result["state"] == "success", result["log"][-4000:]
    assert result["tasks"] == {"expire": "success", "find_piles": "success", "persist_table[0]": "success",
                               "request_compaction": "success"}
    assert f"requested compaction of {db}: 1 partition(s) left overlapping" in result["log"]
    # The persist's new file overlaps the first one: two live L0 files, left for the requested compaction.
    assert [c["kind"] for c in live_chunks(catalog, db)] == ["parquet", "parquet"]
    assert first.partition_id == live_chunks(catalog, db)[1]["partition_id"]
