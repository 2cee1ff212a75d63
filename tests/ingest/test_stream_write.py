"""Streamed writes against the real catalog and warehouse: chunk size, write order across chunks, all-or-nothing,
UTF-8 errors numbered in the whole input however it is cut into blocks, and a byte order mark skipped at the start
of an input only (of each file of a bulk load, never of a later block or byte range)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from iox_planner.catalog.store import Catalog
from iox_planner.errors import BadInputError
from iox_planner.ingest.blocks import line_blocks
from iox_planner.ingest import bulk
from iox_planner.ingest.lineprotocol import BOM, decode_utf8
from iox_planner.maintenance.persist import persist
from iox_planner.ingest.write import write_line_blocks, write_line_protocol

from common_support import catalog_counts, live_chunks, read_rows, warehouse_files

T0 = 1_704_067_200_000_000_000


def test_a_large_write_becomes_chunks_of_at_most_chunk_rows(catalog: Catalog, db: str, warehouse: Path) -> None:
    # Ten points of one series and day; point k rewrites the key of point k - 5 (same time), so persist must let
    # the later chunk win.
    lines = [f"cpu,host=a v={k}.0 {T0 + k % 5}" for k in range(10)] + [f"mem,host=a u={k}i {T0}" for k in range(2)]
    result = write_line_protocol(catalog, db, "\n".join(lines), chunk_rows=3)
    chunks = [c for c in live_chunks(catalog, db) if c["table_name"] == "cpu"]
    assert sorted(c["row_count"] for c in chunks) == [1, 3, 3, 3]
    by_order = sorted(chunks, key=lambda c: c["chunk_order"])
    seen = []
    for chunk in by_order:
        rows = read_rows(warehouse / chunk["path"])
        assert [r["__seq"] for r in rows] == list(range(len(rows)))  # write positions restart in every chunk
        seen.extend(r["v"] for r in rows)
    assert seen == [float(k) for k in range(10)]  # line order = chunk order, then position
    assert result.rows == 12
    persist(catalog, db, table="cpu")
    (file,) = [c for c in live_chunks(catalog, db) if c["kind"] == "parquet" and c["table_name"] == "cpu"]
    assert sorted(r["v"] for r in read_rows(warehouse / file["path"])) == [5.0, 6.0, 7.0, 8.0, 9.0]


def test_a_bad_line_late_in_a_large_write_leaves_nothing(catalog: Catalog, db: str, warehouse: Path) -> None:
    before, files = catalog_counts(catalog), warehouse_files(warehouse)
    lines = [f"cpu,host=h{k % 7} v={k}.5 {T0 + k}" for k in range(5000)] + ["cpu,host=x v=oops 1"]
    with pytest.raises(BadInputError, match="line 5001"):
        write_line_protocol(catalog, db, "\n".join(lines), chunk_rows=100)
    assert catalog_counts(catalog) == before and warehouse_files(warehouse) == files


def test_utf8_errors_are_numbered_in_the_whole_input(catalog: Catalog, db: str) -> None:
    data = b"".join(f"cpu v={k} {T0 + k}\n".encode() for k in range(300)) + b"cpu,h=\xc3x v=1 1\n"
    with pytest.raises(BadInputError) as whole:
        decode_utf8(data, "in")
    for size in (7, 64, 4096):
        with pytest.raises(BadInputError) as streamed:
            write_line_blocks(catalog, db, line_blocks(io.BytesIO(data), "in", block_bytes=size))
        assert str(streamed.value) == str(whole.value)


def test_a_line_longer_than_the_block_and_the_limit_stops_the_read_early() -> None:
    """The reader holds at most a block plus the longest allowed line: a line without LF past both is an error,
    raised before the rest of the stream is read."""
    stream = io.BytesIO(b"m v=1 1\nm v=2 2\n" + b"x" * 10_000_000)
    with pytest.raises(BadInputError, match=r"line 3 is more than 4,096 bytes long .*IOX_LP_MAX_LINE_BYTES"):
        list(line_blocks(stream, "in", block_bytes=1024, max_line_bytes=4096))
    assert stream.tell() < 4096 + 2 * 1024


def test_a_line_over_the_limit_but_within_a_block_is_one_bad_line(catalog: Catalog, db: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOX_LP_MAX_LINE_BYTES", "200")
    data = b"m v=1 1\nm,t=" + b"y" * 300 + b" v=2 2\nm v=3 3\n"
    result = write_line_blocks(catalog, db, line_blocks(io.BytesIO(data), "in", block_bytes=4096),
                               accept_partial=True)
    assert result.rows == 2 and [e.line for e in result.rejected] == [2]
    assert "IOX_LP_MAX_LINE_BYTES" in result.rejected[0].message


@pytest.mark.parametrize("lines", ["regular", "exact"])
def test_a_write_imports_neither_pandas_nor_the_planner(catalog: Catalog, db: str, tmp_path: Path,
                                                        lines: str) -> None:
    """Start-up is most of a small write's cost: `iox-batch write` must not import pandas (pyarrow's converters
    do, on first use: `ingest/arrow_np.py` avoids them) nor the SQL planner (sqlglot). `exact`: every block holds
    a line the vectorized path leaves to the exact parser (an escaped space in a tag, a quoted string with a
    space), whose points become Arrow columns another way; with every field type, and nulls."""
    import subprocess
    import sys

    path = tmp_path / "in.lp"
    if lines == "regular":
        path.write_text("".join(f"cpu,host=h{k % 7},dc=d{k % 3} a={k}.5,b={k % 11} {T0 + k}\n" for k in range(5000)))
    else:
        path.write_text("".join(f"cpu,host=h\\ {k % 7} a={k}.5,i={k}i,u={k}u,ok={k % 2 == 0},s=\"x {k}\" {T0 + k}\n"
                                f"cpu,host=h{k % 3} a={k}.25 {T0 + k}\n" for k in range(2500)))
        from iox_planner.ingest.lineprotocol import Point, Precision, StreamParser
        from iox_planner.ingest.write import parse_blocks

        with open(path, "rb") as f:
            parsed = list(parse_blocks(line_blocks(f, "in"), StreamParser(precision=Precision.NS, default_time=0)))
        assert parsed and all(isinstance(p[0], Point) for p in parsed if p), "the exact parser was not used"
    script = ("import sys; from iox_planner.cli.main import main; code = main(sys.argv[1:]); "
              "print([m for m in ('pandas', 'sqlglot', 'iox_planner.planner') if m in sys.modules]); "
              "sys.exit(code)")
    out = subprocess.run([sys.executable, "-c", script, "write", "--db", db, str(path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "5000 rows in 1 chunk(s)" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("parser", ["vectorized", "mixed"])
def test_every_chunk_of_a_partition_is_full_but_its_last(catalog: Catalog, db: str, warehouse: Path,
                                                         parser: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three tables over two days, interleaved at random and read in small blocks, with a chunk size that no
    block or piece size divides: each (table, day) gets ceil(rows / chunk_rows) chunks, all full but the newest,
    and its rows read back in line order. Six (table, day)s at once hold more rows than a chunk, so some wait in
    the spill file meanwhile. `mixed`: every 40th line has an escaped space, so its block goes to the exact
    parser and pieces of both paths meet in one chunk."""
    import math
    import random

    from iox_planner.ingest import write

    spills: list[int] = []
    real_spill = write._Pending.spill

    def counted(self: write._Pending) -> None:
        spills.append(self.rows)
        real_spill(self)

    monkeypatch.setattr(write._Pending, "spill", counted)
    opened: list[object] = []
    real_temporary = write.tempfile.TemporaryFile

    def temporary(*args: Any, **kwargs: Any) -> Any:
        opened.append(kwargs.get("dir"))
        return real_temporary(*args, **kwargs)

    monkeypatch.setattr(write.tempfile, "TemporaryFile", temporary)
    rng = random.Random(11)
    limit = 29
    expected: dict[tuple[str, str], list[int]] = {}
    lines = []
    for k in range(1200):
        table, day = rng.choice(["cpu", "mem", "disk"]), rng.randrange(2)
        host = "h\\ 1" if parser == "mixed" and k % 40 == 0 else f"h{k % 5}"
        lines.append(f"{table},host={host} v={k}i {T0 + day * 86_400_000_000_000 + k}")
        expected.setdefault((table, f"2024-01-0{day + 1}"), []).append(k)
    data = ("\n".join(lines) + "\n").encode()
    result = write_line_blocks(catalog, db, line_blocks(io.BytesIO(data), "in", block_bytes=1024), chunk_rows=limit)
    assert result.rows == 1200
    assert any(spills), "nothing was spilled: the memory bound was not exercised"
    assert opened == [warehouse], "one spill file per write, in the warehouse, whatever the tables and days"
    chunks = live_chunks(catalog, db)
    assert {(c["table_name"], c["partition_key"]) for c in chunks} == set(expected)
    for key, values in expected.items():
        mine = sorted((c for c in chunks if (c["table_name"], c["partition_key"]) == key),
                      key=lambda c: c["chunk_order"])
        assert len(mine) == math.ceil(len(values) / limit), key
        assert [c["row_count"] for c in mine[:-1]] == [limit] * (len(mine) - 1), key
        seen = []
        for chunk in mine:
            rows = read_rows(warehouse / chunk["path"])
            assert [r["__seq"] for r in rows] == list(range(len(rows)))
            seen.extend(r["v"] for r in rows)
        assert seen == values, key


def test_arrow_columns_from_python_values_match_pyarrows_own() -> None:
    """`arrow_np.column` (the exact parser's points to Arrow, without pandas) against `pa.array`, the reference:
    every line protocol type, nulls anywhere, extremes, non-ASCII text, and the empty column."""
    import pyarrow as pa

    from iox_planner.ingest.arrow_np import column

    cases: list[tuple[pa.DataType, list[object]]] = [
        (pa.int64(), [1, None, -(2**63), 2**63 - 1, 0]),
        (pa.uint64(), [None, 0, 2**64 - 1, 7]),
        (pa.float64(), [1.5, None, float("inf"), -0.0, 1e-300]),
        (pa.bool_(), [True, False, None, True, False, False, True, True, False]),
        (pa.string(), ["a", None, "", "é x", "z" * 100]),
        (pa.int64(), []),
        (pa.bool_(), [None, None]),
    ]
    for type_, values in cases:
        got = column(values, type_)
        got.validate(full=True)
        assert got.equals(pa.array(values, type=type_)), (type_, values, got)


class _Trickle:
    """A stream that hands out one byte a read, as a slow pipe may."""

    def __init__(self, data: bytes) -> None:
        self.data = io.BytesIO(data)

    def read(self, n: int = -1) -> bytes:
        return self.data.read(1)


@pytest.mark.parametrize("reader", ["whole", "trickle"])
def test_a_byte_order_mark_starting_the_input_is_skipped(catalog: Catalog, db: str, reader: str) -> None:
    """A Windows editor's UTF-8 file: its mark is not part of the first measurement's name, however the bytes
    arrive; a later line starting with one is refused, naming its line."""
    data = BOM + b"".join(f"cpu,host=h{k % 3} v={k}i {T0 + k}\n".encode() for k in range(50))
    stream: Any = io.BytesIO(data) if reader == "whole" else _Trickle(data)
    result = write_line_blocks(catalog, db, line_blocks(stream, "in", block_bytes=64))
    assert result.rows == 50
    assert {c["table_name"] for c in live_chunks(catalog, db)} == {"cpu"}
    before = catalog_counts(catalog)
    with pytest.raises(BadInputError, match=r"line 51, column 1: a byte order mark \(U\+FEFF\)"):
        write_line_blocks(catalog, db, line_blocks(io.BytesIO(data + BOM + b"cpu v=1i 1\n"), "in", block_bytes=64))
    assert catalog_counts(catalog) == before


def test_a_bulk_load_skips_a_byte_order_mark_at_the_start_of_each_file_only(catalog: Catalog, db: str,
                                                                            warehouse: Path, tmp_path: Path) -> None:
    """Each file of a folder is an input of its own (its mark is skipped, by the task reading its first range);
    a range cut just before a mark in the middle of a file is not the start of an input: the mark is refused
    there, as the plain write of that file refuses it."""
    lines = [f"m,host=h{k % 3} f={k}i {T0 + k}\n".encode() for k in range(40)]
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.lp").write_bytes(BOM + b"".join(lines[:20]))
    (folder / "b.lp").write_bytes(BOM + b"".join(lines[20:]))
    said: list[str] = []
    result = bulk.bulk_write(catalog, db, str(folder), bulk.local_runner, target_bytes=100, warehouse=warehouse,
                             progress=said.append)
    assert result.rows == 40 and not any("plain writes" in line for line in said), said
    assert len(bulk.plan_ranges(bulk.input_files(str(folder)), 100)) > 2
    assert {c["table_name"] for c in live_chunks(catalog, db)} == {"m"}

    before = catalog_counts(catalog)
    inside = tmp_path / "inside.lp"
    head = b"".join(lines[:10])
    inside.write_bytes(head + BOM + b"".join(lines[10:]))
    assert bulk.plan_ranges(bulk.input_files(str(inside)), len(head) - 1)[1].start == len(head)
    with pytest.raises(BadInputError, match=r"line 11, column 1: a byte order mark"):
        bulk.bulk_write(catalog, db, str(inside), bulk.local_runner, target_bytes=len(head) - 1,
                        warehouse=warehouse)
    assert catalog_counts(catalog) == before
