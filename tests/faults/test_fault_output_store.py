"""The object store goes away in the middle of a publication (issue 32, item 5): a run's commit step (in a process of
its own, as the DAGs' commit task) and `iox-batch query --output s3://...` stop at the named point just before
their object or manifest is put, the store is cut there (a TCP proxy in front of the suite's real S3 server closes
every connection and refuses new ones), and they go on. Each must end in the retryable error (exit 75, one
paragraph, no secret), with no partial output visible: nothing at the key, or the previous publication whole and
still the one the catalog vouches for; once the store is back, the next run publishes as if nothing happened."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from common_support import sampled
from fault_support import IOX, FaultWorld, PausedCommand
from iox_planner.ingest.write import write_line_protocol
from s3_support import BUCKET, CREDENTIALS, CuttableProxy, fresh_prefix

pytestmark = [pytest.mark.spark]

DRIVER = Path(__file__).resolve().parent / "commit_driver.py"
SECRET = CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
T0 = 1_704_067_200_000_000_000
SQL = "SELECT k, v, time FROM m ORDER BY k"
MANIFEST = "_iox_manifest.json"


def _objects(uri: str) -> dict[str, bytes]:
    """What lies at and under `uri`, read with a client of its own (boto3) straight from the server."""
    import boto3

    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"], aws_secret_access_key=SECRET)
    key = uri[len(f"s3://{BUCKET}/"):]
    found = {}
    for item in client.list_objects_v2(Bucket=BUCKET, Prefix=key).get("Contents", []):
        if item["Key"].endswith("/") and item["Size"] == 0:
            continue  # a folder marker pyarrow leaves after a delete: no file a reader reads
        if item["Key"] == key or item["Key"].startswith(key + "/"):
            body = client.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
            found[item["Key"][len(key) + 1:] if item["Key"] != key else ""] = body
    return found


def _visible(uri: str, fmt: str) -> Any:
    """What a reader sees at `uri`: the object's bytes, or the rows of the files the manifest names (None:
    nothing published)."""
    found = _objects(uri)
    if fmt != "parquet":
        return found.get("")
    if MANIFEST not in found:
        return None
    rows = []
    for entry in json.loads(found[MANIFEST])["files"]:
        rows += pq.read_table(io.BytesIO(found[entry["key"]])).to_pylist()
    return sorted(rows, key=lambda r: r["k"])


def _records(fw: FaultWorld, uri: str) -> list[str]:
    with fw.catalog.engine.connect() as conn:
        return list(conn.execute(sa.text("SELECT fingerprint FROM iox_output_publication WHERE path = :p "
                                         "ORDER BY id").bindparams(p=uri)).scalars())


def _assert_retryable(outcome: Any) -> None:
    """The store's retryable error: exit 75, one paragraph naming the store, no secret anywhere."""
    assert outcome.returncode == 75, outcome.stderr[-2000:]
    stderr = outcome.stderr.strip()
    assert stderr.startswith("error: ") and "\n" not in stderr and "object store did not answer" in stderr, stderr
    assert SECRET not in outcome.stderr + outcome.stdout


class StoreRun:
    """Triggered runs of one query writing one key under an `s3://` output root: plan and Spark job here, the
    commit in a process of its own (tests/faults/commit_driver.py)."""

    def __init__(self, fw: FaultWorld, root: str, fmt: str) -> None:
        self.fw, self.fmt, self.runs = fw, fmt, 0
        self.db = f"store_{uuid.uuid4().hex[:8]}"
        self.name = f"r.{fmt}" if fmt != "parquet" else "r"
        self.uri = f"{root}/{self.name}"
        self.root = root

    def write(self, value: float) -> None:
        write_line_protocol(self.fw.catalog, self.db, f"m,k=a v={value} {T0}\nm,k=b v={value + 1} {T0 + 1}\n")

    def prepare(self) -> dict[str, Any]:
        from iox_planner.runs.planning import plan
        from iox_planner.runs.request import QueryRequest
        from iox_planner.runs.settings import RunSettings
        from iox_planner.runs.staging import RunIdentity
        from spark_jobs.launch import InProcessLauncher

        self.runs += 1
        settings = RunSettings.from_env()
        request = QueryRequest.from_params({"db": self.db, "sql": SQL, "output": self.name, "format": self.fmt},
                                           settings)
        identity = RunIdentity("iox_query", f"store-fault-{self.db}-{self.runs}")
        outcome = plan(request, identity, settings)
        (job,) = outcome.jobs
        InProcessLauncher().run(dataclasses.replace(job, warehouse=self.fw.warehouse))
        return {"request": {"db": self.db, "sql": SQL, "output": self.uri, "format": self.fmt, "time_start": None,
                            "time_end": None, "definition": None},
                "dag_id": identity.dag_id, "run_id": identity.run_id, "handle": outcome.handle()}

    def env(self, endpoint: str, **extra: str) -> dict[str, str]:
        return self.fw.env(AWS_ENDPOINT_URL=endpoint, IOX_OUTPUT_ROOT=self.root, **extra)


@pytest.mark.parametrize("fmt, point", sampled([("jsonl", "publish.store_before_put"),
                                                ("csv", "publish.store_before_put"),
                                                ("parquet", "publish.store_before_manifest")], 2))
def test_store_cut_mid_commit_is_retryable_and_shows_no_partial_output(
        fw: FaultWorld, spark: object, s3_server: Any, monkeypatch: pytest.MonkeyPatch, fmt: str,
        point: str) -> None:
    root = f"{fresh_prefix()}/out"
    monkeypatch.setenv("IOX_OUTPUT_ROOT", root)
    run = StoreRun(fw, root, fmt)
    run.write(1.0)
    proxy = CuttableProxy(s3_server.port)
    try:
        # The first publication, through the proxy: the one a failed second must leave whole.
        first = PausedCommand([sys.executable, str(DRIVER), json.dumps(run.prepare())], run.env(proxy.endpoint))
        done = first.finish()
        assert done.returncode == 0, done.stderr[-2000:]
        before, vouched = _visible(run.uri, fmt), _records(fw, run.uri)
        assert before is not None and len(vouched) == 1
        run.write(5.0)
        spec = run.prepare()
        cmd = PausedCommand([sys.executable, str(DRIVER), json.dumps(spec)],
                            run.env(proxy.endpoint, IOX_FAULT_PAUSE_AT=point))
        assert cmd.wait_stopped(), "the commit ended before its pause point"
        proxy.cut()
        cmd.resume()
        _assert_retryable(cmd.finish())
        # No partial output: the previous publication, whole, still the newest the catalog vouches for.
        assert _visible(run.uri, fmt) == before and _records(fw, run.uri) == vouched
        proxy.restore()
        again = PausedCommand([sys.executable, str(DRIVER), json.dumps(run.prepare())], run.env(proxy.endpoint))
        done = again.finish()
        assert done.returncode == 0, done.stderr[-2000:]
        after = _visible(run.uri, fmt)
        assert after != before and len(_records(fw, run.uri)) == 2
        if fmt == "parquet":
            assert [r["v"] for r in after] == [5.0, 6.0]
        with fw.catalog.engine.connect() as conn:
            stored = " ".join(str(v) for v in conn.execute(sa.text(
                "SELECT path || fingerprint || run FROM iox_output_publication")).scalars())
            params = " ".join(str(v) for v in conn.execute(sa.text(
                "SELECT coalesce(params::text, '') || coalesce(error, '') FROM iox_query_run")).scalars())
        assert SECRET not in stored and SECRET not in params
    finally:
        proxy.stop()


# The store cut while the Spark workers write the Parquet parts (their own connections: they fail in the workers),
# just before the manifest (the driver's put), and just before a text result's one put.
@pytest.mark.parametrize("fmt, point", sampled([("parquet", "publish.before_write"),
                                                ("csv", "publish.store_before_put"),
                                                ("parquet", "publish.store_before_manifest")], 2))
def test_store_cut_mid_cli_query_publishes_nothing(fw: FaultWorld, s3_server: Any, fmt: str, point: str) -> None:
    """`iox-batch query --output s3://...` in a process of its own (its own Spark: Parquet parts are written by
    its Python workers through the proxy too), the store cut just before the object or the manifest."""
    root = f"{fresh_prefix()}/out"
    run = StoreRun(fw, root, fmt)
    run.write(1.0)
    proxy = CuttableProxy(s3_server.port)
    try:
        cmd = PausedCommand([IOX, "query", "--db", run.db, SQL, "--format", fmt, "--output", run.uri],
                            run.env(proxy.endpoint, IOX_FAULT_PAUSE_AT=point, IOX_SPARK_MASTER="local[1]"))
        assert cmd.wait_stopped(), "the query ended before its pause point"
        proxy.cut()
        cmd.resume()
        _assert_retryable(cmd.finish())
        assert _visible(run.uri, fmt) is None and _records(fw, run.uri) == []
    finally:
        proxy.stop()
