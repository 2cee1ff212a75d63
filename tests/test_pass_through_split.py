"""The pass-through split of a dedup group (`spark_jobs/execute.py`), in Arrow alone, against a plain-Python
reference of PRODUCT.md's dedup: one row per (tags, time), NULL tag equal to NULL tag, each field its last
non-null value by write order.

The split: base files (duplicate-free, pairwise time-disjoint: `slicing.disjoint_base`) and late chunks; base rows
that may meet a late row (`dedup.may_meet` over the late chunks' values) are merged with the late rows by the
workers (`arrow_merge._without_passing_rows`, then `deduplicate_table`); the other base rows pass as they are.
Here the passing half is worked out by the test itself, in plain Python, so the union is checked against the
reference without trusting `may_meet` for it (`tests/spark/test_pass_through.py` checks Spark's half row by row).

Random groups mix what a query's dedup group holds: Parquet files that tile the time range, late Parquet files
over a few series, ingester chunks with duplicates of their own, NULL tags, fields a chunk lacks, 1 ns neighbours
between files, tags plain or dictionary-encoded (one dictionary across the group, as the workers read them, or one
that repeats a value). `IOX_PASS_THROUGH_CASES` sets how many (default 300).
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from iox_planner.ingest.dedup import deduplicate_table, may_meet
from iox_planner.slicing import Span, disjoint_base
from spark_jobs.arrow_merge import _without_passing_rows

CASES = int(os.environ.get("IOX_PASS_THROUGH_CASES", "300"))
TAGS = ("host", "region")
FIELDS = ("v", "w")
KEYS = ["region", "host", "time"]
HOSTS = ["a", "b", "c", "d", "e", None]
REGIONS = ["east", "west", None]


def _chunk(rng: random.Random, low: int, high: int, hosts: list[Any], duplicates: bool) -> list[dict[str, Any]]:
    rows = []
    for host in hosts:
        region = rng.choice(REGIONS)
        times = range(low, high + 1)
        picked = [t for t in times if rng.random() < 0.7]
        if duplicates:
            picked += [rng.choice(times) for _ in range(rng.randint(0, 3))]
            rng.shuffle(picked)
        for t in picked:
            rows.append({"host": host, "region": region, "time": t,
                         "v": None if rng.random() < 0.2 else rng.randint(0, 9),
                         "w": None if rng.random() < 0.3 else rng.randint(0, 9)})
    return rows


def random_group(rng: random.Random) -> list[tuple[list[dict[str, Any]], bool]]:
    """(rows, duplicate_free) per chunk, in the order the chunks are read."""
    chunks = []
    start = 0
    for _ in range(rng.randint(1, 5)):  # files tiling the range, sometimes 1 ns apart, sometimes with a gap
        width = rng.randint(0, 6)
        chunks.append((_chunk(rng, start, start + width, rng.sample(HOSTS, rng.randint(1, 6)), False), True))
        start += width + rng.choice([1, 1, 2])
    for _ in range(rng.randint(0, 3)):  # late files over a few series, anywhere in the range
        low = rng.randint(0, start)
        chunks.append((_chunk(rng, low, low + rng.randint(0, start), rng.sample(HOSTS, rng.randint(1, 2)), False),
                       True))
    for _ in range(rng.randint(0, 2)):  # ingester chunks: duplicates of their own
        low = rng.randint(0, start)
        chunks.append((_chunk(rng, low, low + rng.randint(0, 3), rng.sample(HOSTS, rng.randint(1, 3)), True), False))
    rng.shuffle(chunks)
    return chunks


def _table(rng: random.Random, chunks: list[tuple[list[dict[str, Any]], bool]]) -> pa.Table:
    schema = pa.schema([("host", pa.string()), ("region", pa.string()), ("time", pa.int64()),
                        ("v", pa.int64()), ("w", pa.int64())])
    tables = [pa.Table.from_pylist(rows, schema=schema) for rows, _ in chunks]
    table = pa.concat_tables(tables)
    style = rng.choice(["plain", "dictionary", "repeated"])
    if style == "plain":
        return table
    columns = []
    for name in table.column_names:
        column = table[name].combine_chunks()
        if name in TAGS:
            column = column.dictionary_encode()
            if style == "repeated" and len(column.dictionary):
                # The same value under two indices: equal tags must still meet.
                dictionary = pa.concat_arrays([column.dictionary, column.dictionary])
                indices = np.asarray(column.indices.to_numpy(zero_copy_only=False), dtype=np.float64)
                flip = np.array([rng.random() < 0.5 for _ in range(len(column))])
                shifted = np.where(flip, indices + len(column.dictionary), indices)
                column = pa.DictionaryArray.from_arrays(
                    pa.array([None if np.isnan(i) else int(i) for i in shifted], pa.int32()), dictionary)
        columns.append(column)
    return pa.table(columns, names=table.column_names)


def reference(chunks: list[tuple[list[dict[str, Any]], bool]], orders: list[int]) -> list[tuple[Any, ...]]:
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    written = []
    for (rows, _), base in zip(chunks, orders):
        written += [(base + position, row) for position, row in enumerate(rows)]
    for order, row in sorted(written, key=lambda w: w[0]):
        key = (row["region"], row["host"], row["time"])
        out = merged.setdefault(key, {"v": None, "w": None, "order": order})
        out["order"] = order
        for f in FIELDS:
            if row[f] is not None:
                out[f] = row[f]
    return [(*k, m["v"], m["w"], m["order"]) for k, m in merged.items()]


def _rows(table: pa.Table, order: np.ndarray) -> list[tuple[Any, ...]]:
    columns = {n: table[n].to_pylist() for n in table.column_names}
    return [(columns["region"][i], columns["host"][i], columns["time"][i], columns["v"][i], columns["w"][i],
             int(order[i])) for i in range(table.num_rows)]


def _key(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((v is None, v) for v in row)


def split_and_merge(chunks: list[tuple[list[dict[str, Any]], bool]], table: pa.Table, order: np.ndarray,
                    values_of: Any = None) -> tuple[list[tuple[Any, ...]], int]:
    """The split's answer (rows with their orders) and how many rows the workers merged."""
    spans = [(min(r["time"] for r in rows), max(r["time"] for r in rows), len(rows), free) for rows, free in chunks]
    candidates = [i for i, s in enumerate(spans) if s[3] and s[2]]
    base = [candidates[j] for j in disjoint_base([Span(*spans[i][:3]) for i in candidates])]
    late = [rows for i, (rows, _) in enumerate(chunks) if i not in base]
    late_values = {t: sorted({r[t] for rows in late for r in rows}, key=lambda v: (v is not None, v or ""))
                   for t in TAGS}
    if values_of is not None:
        late_values = values_of(late_values)
    kept, kept_order = _without_passing_rows(table, order, [len(r) for r, _ in chunks], base, late_values)
    merged, merged_order = deduplicate_table(kept, KEYS, kept_order)
    out = _rows(merged, merged_order)
    # The passing half, worked out here: base rows whose value in some listed tag is not listed.
    starts = np.cumsum([0] + [len(r) for r, _ in chunks])
    for i in base:
        for position, row in enumerate(chunks[i][0]):
            if not all(row[t] in late_values[t] for t in late_values):
                out.append((row["region"], row["host"], row["time"], row["v"], row["w"],
                            int(order[starts[i] + position])))
    return out, kept.num_rows


@pytest.mark.parametrize("seed", range(CASES))
def test_the_split_gives_the_reference_rows(seed: int) -> None:
    rng = random.Random(seed)
    chunks = [c for c in random_group(rng) if c[0]]
    if not chunks:
        pytest.skip("an empty group")
    orders = sorted(rng.sample(range(1, 1000), len(chunks)))
    rng.shuffle(orders)
    orders = [o << 20 for o in orders]
    table = _table(rng, chunks)
    order = np.concatenate([np.arange(len(rows), dtype=np.int64) + base for (rows, _), base in zip(chunks, orders)])
    want = sorted(reference(chunks, orders), key=_key)
    got, _ = split_and_merge(chunks, table, order)
    assert sorted(got, key=_key) == want
    # A tag left out (too many values) restricts nothing: still exact.
    got, _ = split_and_merge(chunks, table, order, lambda values: {"host": values["host"]})
    assert sorted(got, key=_key) == want


def test_a_backfill_of_a_few_series_merges_only_their_rows() -> None:
    """Hourly files of six hosts plus one late file of host b over every hour: the workers merge b's rows only,
    and the answer is the reference's."""
    rng = random.Random(7)
    chunks = [(_chunk(rng, 10 * h, 10 * h + 9, HOSTS, False), True) for h in range(4)]
    chunks.append((_chunk(rng, 0, 39, ["b"], False), True))
    for rows, _ in chunks:
        for row in rows:
            row["region"] = "east"  # b's series is the same in every file
    orders = [(i + 1) << 20 for i in range(len(chunks))]
    table = _table(rng, chunks)
    order = np.concatenate([np.arange(len(rows), dtype=np.int64) + base for (rows, _), base in zip(chunks, orders)])
    got, merged = split_and_merge(chunks, table, order)
    assert sorted(got, key=_key) == sorted(reference(chunks, orders), key=_key)
    assert merged == sum(1 for rows, _ in chunks for r in rows if r["host"] == "b") < table.num_rows


def test_may_meet_compares_values_exactly_and_null_only_with_null() -> None:
    dictionary = pa.array(["a", "b", None, "a", "é", ""])
    table = pa.table({
        "h": pa.DictionaryArray.from_arrays(pa.array([0, 1, 2, None, 3, 4, 5], pa.int32()), dictionary),
        "p": pa.array(["x", None, "y", "x", "z", "e\u0301", "x"]),
    })
    assert may_meet(table, {"h": ["a", None]}).tolist() == [True, False, True, True, True, False, False]
    assert may_meet(table, {"h": ["a"]}).tolist() == [True, False, False, False, True, False, False]
    assert may_meet(table, {"h": ["a", ""], "p": ["x", None]}).tolist() == \
        [True, False, False, False, False, False, True]
    assert may_meet(table, {"p": ["é"]}).tolist() == [False] * 7  # no normalization: e + accent is not é
    assert may_meet(table, {"missing": ["a"]}).tolist() == [False] * 7  # a missing column is NULL
    assert may_meet(table, {"missing": [None]}).tolist() == [True] * 7
    assert may_meet(table, {"h": []}).tolist() == [False] * 7
    assert may_meet(table, {}).tolist() == [True] * 7


def test_disjoint_base_takes_the_largest_files_that_share_no_nanosecond() -> None:
    spans = [Span(0, 9, 100), Span(10, 19, 100), Span(0, 39, 50), Span(19, 25, 300), Span(26, 26, 1)]
    # 3 (largest) first; 0 fits; 1 touches 3 at ns 19; 2 overlaps everything; 4 is 1 ns after 3.
    assert disjoint_base(spans) == [0, 3, 4]
    assert disjoint_base([]) == []


def test_repeated_dictionary_values_are_one_key() -> None:
    """A dictionary may hold a value twice (one file as read): equal tags are one key all the same."""
    host = pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int32()), pa.array(["a", "a"]))
    table = pa.table({"host": host, "time": pa.array([5, 5]), "v": pa.array([1, 2])})
    merged, order = deduplicate_table(table, ["host", "time"], np.array([1, 2]))
    assert merged.num_rows == 1 and merged["v"].to_pylist() == [2] and order.tolist() == [2]
