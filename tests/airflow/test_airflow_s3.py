"""The DAGs over an `s3://` warehouse (issue 32, item 6): real Airflow (`dag.test()` in the session's runner
process), real spark-submit, the suite's S3 server (moto's standalone server on loopback), whose `AWS_*` settings
the Airflow environment inherits as a deployment's scheduler has its own. A triggered `iox_query` run gives the
rows the test computes by hand, and an `iox_persist` run persists the pile of ingester chunks into an object on
the store; no Parquet file lands on the local disk, and no secret in a run record, an XCom or Airflow's logs.

One run of each (the Airflow suite's budget): the other DAGs share their storage code with these."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from airflow_support import DagRunner, query_runs
from common_support import live_chunks

from iox_planner.catalog.store import Catalog
from iox_planner.ingest import write as ingest
from s3_support import CREDENTIALS, local_parquet_files

pytestmark = [pytest.mark.airflow, pytest.mark.spark]

T0 = 1704067200 * 10**9
SECRET = CREDENTIALS["AWS_SECRET_ACCESS_KEY"]


def store_objects(uri: str) -> dict[str, int]:
    """Every object under `uri` and its size, listed straight from the store (pyarrow's S3 client, this process's
    AWS_* settings), not through iox-batch."""
    import pyarrow.fs as pafs

    endpoint = os.environ["AWS_ENDPOINT_URL"].split("://", 1)[1]
    fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", region=os.environ["AWS_REGION"],
                           force_virtual_addressing=False)
    base = uri[len("s3://"):]
    found = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    return {f.path[len(base) + 1:]: int(f.size or 0) for f in found if f.type == pafs.FileType.File}


def read_store_parquet(uri: str, rel: str) -> list[dict[str, Any]]:
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    endpoint = os.environ["AWS_ENDPOINT_URL"].split("://", 1)[1]
    fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", region=os.environ["AWS_REGION"],
                           force_virtual_addressing=False)
    return list(pq.read_table(f"{uri[len('s3://'):]}/{rel}", filesystem=fs).to_pylist())


def xcom_and_log_text(airflow_env: dict[str, str], results: list[dict[str, Any]]) -> str:
    """What Airflow kept of the runs: their XComs and every log file under AIRFLOW_HOME."""
    texts = [json.dumps(r.get("xcoms", [])) + r.get("log", "") for r in results]
    for path in Path(airflow_env["AIRFLOW_HOME"]).rglob("*.log"):
        texts.append(path.read_text(errors="replace"))
    return "\n".join(texts)


def test_iox_query_and_iox_persist_over_an_s3_warehouse(dag_runner: DagRunner, airflow_env: dict[str, str],
                                                        catalog: Catalog, s3_warehouse: str, tmp_path: Path) -> None:
    query_db, persist_db = f"s3q_{uuid.uuid4().hex[:12]}", f"s3p_{uuid.uuid4().hex[:12]}"
    # The query's data: a persisted Parquet file and a newer ingester chunk overwriting one of its rows, on the store.
    from iox_planner.maintenance.persist import persist

    ingest.write_line_protocol(catalog, query_db, f"cpu,host=a usage=1 {T0}\ncpu,host=b usage=2 {T0}\n"
                                                  f"cpu,host=b usage=3 {T0 + 10**9}")
    persist(catalog, query_db)
    ingest.write_line_protocol(catalog, query_db, f"cpu,host=a usage=10 {T0}")
    # The persist's pile: three ingester chunks of one partition.
    for n in range(3):
        ingest.write_line_protocol(catalog, persist_db, f"mem,host=a used={n} {T0 + n}\nmem,host=a used={n + 10} {T0}")
    before = store_objects(s3_warehouse)
    assert before and all(rel.endswith(".parquet") for rel in before), before

    output = tmp_path / "cpu.jsonl"
    sql = "SELECT host, usage FROM cpu ORDER BY host, usage"
    env = {"IOX_WAREHOUSE": s3_warehouse, "IOX_PERSIST_CHUNK_THRESHOLD": "3", "IOX_PERSIST_DATABASES": persist_db}
    results = dag_runner.run([
        {"dag_id": "iox_query", "conf": {"db": query_db, "sql": sql, "output": str(output), "format": "jsonl"}},
        {"dag_id": "iox_persist"}], env=env)
    query, persisted = results
    assert persisted.get("state") == "success", (persisted.get("error"), persisted["log"][-5000:])
    [chunk] = live_chunks(catalog, persist_db)
    assert chunk["kind"] == "parquet" and chunk["row_count"] == 3
    # The persisted file is an object on the store, with the deduplicated rows (last write wins per key: at T0 the
    # third write's 12, as tests/airflow/test_airflow_persist.py tallies).
    after = store_objects(s3_warehouse)
    assert chunk["path"] in after and chunk["path"] not in before
    rows = sorted((r["time"], r["used"]) for r in read_store_parquet(s3_warehouse, chunk["path"]))
    assert rows == [(T0, 12.0), (T0 + 1, 1.0), (T0 + 2, 2.0)]

    # Nothing of the lake on the local disk, and no secret in what the runs left (the query's too, whatever its end).
    assert list(local_parquet_files(tmp_path, Path(airflow_env["AIRFLOW_HOME"]))) == []
    with catalog.engine.connect() as conn:
        records = [str(tuple(r)) for r in conn.execute(sa.text("SELECT * FROM iox_query_run"))]
    seen = xcom_and_log_text(airflow_env, results) + "\n".join(records)
    assert SECRET not in seen

    # (The query needs the executor's object-store read path, issue 32 item 4.)
    failed = [line[-400:] for line in query["log"].splitlines() if "error: " in line or "Error:" in line][-5:]
    assert query.get("state") == "success", (query.get("error"), query.get("tasks"), failed)
    assert [json.loads(line) for line in output.read_text().splitlines()] == [
        {"host": "a", "usage": 10.0}, {"host": "b", "usage": 2.0}, {"host": "b", "usage": 3.0}]
    [run] = query_runs(catalog, dag_id="iox_query", output=str(output))
    assert run["status"] == "success" and run["row_count"] == 3
