"""`iox-batch write` over hostile and tricky line protocol, from a file and from standard input: what is stored
is read back from the Parquet files themselves; every refusal is one paragraph, fast, and changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from common_support import assert_one_paragraph_error, live_chunks, read_rows, run_cli
from iox_planner.catalog.store import Catalog

T0 = 1_704_067_200_000_000_000
NS_PER_SECOND = 1_000_000_000


def run_cli_bytes(*args: str, stdin: bytes) -> subprocess.CompletedProcess[str]:
    """`run_cli` with raw bytes on standard input (run_cli takes text, which cannot hold invalid UTF-8)."""
    exe = Path(sys.executable).parent / "iox-batch"
    done = subprocess.run([str(exe), *args], input=stdin, capture_output=True, env=dict(os.environ), timeout=600)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode("utf-8", "replace"),
                                       done.stderr.decode("utf-8", "replace"))


def write(db: str, data: bytes, tmp_path: Path, how: str, *options: str) -> subprocess.CompletedProcess[str]:
    if how == "file":
        path = tmp_path / "input.lp"
        path.write_bytes(data)
        return run_cli("write", "--db", db, *options, str(path))
    return run_cli_bytes("write", "--db", db, *options, "-", stdin=data)


def stored_rows(catalog: Catalog, warehouse: Path, db: str) -> list[dict[str, Any]]:
    rows = []
    for chunk in live_chunks(catalog, db):
        rows.extend(read_rows(warehouse / chunk["path"], drop=("__seq",)))
    return rows


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_carriage_return_and_newline_inside_a_string_are_stored_as_written(
        catalog: Catalog, warehouse: Path, db: str, tmp_path: Path, how: str) -> None:
    data = f'm,t=a s="one\rtwo" {T0}\r\nm,t=b s="three\r\nfour\nfive" {T0 + 1}\r\n'.encode()
    result = write(db, data, tmp_path, how)
    assert result.returncode == 0, result.stderr
    rows = sorted(stored_rows(catalog, warehouse, db), key=lambda r: r["t"])
    assert [(r["t"], r["s"], r["time"]) for r in rows] == [
        ("a", "one\rtwo", T0), ("b", "three\r\nfour\nfive", T0 + 1)]


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_invalid_utf8_is_refused_the_same_way_from_a_file_and_from_stdin(
        catalog: Catalog, db: str, tmp_path: Path, untouched: Any, how: str) -> None:
    data = f"m,t=a f=1 {T0}\nm,t=\xff f=2 {T0}\n".encode("latin-1")
    result = write(db, data, tmp_path, how)
    where = "input.lp" if how == "file" else "standard input"
    assert_one_paragraph_error(result, where, "not UTF-8", "line 2, column 5", "ff")
    untouched.check()


@pytest.mark.parametrize(("precision", "unit"), [("s", NS_PER_SECOND), ("ms", 1_000_000), ("us", 1_000)])
def test_missing_timestamp_is_now_truncated_to_the_precision(
        catalog: Catalog, warehouse: Path, db: str, tmp_path: Path, precision: str, unit: int) -> None:
    before = time.time_ns()
    result = write(db, b"m,t=a f=1\n", tmp_path, "stdin", "--precision", precision)
    after = time.time_ns()
    assert result.returncode == 0, result.stderr
    [row] = stored_rows(catalog, warehouse, db)
    stamp = row["time"]
    assert stamp % unit == 0, stamp
    assert before - before % unit <= stamp <= after, (before, stamp, after)


def assert_refused_fast(result: subprocess.CompletedProcess[str], seconds: float, untouched: Any,
                        *needles: str) -> None:
    assert_one_paragraph_error(result, *needles)
    # The whole command, interpreter start-up included; the parse itself takes well under a second.
    assert seconds < 20, seconds
    assert len(result.stderr) < 4_000, len(result.stderr)
    untouched.check()


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_a_million_tags_are_refused_fast(catalog: Catalog, db: str, tmp_path: Path, untouched: Any,
                                         how: str) -> None:
    data = ("m" + "".join(f",t{i}=v" for i in range(1_000_000)) + f" f=1 {T0}\n").encode()
    start = time.monotonic()
    result = write(db, data, tmp_path, how)
    assert_refused_fast(result, time.monotonic() - start, untouched, "line 1, column 1048577",
                        "IOX_LP_MAX_LINE_BYTES")


def test_a_million_tags_are_refused_by_the_column_limit_when_long_lines_are_allowed(
        catalog: Catalog, db: str, tmp_path: Path, untouched: Any) -> None:
    data = ("m" + "".join(f",t{i}=v" for i in range(1_000_000)) + f" f=1 {T0}\n").encode()
    path = tmp_path / "wide.lp"
    path.write_bytes(data)
    start = time.monotonic()
    result = run_cli("write", "--db", db, str(path), env={"IOX_LP_MAX_LINE_BYTES": "100000000"})
    assert_refused_fast(result, time.monotonic() - start, untouched, "line 1, column", "more than 1000 tags",
                        "IOX_LP_MAX_COLUMNS")


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_a_ten_megabyte_name_is_refused_fast(catalog: Catalog, db: str, tmp_path: Path, untouched: Any,
                                             how: str) -> None:
    data = ("m" * 10_000_000 + f" f=1 {T0}\n").encode()
    start = time.monotonic()
    result = write(db, data, tmp_path, how)
    assert_refused_fast(result, time.monotonic() - start, untouched, "line 1, column", "limit")


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_nul_in_a_name_or_tag_value_is_refused(catalog: Catalog, db: str, tmp_path: Path, untouched: Any,
                                               how: str) -> None:
    data = f"cpu,host=a f=1 {T0}\ncpu\0x f=1\ncpu,host=a\0b f=1\ncpu,host=a f\0=1 {T0}\n".encode()
    start = time.monotonic()
    result = write(db, data, tmp_path, how)
    assert_refused_fast(result, time.monotonic() - start, untouched, "3 bad lines", "line 2, column 4: a NUL",
                        "line 3, column 11: a NUL", "line 4, column 13: a NUL")


def test_many_bad_lines_make_a_short_message(catalog: Catalog, db: str, tmp_path: Path, untouched: Any) -> None:
    data = b"".join(f"m f=x{i}\n".encode() for i in range(500))
    result = write(db, data, tmp_path, "file")
    assert_refused_fast(result, 0, untouched, "500 bad lines", "line 1, column 5", "and 495 more bad lines")


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_a_byte_order_mark_and_backslash_escapes_are_read_as_written(
        catalog: Catalog, warehouse: Path, db: str, tmp_path: Path, how: str) -> None:
    """A Windows editor's UTF-8 file (a byte order mark first) writes table `m`, not `\\ufeffm`; `\\n` and `\\t`
    in a string stay a backslash and a letter (a Windows path stays a path)."""
    data = b"\xef\xbb\xbf" + f'm,t=a p="C:\\new\\table" {T0}\n'.encode()
    result = write(db, data, tmp_path, how)
    assert result.returncode == 0, result.stderr
    assert {c["table_name"] for c in live_chunks(catalog, db)} == {"m"}
    assert [r["p"] for r in stored_rows(catalog, warehouse, db)] == ["C:\\new\\table"]


@pytest.mark.parametrize("line", ["__iox_scan_0 f=1", "\\  f=1", "m f=1,__seq=2"])
def test_a_name_no_query_could_use_is_refused_at_write(db: str, tmp_path: Path, untouched: Any, line: str) -> None:
    result = write(db, f"m f=1 {T0}\n{line} {T0}\n".encode(), tmp_path, "file")
    assert_one_paragraph_error(result, "line 2, column ")
    assert "reserved" in result.stderr or "only whitespace" in result.stderr
    untouched.check()
