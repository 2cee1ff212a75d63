"""`objectstore.Root` on a local folder and on a real S3 API server (moto's standalone server on loopback): the
same operations give the same answers; URIs that carry credentials or are not S3 are refused without showing a
secret; a store that goes away is the retryable error; a bucket is never created."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iox_planner import config
from iox_planner.errors import BadInputError, StoreUnavailableError
from iox_planner.objectstore import Root, local_root, parse_root
from s3_support import BUCKET, CREDENTIALS, CuttableProxy, fresh_prefix


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path, s3_server: Any) -> Root:
    return local_root(tmp_path / "root") if request.param == "local" else parse_root(fresh_prefix())


def test_put_read_list_delete(root: Root) -> None:
    table = pa.table({"a": [1, 2, 3], "s": ["x", "y", None]})
    size = root.put_parquet(table, "1/2/3/f.parquet", compression="zstd")
    root.put_bytes(b"hello", "1/2/other.bin")
    assert root.read_bytes("1/2/other.bin") == b"hello"
    info = root.info("1/2/3/f.parquet")
    assert info is not None and info.size == size and info.rel == "1/2/3/f.parquet" and info.mtime > 0
    assert pq.read_table(root.path("1/2/3/f.parquet"), filesystem=root.filesystem()).equals(table)
    assert sorted(i.rel for i in root.list()) == ["1/2/3/f.parquet", "1/2/other.bin"]
    assert [i.rel for i in root.list("1/2/3")] == ["1/2/3/f.parquet"]
    assert list(root.list("9")) == []
    assert root.delete("1/2/other.bin") is True
    assert root.delete("1/2/other.bin") is False
    assert root.info("1/2/other.bin") is None
    assert [i.rel for i in root.list()] == ["1/2/3/f.parquet"]


def test_local_put_leaves_no_temporary(tmp_path: Path) -> None:
    root = local_root(tmp_path)
    root.put_bytes(b"x" * 10, "a/b.bin")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b.bin"]


def test_relative_paths_are_checked(tmp_path: Path) -> None:
    root = local_root(tmp_path)
    for bad in ("/etc/passwd", "../x", "a/../../x", "a/./b"):
        with pytest.raises(ValueError):
            root.path(bad)


@pytest.mark.parametrize("uri, why", [
    (f"s3://AKIAEXAMPLE:{CREDENTIALS['AWS_SECRET_ACCESS_KEY']}@{BUCKET}/wh", "credentials"),
    (f"s3://someone@{BUCKET}/wh", "credentials"),
    (f"s3://{BUCKET}:9000/wh", "port"),
    (f"s3://{BUCKET}/wh?versionId=1", "query"),
    (f"s3://{BUCKET}/wh/../other", "segment"),
    (f"s3://{BUCKET}//wh", "empty segment"),
    ("s3://UPPER/wh", "bucket name"),
    ("s3:bucket/wh", "s3://BUCKET/PREFIX"),
    ("s3a://bucket/wh", "not a store"),
    ("gs://bucket/wh", "not a store"),
    ("file:///tmp/wh", "not a store"),
    ("relative/wh", "absolute"),
])
def test_refused_warehouse_uris(uri: str, why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOX_WAREHOUSE", uri)
    with pytest.raises(BadInputError) as refused:
        config.warehouse_root()
    assert why in str(refused.value)
    assert CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in str(refused.value)
    assert "AKIAEXAMPLE" not in str(refused.value)


def test_accepted_warehouse_uris(monkeypatch: pytest.MonkeyPatch) -> None:
    for given, canonical in ((f"s3://{BUCKET}/wh/", f"s3://{BUCKET}/wh"), (f"s3://{BUCKET}/a/b=1/c", None),
                             (f"s3://{BUCKET}", None), ("/tmp/x/../wh", "/tmp/wh")):
        monkeypatch.setenv("IOX_WAREHOUSE", given)
        assert config.warehouse_root().uri == (canonical or given)


def test_a_missing_bucket_is_never_created(s3_server: Any) -> None:
    root = parse_root("s3://iox-no-such-bucket/wh")
    with pytest.raises((StoreUnavailableError, OSError)):
        root.put_bytes(b"x", "a.bin")
    assert ("PUT", "/iox-no-such-bucket", 200) not in s3_server.requests()
    listing = [r for r in s3_server.requests() if r[0] == "PUT" and r[1].rstrip("/") == "/iox-no-such-bucket"]
    assert listing == []


def test_a_store_that_went_away_is_the_retryable_error(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = CuttableProxy(s3_server.port)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        root = parse_root(fresh_prefix())
        root.put_bytes(b"x", "a.bin")
        proxy.cut()
        with pytest.raises(StoreUnavailableError) as lost:
            root.put_bytes(b"y" * 1000, "b.bin")
        assert lost.value.exit_code == 75
        assert CREDENTIALS["AWS_SECRET_ACCESS_KEY"] not in str(lost.value)
        with pytest.raises(StoreUnavailableError):
            list(root.list())
        proxy.restore()
        assert [i.rel for i in root.list()] == ["a.bin"]
    finally:
        proxy.stop()


def test_the_filesystem_follows_the_endpoint_setting(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two endpoints, two filesystems: a process that changes AWS_ENDPOINT_URL reaches the new one."""
    root = parse_root(fresh_prefix())
    first = root.filesystem()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{s3_server.port}/")
    assert root.filesystem() is not first
    monkeypatch.setenv("AWS_ENDPOINT_URL", "ftp://127.0.0.1:1")
    with pytest.raises(BadInputError):
        root.filesystem()
    assert os.environ["AWS_ACCESS_KEY_ID"] == CREDENTIALS["AWS_ACCESS_KEY_ID"]
