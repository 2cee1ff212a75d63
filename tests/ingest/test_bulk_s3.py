"""The bulk load (`iox-batch write --spark`) with an `s3://` warehouse or an `s3://` input, against the real S3 API
server of the suite (`tests/s3_support.py`) and real Spark: a load into the store registers the same chunks (the
same rows, file by file, in the same orders) as the same load into a local warehouse, and its chunks merge to the
test's own tally of the lines (what plain writes of the files mean), with no Parquet file on the local disk; an
`s3://` input prefix loads exactly as a local folder of the same files, with the same errors; the store cut
mid-load ends in the retryable error with nothing registered; a load killed at its kill points leaves only objects
no catalog row names, under its own folder. CI samples the cases (`common_support.sampled`), IOX_TEST_ALL=1 runs
them all."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from common_support import catalog_counts, live_chunks, sampled
from iox_planner import storage
from iox_planner.catalog.store import Catalog
from iox_planner.errors import BadInputError, StoreUnavailableError
from iox_planner.ingest import bulk
from iox_planner.maintenance import sweeps
from iox_planner.maintenance.persist import persist
from iox_planner.objectstore import Root, local_root, parse_root
from iox_planner.spark.jobs import BulkLoadJob
from s3_support import CuttableProxy, fresh_prefix, local_parquet_files
from spark_jobs.bulk_job import spark_range_runner
from test_bulk_load import Tally, make_lines

pytestmark = pytest.mark.spark

TARGET = 4096
"""Bytes per range: every file is cut several times."""


def write_inputs(folder: Path, seed: int, tally: Tally) -> list[Path]:
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    names = ("a.lp", "b.lp", "c.lp")
    for name in names:
        end = "" if name == "c.lp" else "\n"  # the last file ends without a LF
        (folder / name).write_text("\n".join(make_lines(rng, 150, tally)) + end)
    (folder / ".hidden.lp").write_text("not line protocol\n")  # skipped, else it would fail the load
    (folder / "sub").mkdir()
    (folder / "sub" / "x.lp").write_text("not line protocol either\n")  # not entered
    return [folder / n for n in names]


def upload(folder: Path, prefix: Root) -> None:
    """`folder`'s files (and its subfolder's) as objects under `prefix`."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            prefix.put_bytes(path.read_bytes(), str(path.relative_to(folder)))


def read_object(root: Root, rel: str) -> pa.Table:
    return pq.read_table(pa.BufferReader(root.read_bytes(rel)))


def chunk_contents(catalog: Catalog, db: str, root: Root) -> list[tuple[Any, ...]]:
    """Each live chunk in chunk order: its table, partition, counts, times and the rows of its file (read straight
    from the file or object: no planner, no Spark)."""
    return [(c["kind"], c["table_name"], c["partition_key"], c["row_count"], c["min_time"], c["max_time"],
             read_object(root, c["path"]).to_pylist()) for c in live_chunks(catalog, db)]


def merged(contents: Sequence[tuple[Any, ...]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """What the chunks mean (PRODUCT.md's dedup, written here again): per (table, tags, time), each field its last
    non-null value, chunks in order, rows of a chunk in file order."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for _, table, _, _, _, _, rows in contents:
        for row in rows:
            tags = tuple(sorted((k, v) for k, v in row.items() if k in ("host", "region") and v is not None))
            fields = out.setdefault((table, tags, row["time"]), {})
            fields.update({k: v for k, v in row.items()
                           if k not in ("host", "region", "time") and not k.startswith("__") and v is not None})
    return out


def tally_rows(tally: Tally) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {key: dict(fields) for key, fields in tally.rows.items()}


def named_paths(catalog: Catalog) -> set[str]:
    with catalog.engine.connect() as conn:
        return {p for t in ("iox_parquet_file", "iox_ingester_chunk")
                for p in conn.execute(sa.text(f"SELECT path FROM {t}")).scalars()}


def local_places(base: Path) -> list[Path]:
    tmp = Path(tempfile.gettempdir())
    return [base, *tmp.glob("spark-*"), *tmp.glob("iox-*"), *tmp.glob("blockmgr-*")]


def test_a_load_into_the_store_equals_the_local_load_and_the_tally(
        spark: Any, catalog: Catalog, db: str, tmp_path: Path, s3_warehouse: str,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    tally = Tally()
    write_inputs(tmp_path / "in", 21, tally)
    store, local = parse_root(s3_warehouse), local_root(tmp_path / "wh")
    disk_before = set(local_parquet_files(*local_places(tmp_path_factory.getbasetemp())))
    done = bulk.bulk_write(catalog, db, str(tmp_path / "in"), spark_range_runner(spark), target_bytes=TARGET,
                           warehouse=store)
    assert set(local_parquet_files(*local_places(tmp_path_factory.getbasetemp()))) == disk_before, \
        "a load into the store left a Parquet file on the local disk"
    # The local leg runs the same task code in this process: Spark's part (the tasks reaching the store from its
    # workers) is the store leg's.
    bulk.bulk_write(catalog, f"{db}_local", str(tmp_path / "in"), bulk.local_runner, target_bytes=TARGET,
                    warehouse=local)
    on_store = chunk_contents(catalog, db, store)
    assert len(done.chunks) == len(on_store) > 3 * 2 * 2, "ranges were not cut"
    assert on_store == chunk_contents(catalog, f"{db}_local", local)
    assert merged(on_store) == tally_rows(tally)
    # The rows name the keys the tasks put, in the load's own folder; nothing else is left there.
    paths = [c["path"] for c in live_chunks(catalog, db)]
    assert all(storage.BULK_CHUNK_PATH.fullmatch(p) for p in paths), paths
    assert {o.rel for o in store.list()} == set(paths)
    assert not (tmp_path / "wh" / storage.BULK_STAGING).exists()
    assert not (tmp_path / "wh" / storage.BULK_LOADS).exists()
    # Persist reads the load's chunks where they lie and writes the same rows into the usual layout.
    persist(catalog, db, warehouse=store)
    persisted = chunk_contents(catalog, db, store)
    assert persisted and all(c[0] == "parquet" for c in persisted)
    assert all(storage.CHUNK_PATH.fullmatch(c["path"]) for c in live_chunks(catalog, db))
    assert merged(persisted) == tally_rows(tally)


def test_a_loads_keys_on_the_store_are_its_own_and_no_usual_chunk_paths() -> None:
    load = storage.new_load_id()
    key = f"{storage.bulk_load_folder(load)}/{storage.bulk_chunk_name()}"
    assert storage.BULK_CHUNK_PATH.fullmatch(key) and not storage.CHUNK_PATH.fullmatch(key)
    assert not key.startswith(f"{storage.BULK_STAGING}/")  # never in a local staging folder a sweep removes whole
    assert storage.object_id(key) != storage.object_id(f"{storage.bulk_load_folder(load)}/{storage.bulk_chunk_name()}")
    assert not storage.BULK_CHUNK_PATH.fullmatch(storage.chunk_path(1, 2, 3))


def test_an_s3_input_prefix_loads_as_a_local_folder_of_the_same_files(spark: Any, catalog: Catalog, db: str,
                                                                      tmp_path: Path) -> None:
    tally = Tally()
    files = write_inputs(tmp_path / "in", 22, tally)
    prefix = parse_root(fresh_prefix()).child("in")
    upload(tmp_path / "in", prefix)
    listed = bulk.input_files(prefix.uri)
    assert [f.name for f in listed] == [f"{prefix.uri}/{p.name}" for p in files]  # hidden and "sub/" skipped
    assert [(f.size, f.ino) for f in listed] == [(p.stat().st_size, 0) for p in files]
    warehouse = local_root(tmp_path / "wh")
    bulk.bulk_write(catalog, db, prefix.uri, spark_range_runner(spark), target_bytes=TARGET, warehouse=warehouse)
    bulk.bulk_write(catalog, f"{db}_local", str(tmp_path / "in"), bulk.local_runner, target_bytes=TARGET,
                    warehouse=warehouse)
    from_store = chunk_contents(catalog, db, warehouse)
    assert from_store == chunk_contents(catalog, f"{db}_local", warehouse)
    assert merged(from_store) == tally_rows(tally)
    # One file on its own, from the store: the same as the local file.
    bulk.bulk_write(catalog, f"{db}_one", prefix.uri_of("b.lp"), bulk.local_runner, target_bytes=TARGET,
                    warehouse=warehouse)
    bulk.bulk_write(catalog, f"{db}_one_local", str(files[1]), bulk.local_runner, target_bytes=TARGET,
                    warehouse=warehouse)
    assert chunk_contents(catalog, f"{db}_one", warehouse) == chunk_contents(catalog, f"{db}_one_local", warehouse)


def test_an_s3_input_fails_with_the_local_folders_error(catalog: Catalog, db: str, tmp_path: Path) -> None:
    rng = random.Random(9)
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.lp").write_text("\n".join(make_lines(rng, 100, Tally())) + "\n")
    lines = make_lines(rng, 200, Tally())
    lines[150] = "cpu,host=h1 usage=abc 1704153590000000000"
    (folder / "b.lp").write_text("\n".join(lines) + "\n")
    prefix = parse_root(fresh_prefix()).child("in")
    upload(folder, prefix)
    warehouse = local_root(tmp_path / "wh")
    before = catalog_counts(catalog)
    errors = []
    for source in (prefix.uri, str(folder)):
        with pytest.raises(BadInputError) as raised:
            bulk.bulk_write(catalog, db, source, bulk.local_runner, target_bytes=TARGET, warehouse=warehouse)
        errors.append(str(raised.value).replace(source, "SOURCE"))
    assert errors[0] == errors[1] and "bad line" in errors[0], errors
    assert catalog_counts(catalog) == before


def test_s3_inputs_are_refused_where_they_must_be(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "drop").mkdir(parents=True)
    # A triggered load's root is a local folder: a URI param is refused before anything reads it.
    for hostile in (fresh_prefix(), "s3://other-bucket/x", "S3://x/y", "file:///etc", "http://169.254.169.254/"):
        with pytest.raises(BadInputError, match="is a URI"):
            bulk.resolve_source(hostile, root)
        with pytest.raises(BadInputError, match="is a URI"):
            bulk.input_files(hostile, root)
    with pytest.raises(BadInputError, match="no such object or prefix"):
        bulk.input_files(fresh_prefix() + "/nothing")
    # An object whose name is outside the allow-list of keys is refused by name, never read or quoted raw.
    prefix = parse_root(fresh_prefix())
    prefix.filesystem().open_output_stream(prefix.path("a.lp")).close()
    with prefix.filesystem().open_output_stream(prefix.base + "/b c;.lp") as out:
        out.write(b"m f=1 1\n")
    with pytest.raises(BadInputError, match="whose name is not one a bulk load reads"):
        bulk.input_files(prefix.uri)
    # A URI with credentials never reaches a job's argv, and the error does not repeat it.
    with pytest.raises(BadInputError) as raised:
        BulkLoadJob("db1", "s3://AKIAEXAMPLE:verysecret@iox-test-lake/in")
    assert "verysecret" not in str(raised.value) and "credentials" in str(raised.value)
    with pytest.raises(BadInputError, match="is refused"):
        BulkLoadJob("db1", "s3://iox-test-lake/../in")


@pytest.mark.parametrize("side", sampled(["warehouse", "input"], 1))
def test_the_store_cut_mid_load_is_the_retryable_error_and_registers_nothing(
        catalog: Catalog, db: str, tmp_path: Path, s3_server: Any, monkeypatch: pytest.MonkeyPatch,
        side: str) -> None:
    proxy = CuttableProxy(s3_server.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)  # this process's filesystem goes through the proxy
    write_inputs(tmp_path / "in", 23, Tally())
    if side == "warehouse":
        warehouse, source = parse_root(fresh_prefix()), str(tmp_path / "in")
    else:
        warehouse, source = local_root(tmp_path / "wh"), parse_root(fresh_prefix()).child("in").uri
        upload(tmp_path / "in", parse_root(source))
    before = catalog_counts(catalog)

    def cut_after_the_first_range(ranges: Sequence[bulk.Range], params: bulk.TaskParams) -> list[bulk.RangeResult]:
        assert len(ranges) > 1
        first = bulk.parse_range(ranges[0], params)
        proxy.cut()
        return [first, *(bulk.parse_range(r, params) for r in ranges[1:])]

    try:
        with pytest.raises(StoreUnavailableError) as raised:
            bulk.bulk_write(catalog, db, source, cut_after_the_first_range, target_bytes=TARGET, warehouse=warehouse)
        assert raised.value.exit_code == 75 and "the object store did not answer" in str(raised.value)
        assert "SECRET" not in str(raised.value).upper()
        assert catalog_counts(catalog) == before, "a cut load registered something"
    finally:
        proxy.restore()
    if side == "warehouse":
        left = {o.rel for o in warehouse.list()}
        assert left, "the first range put nothing before the cut"
        assert all(storage.BULK_CHUNK_PATH.fullmatch(p) for p in left) and not left & named_paths(catalog), left
    proxy.stop()


KILL_SCRIPT = """
import sys
from iox_planner.catalog.store import Catalog
from iox_planner.ingest import bulk

bulk.bulk_write(Catalog(), sys.argv[1], sys.argv[2], bulk.local_runner, target_bytes=4096)
print("finished")
"""


@pytest.mark.parametrize("point", sampled(["bulk.before_commit", "bulk.after_tasks"], 1))
def test_a_load_killed_on_the_store_leaves_only_unreferenced_objects(catalog: Catalog, db: str, tmp_path: Path,
                                                                    s3_warehouse: str, point: str) -> None:
    write_inputs(tmp_path / "in", 24, Tally())
    before = catalog_counts(catalog)
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, db, str(tmp_path / "in")],
                          env={**os.environ, "IOX_FAULT_KILL_AT": point}, capture_output=True, text=True,
                          timeout=300, start_new_session=True)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr[-2000:]
    assert catalog_counts(catalog) == before, "a killed load registered something"
    left = {o.rel for o in parse_root(s3_warehouse).list()}
    assert left, f"nothing was put before {point}"
    assert all(storage.BULK_CHUNK_PATH.fullmatch(p) for p in left) and not left & named_paths(catalog), left
    assert len({p.split("/")[1] for p in left}) == 1, "the load's objects are not under its one folder"
    # The grace-period sweep keeps them while they are young, then removes exactly them.
    root = parse_root(s3_warehouse)
    assert sweeps.sweep_bulk_loads(catalog, root, 3600) == []
    assert {o.rel for o in root.list()} == left
    assert sweeps.sweep_bulk_loads(catalog, root, 0) == [next(iter(left)).split("/")[1]]
    assert list(root.list()) == []
