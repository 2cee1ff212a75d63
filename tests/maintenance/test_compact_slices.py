"""A compaction bundle's slices read each input once (`slices.compact_slices`), with no Spark and no catalog: files
written here, sliced as a plan would slice them, merged by the real slice code in this process.

Each case checks the bundle's outputs three ways: against a plain-Python IOx dedup of the input rows (the oracle:
per key, each field's last non-null value by chunk order, then row position), against the same slices merged one at
a time with a filtered read each (`compact_slice` alone, the path a file overlapping one slice still takes), and by
counting how often each input file was decoded. `IOX_COMPACT_SLICE_CASES` sets how many random cases run (default 6
in CI).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iox_planner.maintenance.compact.slices import SCRATCH_PREFIX, SliceTask, compact_slice, compact_slices
from iox_planner.model import TIME, WRITE_ORDER

CASES = int(os.environ.get("IOX_COMPACT_SLICE_CASES", "6"))
COLUMNS = (("host", "tag"), ("f", "float"), ("n", "integer"), (TIME, "time"))
SORT_KEY = ("host", TIME)


def write_file(root: Path, name: str, rows: list[dict[str, Any]], row_group: int, orders: bool = False) -> str:
    """`rows` (one per key) sorted on the sort key, as persist and compaction write them, in row groups of
    `row_group` rows; with `orders`, a `__write_order` column as a compacted file has."""
    rows = sorted(rows, key=lambda r: (r["host"], r[TIME]))
    data: dict[str, list[Any]] = {c: [r.get(c) for r in rows] for c in ("host", "f", "n", TIME)}
    if orders:
        data[WRITE_ORDER] = [r[WRITE_ORDER] for r in rows]
    types = {"host": pa.string(), "f": pa.float64(), "n": pa.int64(), TIME: pa.int64(), WRITE_ORDER: pa.int64()}
    table = pa.table({c: pa.array(v, types[c]) for c, v in data.items()})
    pq.write_table(table, root / name, row_group_size=row_group, compression="zstd")
    return name


def oracle(files: list[tuple[int, list[dict[str, Any]]]]) -> list[tuple[Any, ...]]:
    """IOx dedup by hand: files in chunk order; each field keeps the newest non-null value."""
    merged: dict[tuple[Any, int], dict[str, Any]] = {}
    for order, rows in sorted(files, key=lambda f: f[0]):
        for r in rows:
            into = merged.setdefault((r["host"], r[TIME]), {"f": None, "n": None})
            for c in ("f", "n"):
                if r.get(c) is not None:
                    into[c] = r[c]
    return sorted(((k[0], v["f"], v["n"], k[1]) for k, v in merged.items()), key=by_key)


def by_key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return row[0], row[3]  # (host, time): one row per key


def tasks_for(files: list[tuple[str, int, int, int]], cuts: list[tuple[int, int]], out: str) -> list[SliceTask]:
    """One task per slice, reading the files (name, order, min time, max time) overlapping it, as
    `slices.slice_tasks` builds them."""
    return [SliceTask(1, i, lo, hi, tuple((name, order) for name, order, a, b in files if a <= hi and b >= lo),
                      COLUMNS, SORT_KEY, f"{out}/{i}.compacted.parquet", 1)
            for i, (lo, hi) in enumerate(cuts)]


def output_rows(root: Path, results: Any) -> list[tuple[Any, ...]]:
    rows = []
    for r in results:
        if r.rows_out:
            rows += [(d["host"], d["f"], d["n"], d[TIME]) for d in pq.read_table(root / r.output).to_pylist()]
    return sorted(rows, key=by_key)


@pytest.fixture(autouse=True)
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system's temporary folder, for these tests: one of their own, so what is left in it is theirs."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """File name -> how many times the slice code decoded it (a filtered read, a whole read or a pass of
    `iter_batches`; footers alone are not counted)."""
    counts: dict[str, int] = {}
    read_table, init = pq.read_table, pq.ParquetFile.__init__
    read, iter_batches = pq.ParquetFile.read, pq.ParquetFile.iter_batches

    def count(source: Any) -> None:
        name = Path(str(source)).name
        counts[name] = counts.get(name, 0) + 1

    def counted_read_table(source: Any, *args: Any, **kwargs: Any) -> Any:
        count(source)
        return read_table(source, *args, **kwargs)

    def remembering_init(self: Any, source: Any, *args: Any, **kwargs: Any) -> None:
        self.counted_source = source
        init(self, source, *args, **kwargs)

    def counted_read(self: Any, *args: Any, **kwargs: Any) -> Any:
        count(self.counted_source)
        return read(self, *args, **kwargs)

    def counted_iter(self: Any, *args: Any, **kwargs: Any) -> Any:
        count(self.counted_source)
        return iter_batches(self, *args, **kwargs)

    monkeypatch.setattr(pq, "read_table", counted_read_table)
    monkeypatch.setattr(pq.ParquetFile, "__init__", remembering_init)
    monkeypatch.setattr(pq.ParquetFile, "read", counted_read)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counted_iter)
    yield counts


def day_replay(root: Path) -> tuple[list[tuple[str, int, int, int]], list[tuple[int, list[dict[str, Any]]]]]:
    """Eight hourly files of 4 hosts, then one file re-writing the whole day (every other point, some fields
    NULL), sorted host first: each of its row groups spans the day."""
    hour, per_hour = 3600, 12
    files, rows_of = [], []
    for h in range(8):
        rows = [{"host": f"h{k}", "f": float(h * 100 + i), "n": k, TIME: h * hour + i * 300}
                for k in range(4) for i in range(per_hour)]
        files.append((write_file(root, f"hour{h}.parquet", rows, 16), h + 1, h * hour, h * hour + 3300))
        rows_of.append((h + 1, rows))
    replay = [{"host": f"h{k}", "f": None if i % 3 == 0 else -float(i), "n": None if i % 5 == 0 else -k,
               TIME: i * 600} for k in range(4) for i in range(8 * 6)]
    files.append((write_file(root, "replay.parquet", replay, 50), 9, 0, 47 * 600))
    rows_of.append((9, replay))
    return files, rows_of


def test_a_file_spanning_every_slice_is_decoded_once_and_the_answer_is_unchanged(
        tmp_path: Path, decodes: dict[str, int], scratch: Path) -> None:
    files, rows_of = day_replay(tmp_path)
    cuts = [(h * 3600, h * 3600 + 3599) for h in range(8)]
    bundle = compact_slices(tasks_for(files, cuts, "bundle"), str(tmp_path))
    assert decodes["replay.parquet"] == 1, decodes
    assert all(decodes[f"hour{h}.parquet"] == 1 for h in range(8)), decodes
    assert output_rows(tmp_path, bundle) == oracle(rows_of)
    # The scratch folder is gone with the bundle.
    assert not list(scratch.iterdir())

    # The same slices one at a time (a filtered read of the replay per slice): the same files, byte for byte
    # apart from their names; the replay decoded once per slice.
    decodes.clear()
    alone = [compact_slice(t, str(tmp_path)) for t in tasks_for(files, cuts, "alone")]
    assert decodes["replay.parquet"] == 8, decodes
    for a, b in zip(bundle, alone):
        assert (a.rows_in, a.rows_out, a.min_time, a.max_time, a.tag_ranges) == \
               (b.rows_in, b.rows_out, b.min_time, b.max_time, b.tag_ranges)
        assert pq.read_table(tmp_path / a.output).equals(pq.read_table(tmp_path / b.output))


def test_where_a_second_read_costs_less_than_a_scratch_file_each_slice_reads_its_part(
        tmp_path: Path, decodes: dict[str, int]) -> None:
    files, rows_of = day_replay(tmp_path)
    # Two slices: a round trip through scratch files costs what a second decode does; row groups each inside one
    # slice: the filter prunes the others, each is decoded once anyway.
    halves = [(0, 4 * 3600 - 1), (4 * 3600, 8 * 3600 - 1)]
    got = compact_slices(tasks_for(files, halves, "halves"), str(tmp_path))
    assert decodes["replay.parquet"] == 2 and output_rows(tmp_path, got) == oracle(rows_of)
    decodes.clear()
    one_host = [{"host": "h0", "f": float(i), "n": i, TIME: i * 600} for i in range(48)]
    local = write_file(tmp_path, "local.parquet", one_host, 6)  # sorted on time alone: row groups of one hour
    cuts = [(h * 3600, h * 3600 + 3599) for h in range(8)]
    got = compact_slices(tasks_for([(local, 1, 0, 47 * 600)], cuts, "local"), str(tmp_path))
    assert decodes["local.parquet"] == 8 and output_rows(tmp_path, got) == oracle([(1, one_host)])


def random_case(rng: random.Random, root: Path) -> tuple[list[tuple[str, int, int, int]],
                                                         list[tuple[int, list[dict[str, Any]]]],
                                                         list[tuple[int, int]]]:
    """Files of random spans, hosts, NULLs and row group sizes (some with `__write_order`), a key at most once per
    file; slices cut at random points over the whole range, some holding no row of a file that overlaps them."""
    span = rng.choice([50, 400, 5000])
    files, rows_of = [], []
    for k in range(rng.randint(1, 5)):
        lo = rng.randrange(span)
        hi = rng.randrange(lo, span)
        keys = {(f"h{rng.randrange(3)}", rng.randint(lo, hi)) for _ in range(rng.randint(1, 60))}
        keys |= {("h0", lo), ("h1", hi)}  # the catalog's range is the file's own
        rows = [{"host": h, "f": None if rng.random() < 0.3 else rng.random(),
                 "n": None if rng.random() < 0.3 else rng.randrange(100), TIME: t, WRITE_ORDER: k + 1}
                for h, t in sorted(keys)]
        name = write_file(root, f"in{k}.parquet", rows, rng.choice([1, 3, 7, 1000]), orders=rng.random() < 0.5)
        files.append((name, k + 1, lo, hi))
        rows_of.append((k + 1, rows))
    points = sorted(rng.sample(range(1, span), rng.randint(0, min(12, span - 1))))
    edges = [0, *points, span]
    return files, rows_of, [(a, b - 1) for a, b in zip(edges, edges[1:])]


@pytest.mark.parametrize("seed", range(CASES))
def test_random_bundles_give_the_oracles_rows_and_the_slice_by_slice_files(tmp_path: Path, seed: int) -> None:
    files, rows_of, cuts = random_case(random.Random(seed), tmp_path)
    bundle = compact_slices(tasks_for(files, cuts, "bundle"), str(tmp_path))
    assert output_rows(tmp_path, bundle) == oracle(rows_of), f"seed {seed}: {files} {cuts}"
    alone = [compact_slice(t, str(tmp_path)) for t in tasks_for(files, cuts, "alone")]
    for a, b in zip(bundle, alone):
        assert (a.rows_in, a.rows_out) == (b.rows_in, b.rows_out), f"seed {seed}"
        if a.rows_out:
            assert pq.read_table(tmp_path / a.output).equals(pq.read_table(tmp_path / b.output)), f"seed {seed}"


CHILD = """
import json, sys
from iox_planner.maintenance.compact.slices import SliceTask, compact_slices
spec = json.loads(sys.argv[1])
tasks = [SliceTask(**{**t, "inputs": tuple(map(tuple, t["inputs"])), "columns": tuple(map(tuple, t["columns"])),
                      "sort_key": tuple(t["sort_key"])}) for t in spec["tasks"]]
while True:
    compact_slices(tasks, spec["root"])
"""


def test_a_task_killed_mid_bundle_leaves_its_scratch_to_the_next_bundle_on_the_machine(tmp_path: Path,
                                                                                        scratch: Path) -> None:
    """A real process merging a bundle is killed (SIGKILL) while its scratch folder holds pieces; the next bundle
    deletes that folder (its process is gone), keeps a live process's, and still gives the oracle's rows."""
    from dataclasses import asdict

    files, rows_of = day_replay(tmp_path)
    cuts = [(h * 3600, h * 3600 + 3599) for h in range(8)]
    spec = {"tasks": [asdict(t) for t in tasks_for(files, cuts, "killed")], "root": str(tmp_path)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(spec)], env={**os.environ, "TMPDIR": str(scratch)})
    try:
        deadline = time.monotonic() + 60
        while not list(scratch.glob(f"{SCRATCH_PREFIX}{child.pid}-*/*/*.arrow")):
            assert child.poll() is None and time.monotonic() < deadline, "the child never split a file"
            time.sleep(0.01)
        # A random moment of its loop: between splits, mid-split or mid-merge.
        time.sleep(random.uniform(0, 0.2))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert list(scratch.glob(f"{SCRATCH_PREFIX}{child.pid}-*")), "the killed task left no scratch to sweep"
    alive = scratch / f"{SCRATCH_PREFIX}{os.getppid()}-other"
    alive.mkdir()
    results = compact_slices(tasks_for(files, cuts, "next"), str(tmp_path))
    assert output_rows(tmp_path, results) == oracle(rows_of)
    assert [p.name for p in scratch.iterdir()] == [alive.name]


def test_a_split_gives_each_range_its_own_rows_whatever_the_ranges_order(tmp_path: Path) -> None:
    from iox_planner.maintenance.compact.slices import _split_input
    from iox_planner.objectstore import local_root

    write_file(tmp_path, "f.parquet", [{"host": "a", TIME: t} for t in range(10)], 3)
    pieces = _split_input(local_root(tmp_path), "f.parquet", [(5, 9), (0, 2), (3, 4), (20, 30)], [],
                          tmp_path / "s")
    got = [None if p is None else pa.ipc.open_stream(pa.memory_map(str(p))).read_all()[TIME].to_pylist()
           for p in pieces]
    assert got == [[5, 6, 7, 8, 9], [0, 1, 2], [3, 4], None]


def test_a_bundle_of_two_tables_splits_each_file_with_its_own_tables_tags(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One call compacts every locked partition, so a bundle may hold slices of tables with different tags: a
    file is split with its own table's tags dictionary encoded (as a filtered read encodes them)."""
    from iox_planner.maintenance.compact import slices

    host_file = write_file(tmp_path, "a.parquet", [{"host": "h", TIME: t} for t in range(4)], 10)
    region = pa.table({"region": pa.array([f"r{t % 2}" for t in range(30)]), TIME: pa.array(range(30), pa.int64())})
    pq.write_table(region.sort_by([("region", "ascending"), (TIME, "ascending")]), tmp_path / "b.parquet")
    other = (("region", "tag"), (TIME, "time"))
    tasks = [SliceTask(1, 0, 0, 3, ((host_file, 1),), COLUMNS, SORT_KEY, "out/a.compacted.parquet", 1),
             *[SliceTask(2, i + 1, lo, lo + 9, (("b.parquet", 1),), other, ("region", TIME),
                         f"out/b{i}.compacted.parquet", 1) for i, lo in enumerate(range(0, 30, 10))]]
    pieces: list[Any] = []
    read_piece = slices._read_piece
    monkeypatch.setattr(slices, "_read_piece", lambda piece: pieces.append(read_piece(piece)) or pieces[-1])
    results = compact_slices(tasks, str(tmp_path))
    assert len(pieces) == 3 and all(pa.types.is_dictionary(p["region"].type) for p in pieces)
    assert [r.rows_out for r in results] == [4, 10, 10, 10]
