"""Outputs on an object store (issue 32, item 5): `iox-batch query --output s3://...` and a run's commit step
publishing under an `s3://` output root, against the suite's real S3 API server (moto's, over HTTP). What was
published is read back with boto3, a client of its own (not the code under test), and compared with the same
query written to a local path: the store leg must give the same bytes (text) or rows (Parquet)."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from iox_planner.catalog.store import Catalog
from s3_support import BUCKET, CREDENTIALS, fresh_prefix
from spark_support import cli, load

T0 = 1_704_067_200_000_000_000
LINES = f"m,t=a v=1.5,n=3i,ok=true {T0 + 5}\nm,t=b v=2.5,s=\"x,y\" {T0 + 1000}\nm,t=a v=9.5 {T0 + 5}"
SQL = "SELECT t, v, n, ok, s, time FROM m ORDER BY t"
SECRET = CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
MANIFEST = "_iox_manifest.json"


@pytest.fixture
def data(catalog: Catalog, db: str) -> str:
    load(catalog, db, [{"id": "F", "kind": "parquet", "order": 1, "lines": LINES.split("\n", 2)[0]},
                       {"id": "I", "kind": "ingester", "order": 2, "lines": "\n".join(LINES.split("\n")[1:])}])
    return db


@pytest.fixture
def out_root(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh output root on the store, set as IOX_OUTPUT_ROOT."""
    uri = f"{fresh_prefix()}/out"
    monkeypatch.setenv("IOX_OUTPUT_ROOT", uri)
    return uri


def s3() -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1",
                        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"], aws_secret_access_key=SECRET)


def key_of(uri: str) -> str:
    assert uri.startswith(f"s3://{BUCKET}/"), uri
    return uri[len(f"s3://{BUCKET}/"):]


def objects(uri: str) -> dict[str, bytes]:
    """Every object under the prefix `uri` (and at it), by key relative to it ("" for the object at `uri`)."""
    client, key = s3(), key_of(uri)
    found: dict[str, bytes] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=key):
        for item in page.get("Contents", []):
            if item["Key"].endswith("/") and item["Size"] == 0:
                continue  # a folder marker pyarrow's S3 filesystem leaves after a delete: no file a reader reads
            if item["Key"] == key or item["Key"].startswith(key + "/"):
                body = client.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
                found[item["Key"][len(key) + 1:] if item["Key"] != key else ""] = body
    return found


def put(uri: str, body: bytes) -> None:
    s3().put_object(Bucket=BUCKET, Key=key_of(uri), Body=body)


def publication_rows(uri: str) -> list[dict[str, Any]]:
    """A Parquet publication as a reader reads it: the manifest, then exactly the files it names."""
    found = objects(uri)
    manifest = json.loads(found[MANIFEST])
    rows: list[dict[str, Any]] = []
    for entry in manifest["files"]:
        data = found[entry["key"]]
        assert len(data) == entry["size"]
        rows += pq.read_table(io.BytesIO(data)).to_pylist()
    assert len(rows) == manifest["rows"]
    return rows


def records(catalog: Catalog, path: str) -> list[dict[str, Any]]:
    with catalog.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(sa.text(
            "SELECT path, kind, fingerprint, run FROM iox_output_publication WHERE path = :p ORDER BY id")
            .bindparams(p=path))]


def by_t(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["t"], str(r["time"])))


# --- the CLI: csv, jsonl, parquet, on the store as on a local disk -------------------------------------------------


@pytest.mark.spark
@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_query_output_on_the_store_matches_the_local_one(spark: Any, data: str, out_root: str, tmp_path: Path,
                                                         catalog: Catalog, s3_server: Any, fmt: str) -> None:
    name = f"r.{fmt}" if fmt != "parquet" else "r.parquet"
    local, remote = tmp_path / name, f"{out_root}/daily/{name}"
    assert cli("query", "--db", data, SQL, "--format", fmt, "--output", str(local)).returncode == 0
    seen = len(s3_server.requests())
    result = cli("query", "--db", data, SQL, "--format", fmt, "--output", remote)
    assert result.returncode == 0, result.stderr
    writes = [(m, p) for m, p, _ in s3_server.requests()[seen:] if m in ("PUT", "POST")]
    if fmt != "parquet":  # the whole text result in one request, at its final key
        assert writes == [("PUT", f"/{BUCKET}/{key_of(remote)}")], writes
    assert f"2 rows written to {remote} ({fmt})" in result.stdout
    if fmt == "parquet":
        assert by_t(publication_rows(remote)) == by_t(pq.read_table(local).to_pylist())
        manifest = json.loads(objects(remote)[MANIFEST])
        assert set(objects(remote)) == {MANIFEST, *[f["key"] for f in manifest["files"]]}
    else:
        assert objects(remote) == {"": local.read_bytes()}  # one object, byte for byte the local file
        if fmt == "csv":
            assert list(csv.reader(io.StringIO(local.read_text())))[0] == ["t", "v", "n", "ok", "s", "time"]
    # The catalog's record is the commit: the URI, its kind, nothing secret.
    (record,) = records(catalog, remote)
    assert record["kind"] == ("folder" if fmt == "parquet" else "file")
    assert SECRET not in json.dumps(record, default=str) and SECRET not in result.stdout + result.stderr
    # Rerunning replaces what iox-batch published there.
    again = cli("query", "--db", data, SQL, "--format", fmt, "--output", remote)
    assert again.returncode == 0, again.stderr
    assert len(records(catalog, remote)) == 2


@pytest.mark.spark
def test_parquet_publications_keep_the_one_before_and_delete_older(spark: Any, data: str, out_root: str) -> None:
    """Each publication is a fresh prefix named by the manifest, written last; a reader of the previous manifest
    still finds its files until the next publication, which deletes them."""
    remote = f"{out_root}/p"
    published = []
    for _ in range(3):
        assert cli("query", "--db", data, SQL, "--format", "parquet", "--output", remote).returncode == 0
        manifest = json.loads(objects(remote)[MANIFEST])
        published.append({f["key"] for f in manifest["files"]})
    first, second, third = published
    assert not first & second and not second & third
    assert set(objects(remote)) == {MANIFEST} | second | third
    assert json.loads(objects(remote)[MANIFEST])["previous"] == sorted(second)


@pytest.mark.spark
def test_an_empty_result_is_a_parquet_file_with_the_columns(spark: Any, data: str, out_root: str) -> None:
    remote = f"{out_root}/empty"
    result = cli("query", "--db", data, "SELECT t, v FROM m WHERE v > 100", "--format", "parquet", "--output", remote)
    assert result.returncode == 0, result.stderr
    manifest = json.loads(objects(remote)[MANIFEST])
    assert manifest["rows"] == 0 and len(manifest["files"]) == 1
    table = pq.read_table(io.BytesIO(objects(remote)[manifest["files"][0]["key"]]))
    assert table.column_names == ["t", "v"] and table.num_rows == 0


# --- refusals: before planning, one paragraph, nothing written, no secret echoed ------------------------------------


def _refusals(root: str) -> list[tuple[str, str, dict[str, str]]]:
    other = f"s3://{BUCKET}/elsewhere/r.csv"
    return [
        (other, "lies under no output root on an object store", {}),
        (f"{root}/r.csv", "lies under no output root on an object store", {"IOX_OUTPUT_ROOT": "/tmp"}),
        (f"s3://iox-test-key:{SECRET}@{BUCKET}/{key_of(root)}/r.csv", "carries credentials", {}),
        (f"s3://iox-test-key:{SECRET[:8]}/{SECRET[8:]}@{BUCKET}/{key_of(root)}/r.csv", "carries credentials", {}),
        (f"{root}/wh/r.csv", "lies inside the warehouse", {"IOX_WAREHOUSE": f"{root}/wh"}),
        (f"{root}/a", "contains the warehouse", {"IOX_WAREHOUSE": f"{root}/a/wh"}),
        (f"{root}/../r.csv", "is not allowed", {}),
        (f"{root}/.hidden.csv", "is not allowed", {}),
        (f"{root}/x/{MANIFEST}", "is not allowed", {}),
        (f"{root}/a b.csv", "is not allowed", {}),
        (f"{root}//r.csv", "empty segment", {}),
        (f"{root}/r.csv?versionId=1", "query or a fragment", {}),
        (f"s3://{BUCKET}:9000/{key_of(root)}/r.csv", "names a port", {}),
        (f"s3:/{BUCKET}/{key_of(root)}/r.csv", "s3://BUCKET/PREFIX", {}),
        (f"gs://{BUCKET}/{key_of(root)}/r.csv", "is not a store iox-batch reads", {}),
        (root, "lies under no output root", {}),  # the root itself is no output
    ]


@pytest.mark.parametrize("case", range(16))
def test_store_outputs_are_refused_outside_the_rules(case: int, out_root: str, catalog: Catalog,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    output, needle, env = _refusals(out_root)[case]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = objects(f"s3://{BUCKET}/{key_of(out_root).split('/')[0]}")
    result = cli("query", "--db", "nodb", "SELECT 1", "--format", "csv", "--output", output)
    assert result.returncode == 2, (output, result.stderr)
    assert result.stderr.startswith("error: ") and "\n" not in result.stderr.strip(), result.stderr
    assert needle in result.stderr, (output, result.stderr)
    assert SECRET not in result.stderr and SECRET[8:] not in result.stderr
    assert objects(f"s3://{BUCKET}/{key_of(out_root).split('/')[0]}") == before


# --- only iox-batch's own publication is replaced (the catalog's record says so) ------------------------------------


def test_only_our_own_publication_is_replaced(out_root: str, catalog: Catalog) -> None:
    from iox_planner.catalog.publications import CatalogLedger
    from iox_planner.objectstore import parse_root
    from iox_planner.output.publish import check_destination, publishing_as
    from iox_planner.output.store import publish_file, staged_folder
    import pyarrow as pa

    theirs, ours, folder = f"{out_root}/theirs.csv", f"{out_root}/ours.csv", f"{out_root}/folder"
    put(theirs, b"hand-written\n")
    with publishing_as("store test", CatalogLedger(catalog)):
        with pytest.raises(Exception, match="not written by iox-batch"):
            check_destination(theirs, folder=False)
        publish_file(parse_root(ours), b"a\n")
        publish_file(parse_root(ours), b"b\n")  # ours: replaced
        assert objects(ours) == {"": b"b\n"}
        put(ours, b"b\nsomeone else's\n")
        with pytest.raises(Exception, match="changed since"):
            publish_file(parse_root(ours), b"c\n")
        assert objects(ours) == {"": b"b\nsomeone else's\n"}
        # A file where a folder goes, a folder where a file goes: refused, nothing deleted.
        with pytest.raises(Exception, match="an object is there"):
            check_destination(theirs, folder=True)
        with staged_folder(parse_root(folder)) as stage:
            stage.put_table(pa.table({"x": [1]}))
        with pytest.raises(Exception, match="objects lie under it"):
            check_destination(folder, folder=False)
        # Something of someone else's inside our folder: the folder is no longer only ours.
        put(f"{folder}/notes.txt", b"mine")
        with pytest.raises(Exception, match="did not publish"):
            check_destination(folder, folder=True)
        put(f"{folder}/notes.txt", b"mine")
    assert objects(theirs) == {"": b"hand-written\n"} and objects(f"{folder}/notes.txt") == {"": b"mine"}
    # A forged manifest (a query can write any bytes to a key it may write) matches no record.
    forged = f"{out_root}/forged"
    put(f"{forged}/{MANIFEST}", json.dumps({"files": [], "previous": []}).encode())
    with publishing_as("store test", CatalogLedger(catalog)):
        with pytest.raises(Exception, match="not written by iox-batch"):
            check_destination(forged, folder=True)


# --- a run's commit step publishes under an s3:// output root -------------------------------------------------------


@pytest.mark.spark
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_triggered_run_commits_to_a_store_output_root(spark: Any, data: str, out_root: str, catalog: Catalog,
                                                        tmp_path: Path, fmt: str) -> None:
    from iox_planner.catalog import runs
    from iox_planner.runs.commit import commit
    from iox_planner.runs.planning import plan
    from iox_planner.runs.request import QueryRequest
    from iox_planner.runs.settings import RunSettings
    from iox_planner.runs.staging import RunIdentity
    from spark_jobs.launch import InProcessLauncher

    name = "hourly/r.jsonl" if fmt == "jsonl" else "hourly/r.parquet"
    settings = RunSettings.from_env()
    request = QueryRequest.from_params({"db": data, "sql": SQL, "output": name, "format": fmt}, settings)
    remote = f"{out_root}/{name}"
    assert request.as_params()["output"] == remote
    local = tmp_path / Path(name).name
    assert cli("query", "--db", data, SQL, "--format", fmt, "--output", str(local)).returncode == 0
    for attempt in range(2):  # the second run replaces the first's publication
        identity = RunIdentity("iox_query", f"store-{fmt}-{attempt}-{data}")
        outcome = plan(request, identity, settings)
        assert SECRET not in json.dumps(outcome.handle()) and SECRET not in json.dumps(outcome.summary)
        for job in outcome.jobs:
            InProcessLauncher().run(job)
        if outcome.merge is not None:
            InProcessLauncher().run(outcome.merge)
        done = commit(request, identity, outcome.handle())
        assert done.output == remote and done.rows == 2
        run = runs.get_run(catalog, done.query_run)
        assert run is not None and run["status"] == "success" and SECRET not in json.dumps(run, default=str)
        assert not Path(outcome.staging).exists()
    if fmt == "jsonl":
        assert objects(remote) == {"": local.read_bytes()}
    else:
        assert by_t(publication_rows(remote)) == by_t(pq.read_table(local).to_pylist())
    assert [r["run"] for r in records(catalog, remote)] == [f"iox_query/store-{fmt}-{k}-{data}" for k in range(2)]


def test_a_relative_run_output_under_a_store_root_is_checked_as_a_key(out_root: str) -> None:
    from iox_planner.errors import BadInputError
    from iox_planner.runs.request import QueryRequest
    from iox_planner.runs.settings import RunSettings

    settings = RunSettings.from_env()
    params = {"db": "d", "sql": "SELECT 1", "format": "csv"}
    assert QueryRequest.from_params({**params, "output": "a/b.csv"}, settings).check_output(settings).uri == \
        f"{out_root}/a/b.csv"
    for bad, needle in (("../b.csv", "not allowed"), ("a/.b.csv", "not allowed"), ("a/b.jsonl", "must end in"),
                        (f"s3://{BUCKET}/other/b.csv", "no output root"), ("/tmp/x.csv", "outside the output roots")):
        with pytest.raises(BadInputError, match=needle):
            QueryRequest.from_params({**params, "output": bad}, settings)


def test_dataclasses_of_runs_carry_the_uri_not_a_path(out_root: str) -> None:
    """A store key never becomes a local path on the way (`Path("s3://b/k")` would be the folder `s3:/b/k`)."""
    from iox_planner.output import OutputFormat
    from iox_planner.spark.jobs import PlanJob

    from iox_planner.objectstore import parse_root

    for warehouse in (parse_root("/tmp/wh"), parse_root(f"{out_root}-warehouse")):
        job = PlanJob(Path("/tmp/plan.json"), parse_root(f"{out_root}/r.csv"), OutputFormat.CSV, 60,
                      warehouse=warehouse)
        again = PlanJob.parse(job.args())
        assert again == dataclasses.replace(job) and again.output == parse_root(f"{out_root}/r.csv")
        assert again.warehouse == warehouse


@pytest.mark.spark
def test_a_materialized_interval_with_register_as_commits_to_a_store_output_root(
        spark: Any, data: str, out_root: str, catalog: Catalog) -> None:
    """The commit step's other path: the rows registered as a catalog table and the requested format written from
    them (a Parquet publication of one part), in the one publishing transaction."""
    from iox_planner.catalog import runs
    from iox_planner.objectstore import parse_root
    from iox_planner.output import OutputFormat
    from iox_planner.runs.commit import commit
    from iox_planner.runs.planning import plan
    from iox_planner.runs.request import QueryRequest, RegisterAs
    from iox_planner.runs.settings import RunSettings
    from iox_planner.runs.staging import RunIdentity
    from spark_jobs.launch import InProcessLauncher

    day = 86_400 * 10**9
    remote = f"{out_root}/mat/2024-01-01.parquet"
    request = QueryRequest(db=data, sql="SELECT t, max(v) AS vmax, date_trunc('day', time) AS time FROM m "
                                        "GROUP BY t, date_trunc('day', time)",
                           output=parse_root(remote), format=OutputFormat.PARQUET, time_start=T0,
                           time_end=T0 + day, definition="store_daily", register_as=RegisterAs("m_daily", ("t",)))
    identity = RunIdentity("materialize_store_daily", f"store-{data}")
    outcome = plan(request, identity, RunSettings.from_env())
    for job in outcome.jobs:
        InProcessLauncher().run(job)
    done = commit(request, identity, outcome.handle())
    assert done.output == remote and done.rows == 2 and done.registered is not None
    assert done.registered["table"] == "m_daily" and done.registered["rows"] == 2
    rows = publication_rows(remote)
    assert sorted((r["t"], r["vmax"]) for r in rows) == [("a", 9.5), ("b", 2.5)]
    run = runs.get_run(catalog, done.query_run)
    assert run is not None and run["status"] == "success"
    (record,) = records(catalog, remote)
    assert record["kind"] == "folder" and record["run"] == identity.holder


def test_run_settings_take_store_roots_beside_local_ones(tmp_path: Path) -> None:
    from iox_planner.errors import BadInputError
    from iox_planner.objectstore import Root
    from iox_planner.runs.settings import RunSettings

    env = {"IOX_OUTPUT_ROOTS": f"{tmp_path}:s3://{BUCKET}/runs/out:s3://{BUCKET}/other"}
    settings = RunSettings.from_env(env)
    assert settings.output_root == tmp_path.resolve()  # the first listed takes relative outputs
    assert settings.output_roots == (tmp_path.resolve(), Root(f"s3://{BUCKET}/runs/out"), Root(f"s3://{BUCKET}/other"))
    assert settings.root_of(Root(f"s3://{BUCKET}/runs/out/x.csv")) == Root(f"s3://{BUCKET}/runs/out")
    # A prefix is not a folder boundary by text alone: `out2` is not under `out`.
    assert settings.root_of(Root(f"s3://{BUCKET}/runs/out2/x.csv")) is None
    assert settings.root_of(Root(f"s3://{BUCKET}/runs/out")) is None  # the root itself is no output
    assert settings.root_of(tmp_path / "x.csv") == tmp_path.resolve()
    with pytest.raises(BadInputError, match="whole bucket"):
        RunSettings(output_root=Root(f"s3://{BUCKET}"))
    with pytest.raises(BadInputError, match="not allowed"):
        RunSettings.from_env({"IOX_OUTPUT_ROOTS": f"{tmp_path}:s3:/{BUCKET}/x"})
