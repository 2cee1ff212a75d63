"""The executor reading an s3:// warehouse (`spark_jobs/store_read.py`) against the suite's real S3 server: the
requests a query costs, a store that goes away mid-query, files the store lacks or holds corrupt, and the same rows
a local warehouse gives for the virtual columns (chunk and write order) Spark's reader derives from file paths."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from common_support import live_chunks
from iox_planner.catalog.store import Catalog
from s3_support import CREDENTIALS
from spark_support import cli, load, run_jsonl

pytestmark = pytest.mark.spark

T0 = 1_704_067_200_000_000_000
HOUR = 3_600_000_000_000


def _files(count: int, table: str) -> list[dict[str, Any]]:
    """`count` Parquet chunks of `table`, an hour apart (no two overlap: nothing to merge)."""
    return [{"id": f"{table.upper()}{i}", "kind": "parquet",
             "lines": "\n".join(f"{table},t=h{j} v={i * 10 + j},w={j}i {T0 + i * HOUR + j}" for j in range(20))}
            for i in range(count)]


def _requests_during(s3_server: Any, work: Any) -> list[tuple[str, str, int]]:
    before = len(s3_server.requests())
    work()
    return s3_server.requests()[before:]


def test_a_query_costs_requests_per_file_read_never_per_file_stored(spark: Any, catalog: Catalog, db: str,
                                                                    s3_warehouse: str, s3_server: Any) -> None:
    from iox_planner.config import warehouse_root

    load(catalog, db, _files(1, "one") + _files(6, "many"))
    root = warehouse_root()
    keys = {c["path"]: f"/{root.base}/{c['path']}" for c in live_chunks(catalog, db)}

    def query(sql: str) -> list[tuple[str, str, int]]:
        return _requests_during(s3_server, lambda: run_jsonl(spark, catalog, db, sql))

    one = query("SELECT count(*) AS n, sum(v) AS s FROM one")
    # Objects the query has no business with: another database's files, leftovers, anything under the prefix.
    for i in range(120):
        root.put_bytes(b"PAR1 not ours PAR1", f"999/{i % 7}/{i}/{i:04d}.parquet")
    one_in_a_full_warehouse = query("SELECT count(*) AS n, sum(v) AS s FROM one")
    many = query("SELECT count(*) AS n, sum(v) AS s FROM many")

    for seen in (one, one_in_a_full_warehouse, many):
        assert seen and all(method == "GET" and status in (200, 206) for method, _, status in seen), seen
        # No listing, no HEAD: only ranged reads of the chunk files the catalog named.
        assert all(path.split("?")[0] in keys.values() for _, path, _ in seen), seen
    assert len(one) <= 3, one  # the footer, then the column chunks (pre-buffered into one read)
    assert len(one_in_a_full_warehouse) == len(one)
    many_files = {path.split("?")[0] for _, path, _ in many}
    assert len(many_files) == 6 and len(many) <= 6 * len(one), many


def test_the_store_cut_mid_query_is_the_retryable_error_in_one_paragraph(
        spark: Any, catalog: Catalog, db: str, s3_warehouse: str, s3_server: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from s3_support import CuttableProxy

    load(catalog, db, _files(3, "m"))
    proxy = CuttableProxy(s3_server.port)
    # The executors' Python workers take their environment from the session's executor environment (a worker of
    # another environment is started for it), as a cluster's executors take theirs from the deployment.
    environment = spark.sparkContext.environment  # type: ignore[attr-defined]
    monkeypatch.setitem(environment, "AWS_ENDPOINT_URL", proxy.endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    try:
        assert cli("query", "--db", db, "SELECT count(*) AS n FROM m", "--format", "jsonl").returncode == 0
        proxy.cut()
        result = cli("query", "--db", db, "SELECT count(*) AS n FROM m", "--format", "jsonl")
    finally:
        proxy.stop()
    assert result.returncode == 75, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "object store did not answer" in result.stderr and s3_warehouse in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_file_the_store_lacks_or_holds_corrupt_names_its_chunk(spark: Any, catalog: Catalog, db: str,
                                                                 s3_warehouse: str, damage: str) -> None:
    from iox_planner.config import warehouse_root

    load(catalog, db, [{"id": "HURT", "kind": "parquet", "lines": f"m,t=a v=1 {T0}"},
                       {"id": "FINE", "kind": "parquet", "lines": f"m,t=b v=2 {T0 + HOUR}"}])
    (chunk,) = [c for c in live_chunks(catalog, db) if c["label"] == "HURT"]
    root = warehouse_root()
    if damage == "missing":
        root.delete(chunk["path"])
    else:
        root.put_bytes(b"PAR1" + b"\0" * int(chunk["file_size"] - 8) + b"PAR1", chunk["path"])
    result = cli("query", "--db", db, "SELECT * FROM m", "--format", "jsonl")
    assert result.returncode == 3, result.stderr
    assert "HURT" in result.stderr and root.uri_of(chunk["path"]) in result.stderr, result.stderr
    assert ("missing" if damage == "missing" else "corrupt") in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.fixture
def store_and_local(tmp_path: Path, s3_server: Any) -> list[str]:
    """A local warehouse and an s3:// one, each fresh."""
    from s3_support import fresh_prefix

    return [str(tmp_path / "lake"), fresh_prefix()]


CHANGES = [
    {"id": "P1", "kind": "parquet", "lines": f"m,t=a v=1,w=1i {T0}\nm,t=b v=2 {T0}\nm,t=c v=3 {T0 + 5}"},
    {"id": "P2", "kind": "parquet", "lines": f"m,t=a v=10 {T0}\nm,t=d v=4 {T0 + 7}"},
    {"id": "I3", "kind": "ingester", "lines": f"m,t=b w=20i {T0}\nm,t=b w=21i {T0}\nm,t=e v=5 {T0 + 9}"},
]


@pytest.mark.parametrize("strategy", ["arrow", "shared", "node"])
def test_virtual_columns_and_pushdown_give_the_rows_a_local_warehouse_gives(
        spark: Any, catalog: Catalog, store_and_local: list[str], monkeypatch: pytest.MonkeyPatch,
        strategy: str) -> None:
    """Chunk order (which value wins), an ingester chunk's write positions (the later of two writes of one key)
    and time bounds pushed to the reader: computed per file by the store reader, from file paths by Spark's."""
    import uuid

    queries = [
        "SELECT t, v, w, time FROM m",
        "SELECT t, v FROM m WHERE time >= TIMESTAMP '2024-01-01 00:00:00.000001' AND v > 2",
        "SELECT count(*) AS n, max(w) AS w FROM m WHERE t IN ('a', 'b')",
    ]
    answers = []
    for where in store_and_local:
        monkeypatch.setenv("IOX_WAREHOUSE", where)
        db = f"t_{uuid.uuid4().hex[:12]}"
        load(catalog, db, CHANGES)
        answers.append([sorted(json.dumps(r, sort_keys=True) for r in run_jsonl(spark, catalog, db, sql,
                                                                                 strategy=strategy))
                        for sql in queries])
        answers[-1].append(sorted(json.dumps(r, sort_keys=True) for r in run_jsonl(
            spark, catalog, db, queries[0], optimize=False, strategy="node")))
    local, store = answers
    assert store == local
    assert json.loads(local[0][0]) == {"t": "a", "v": 10.0, "w": 1, "time": "2024-01-01T00:00:00Z"}
    assert {json.loads(r)["t"]: json.loads(r)["w"] for r in local[0]}["b"] == 21
