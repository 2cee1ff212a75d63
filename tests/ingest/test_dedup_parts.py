"""`dedup.deduplicate_parts` (the query workers' merge, which lets rows that cannot have a duplicate pass through
unmerged) against a plain-Python reference of PRODUCT.md's dedup: one row per (tags, time), NULL tag equal to NULL
tag, each field its last non-null value by write order, and per merged row the highest order that wrote it.

Random groups mix what a query's dedup group holds: Parquet files (duplicate-free) that tile the time range, late
Parquet files over a few series, ingester chunks with duplicates of their own, NULL tags, fields a chunk lacks,
1 ns neighbours between files, tags plain or dictionary-encoded (one dictionary across the group, as the workers
read them, or one that repeats a value). `IOX_DEDUP_PARTS_CASES` sets how many (default 300).
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from iox_planner.ingest import dedup
from iox_planner.ingest.dedup import Part, deduplicate_parts

CASES = int(os.environ.get("IOX_DEDUP_PARTS_CASES", "300"))
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


@pytest.mark.parametrize("seed", range(CASES))
def test_deduplicate_parts_equals_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    chunks = random_group(rng)
    orders = sorted(rng.sample(range(1, 1000), len(chunks)))
    rng.shuffle(orders)
    orders = [o << 20 for o in orders]
    table = _table(rng, chunks)
    order = np.concatenate([np.arange(len(rows), dtype=np.int64) + base for (rows, _), base in zip(chunks, orders)])
    parts = [Part(len(rows), free) for rows, free in chunks]
    got, got_order = deduplicate_parts(table, KEYS, order, parts, "time")
    assert sorted(_rows(got, got_order), key=_key) == sorted(reference(chunks, orders), key=_key)


def test_a_backfill_of_a_few_series_merges_only_their_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hourly files of six hosts plus one late file of host b over every hour: only b's rows are merged, and the
    answer is the reference's."""
    rng = random.Random(7)
    chunks = [(_chunk(rng, 10 * h, 10 * h + 9, HOSTS, False), True) for h in range(4)]
    chunks.append((_chunk(rng, 0, 39, ["b"], False), True))
    for rows, _ in chunks:
        for row in rows:
            row["region"] = "east"  # b's series is the same in every file
    orders = [(i + 1) << 20 for i in range(len(chunks))]
    table = _table(rng, chunks)
    order = np.concatenate([np.arange(len(rows), dtype=np.int64) + base for (rows, _), base in zip(chunks, orders)])
    merged_sizes = []
    plain = dedup.deduplicate_table

    def counting(t: pa.Table, keys: Any, o: np.ndarray) -> Any:
        merged_sizes.append(t.num_rows)
        return plain(t, keys, o)

    monkeypatch.setattr(dedup, "deduplicate_table", counting)
    got, got_order = deduplicate_parts(table, KEYS, order, [Part(len(r), f) for r, f in chunks], "time")
    assert sorted(_rows(got, got_order), key=_key) == sorted(reference(chunks, orders), key=_key)
    assert merged_sizes == [sum(1 for rows, _ in chunks for r in rows if r["host"] == "b")]


def test_parts_must_cover_the_table() -> None:
    table = pa.table({"host": ["a"], "region": ["e"], "time": [1], "v": [1], "w": [1]})
    with pytest.raises(ValueError):
        deduplicate_parts(table, KEYS, np.zeros(1, dtype=np.int64), [Part(2, True)], "time")
