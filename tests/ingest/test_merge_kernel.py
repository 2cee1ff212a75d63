"""The merge kernel (`dedup.deduplicate_table`, and `files.deduplicate` and `files.sort_table` built on it) against
references written here: a plain-Python IOx dedup (one row per tags + time, NULL tag equal to NULL tag, each
other column its last non-null value by (chunk order, write position), the merged rows sorted on the keys given,
NULLs first) and, for sorting, Arrow's own `sort_by`. Neither uses the code under test.

Random groups mix what persist, compaction and the query workers hand over: Parquet files sorted on the key
(sometimes not: the kernel must not trust that), ingester chunks unsorted with duplicates of their own, chunks
concatenated out of order, NULL tags and all-NULL tags and fields, columns a chunk lacks, keys 1 ns apart, the
unsigned 64-bit extremes, non-ASCII tags (sorted by their UTF-8 bytes, as Arrow and Spark sort them), times at
both ends of int64 and tags with so many values that their codes must be made dense. `IOX_MERGE_KERNEL_CASES`
sets how many (default 300).
"""

from __future__ import annotations

import os
import random
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pytest

from iox_planner.ingest import files as storage
from iox_planner.ingest.dedup import deduplicate_table
from iox_planner.model import TIME, WRITE_SEQ, ColumnType, pack_order

CASES = int(os.environ.get("IOX_MERGE_KERNEL_CASES", "300"))
U64_MAX = 2**64 - 1
TAG_VALUES = ["a", "b", "B", "é", "z", "ü", "a\u0301", "\U0001f600", ""]
FIELD_TYPES = {"f": pa.float64(), "i": pa.int64(), "u": pa.uint64(), "s": pa.string(), "b": pa.bool_()}
COLUMN_TYPES = {"f": ColumnType.FLOAT, "i": ColumnType.INTEGER, "u": ColumnType.UNSIGNED, "s": ColumnType.STRING,
                "b": ColumnType.BOOLEAN}

Row = dict[str, Any]


def _value(rng: random.Random, name: str) -> Any:
    if rng.random() < 0.3:
        return None
    if name == "f":
        return rng.choice([0.0, -0.0, 1.5, -2.25, 1e300])
    if name == "i":
        return rng.choice([0, -1, 7, -(2**63), 2**63 - 1])
    if name == "u":
        return rng.choice([0, 1, 2**63, U64_MAX - 1, U64_MAX])
    if name == "s":
        return rng.choice(["x", "y", "", "é"])
    return rng.choice([True, False])


def _times(rng: random.Random) -> list[int]:
    style = rng.choice(["near", "near", "apart", "extremes"])
    if style == "near":  # neighbours 1 ns apart
        base = rng.randint(0, 10**18)
        return [base + d for d in range(4)]
    if style == "apart":
        return [rng.randint(-(10**12), 10**12) for _ in range(4)]
    # Both ends of int64: a span too wide to shift into a code, ranked instead.
    return [-(2**63) + 1, -(2**63) + 2, 2**63 - 2, 2**63 - 1, 0]


def random_group(rng: random.Random, tags: Sequence[str], fields: Sequence[str],
                 wide_tags: bool) -> list[tuple[list[Row], bool, list[str]]]:
    """(rows, ingester, columns) per chunk, in write order. Parquet chunks have no duplicate keys; ingester
    chunks may repeat a key. A chunk may lack some tags and fields (then they are NULL for its rows)."""
    times = _times(rng)
    values = ([f"v{i}" for i in range(150)] if wide_tags else TAG_VALUES) + [None]
    chunks = []
    for _ in range(rng.randint(0, 5)):
        ingester = rng.random() < 0.4
        columns = [c for c in [*tags, *fields] if rng.random() < 0.8]
        rows: list[Row] = []
        seen: set[tuple[Any, ...]] = set()
        for _ in range(rng.randint(0, 12)):
            row = {t: (rng.choice(values) if t in columns else None) for t in tags}
            row[TIME] = rng.choice(times)
            key = tuple(row[t] for t in tags) + (row[TIME],)
            if key in seen and not ingester:
                continue
            seen.add(key)
            row.update({f: (_value(rng, f) if f in columns else None) for f in fields})
            rows.append(row)
        if ingester and rows and rng.random() < 0.5:  # the same key written again inside the chunk
            rows.append({**rng.choice(rows), **{f: _value(rng, f) for f in fields if f in columns}})
        chunks.append((rows, ingester, columns))
    return chunks


def reference(chunks: Sequence[tuple[list[Row], Any]], orders: Sequence[int], tags: Sequence[str],
              fields: Sequence[str], keys: Sequence[str]) -> list[tuple[Any, ...]]:
    """PRODUCT.md's dedup, row by row: (key values in `keys` order, fields, highest order), sorted on the keys
    ascending with NULLs first; strings compare by code point, which is their UTF-8 byte order."""
    written = [(order, position, row) for (rows, *_), order in zip(chunks, orders)
               for position, row in enumerate(rows)]
    merged: dict[tuple[Any, ...], Row] = {}
    for order, position, row in sorted(written, key=lambda w: (w[0], w[1])):
        out = merged.setdefault(tuple(row[k] for k in keys), {f: None for f in fields})
        out["__order"] = pack_order(order, position)
        for f in fields:
            if row[f] is not None:
                out[f] = row[f]
    ordered = sorted(merged.items(), key=lambda kv: [(v is not None, v) for v in kv[0]])
    return [(*k, *(m[f] for f in fields), m["__order"]) for k, m in ordered]


def _key_order(rng: random.Random, tags: Sequence[str]) -> list[str]:
    keys = [*rng.sample(list(tags), len(tags)), TIME]
    if rng.random() < 0.15:  # time need not be last
        keys = [TIME, *keys[:-1]]
    return keys


def _sorted_on(rows: list[Row], keys: Sequence[str]) -> list[Row]:
    return sorted(rows, key=lambda r: [(r[k] is not None, r[k]) for k in keys])


def _setup(seed: int) -> tuple[random.Random, list[str], list[str], list[str], Any, list[int]]:
    rng = random.Random(seed)
    tags = rng.sample(["host", "region", "rack"], rng.randint(1, 3))
    wide = rng.random() < 0.2
    if wide:  # many tags of many values: their codes overflow an int64 unless made dense
        tags = [f"t{i}" for i in range(10)]
    fields = rng.sample(list(FIELD_TYPES), rng.randint(1, len(FIELD_TYPES)))
    keys = _key_order(rng, tags)
    chunks = random_group(rng, tags, fields, wide)
    for i, (rows, ingester, columns) in enumerate(chunks):
        if not ingester and rng.random() < 0.85:  # a Parquet file is sorted on the key (mostly: never trusted)
            chunks[i] = (_sorted_on(rows, keys), ingester, columns)
    orders = sorted(rng.sample(range(1, 2**31), len(chunks)))
    return rng, tags, fields, keys, chunks, orders


def _tag_array(rng: random.Random, values: list[Any]) -> pa.Array:
    plain = pa.array(values, pa.string())
    style = rng.choice(["plain", "dictionary", "repeated"])
    if style == "plain":
        return plain
    encoded = plain.dictionary_encode()
    if style == "repeated" and len(encoded.dictionary):  # one value under two indices: still one tag
        dictionary = pa.concat_arrays([encoded.dictionary, encoded.dictionary])
        indices = [None if i is None else i + len(encoded.dictionary) * rng.randint(0, 1)
                   for i in encoded.indices.to_pylist()]
        return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), dictionary)
    return encoded


@pytest.mark.parametrize("seed", range(CASES))
def test_deduplicate_table_equals_the_reference(seed: int) -> None:
    """The kernel on one table of all chunks, concatenated oldest first or in any order, as one Arrow chunk per
    input chunk or combined."""
    rng, tags, fields, keys, chunks, orders = _setup(seed)
    layout = list(range(len(chunks)))
    if rng.random() < 0.3:
        rng.shuffle(layout)  # rows not in write order along the table: still merged by their order
    encoded = rng.random() < 0.6  # tags as read from Parquet (dictionary-encoded) or as plain strings
    pieces, order_parts = [], []
    for i in layout:
        rows = chunks[i][0]
        data = {t: _tag_array(rng, [r[t] for r in rows]) if encoded else pa.array([r[t] for r in rows], pa.string())
                for t in tags}
        data[TIME] = pa.array([r[TIME] for r in rows], pa.int64())
        data.update({f: pa.array([r[f] for r in rows], FIELD_TYPES[f]) for f in fields})
        if encoded:
            data.update({t: data[t] if pa.types.is_dictionary(data[t].type) else data[t].dictionary_encode()
                         for t in tags})
            data.update({t: data[t].cast(pa.dictionary(pa.int32(), pa.string())) for t in tags})
        pieces.append(pa.table(data))
        order_parts.append(pack_order(orders[i], 0) + np.arange(len(rows), dtype=np.int64))
    if not pieces:
        tag_type = pa.dictionary(pa.int32(), pa.string()) if encoded else pa.string()
        pieces = [pa.table({t: pa.array([], tag_type) for t in tags} | {TIME: pa.array([], pa.int64())}
                           | {f: pa.array([], FIELD_TYPES[f]) for f in fields})]
        order_parts = [np.zeros(0, dtype=np.int64)]
    table = pa.concat_tables(pieces)
    if encoded and rng.random() < 0.5:  # one dictionary across the chunks, as the workers read them
        table = table.unify_dictionaries().combine_chunks()
    merged, order = deduplicate_table(table, keys, np.concatenate(order_parts))
    got = [(*(row[k] for k in keys), *(row[f] for f in fields), int(o))
           for row, o in zip(merged.to_pylist(), order)]
    assert got == reference(chunks, orders, tags, fields, keys)


@pytest.mark.parametrize("seed", range(CASES))
def test_files_deduplicate_equals_the_reference(seed: int) -> None:
    """Persist's and compaction's entry point: parts as read (ingester chunks with `__seq`, Parquet files
    without), each with only its own columns; the result has every column, sorted on the sort key given."""
    rng, tags, fields, keys, chunks, orders = _setup(seed + 10**6)
    sort_key = [k for k in keys if k != TIME] + [TIME]
    columns = {**{t: ColumnType.TAG for t in tags}, **{f: COLUMN_TYPES[f] for f in fields}, TIME: ColumnType.TIME}
    parts = []
    for (rows, ingester, present), order in zip(chunks, orders):
        data: dict[str, pa.Array] = {}
        for name in storage.column_layout(columns):
            if name == TIME:
                data[name] = pa.array([r[TIME] for r in rows], pa.int64())
            elif name in present:
                data[name] = (_tag_array(rng, [r[name] for r in rows]) if name in tags
                              else pa.array([r[name] for r in rows], FIELD_TYPES[name]))
        if ingester:  # write positions as stored, in row order
            data[WRITE_SEQ] = pa.array(range(len(rows)), pa.int64())
        parts.append((order, pa.table(data)))
    keep = rng.random() < 0.5
    merged = storage.deduplicate(parts, columns, sort_key=sort_key, keep_dictionary=keep)
    assert merged.column_names == storage.column_layout(columns)
    got = [(*(row[k] for k in sort_key), *(row[f] for f in fields)) for row in merged.to_pylist()]
    expected = [row[:-1] for row in reference(chunks, orders, tags, fields, sort_key)]
    assert got == expected


def test_files_deduplicate_of_no_parts_and_of_empty_parts() -> None:
    columns = {"host": ColumnType.TAG, "u": ColumnType.UNSIGNED, TIME: ColumnType.TIME}
    assert storage.deduplicate([], columns).num_rows == 0
    empty = pa.table({"host": pa.array([], pa.string()), TIME: pa.array([], pa.int64())})
    merged = storage.deduplicate([(1, empty), (2, empty)], columns, sort_key=["host", TIME])
    assert merged.num_rows == 0 and merged.column_names == ["host", "u", TIME]


def test_a_newer_null_keeps_the_older_value_and_unsigned_max_survives() -> None:
    """PRODUCT.md's example, with the extremes of uint64: (A, f1=2) then (A, f2=3) gives (A, f1=2, f2=3)."""
    columns = {"t": ColumnType.TAG, "f1": ColumnType.UNSIGNED, "f2": ColumnType.UNSIGNED, TIME: ColumnType.TIME}
    old = pa.table({"t": ["A", None], "f1": pa.array([U64_MAX, 0], pa.uint64()), TIME: [5, 5]})
    new = pa.table({"t": pa.array(["A", None, None]).dictionary_encode(), "f2": pa.array([3, None, 1], pa.uint64()),
                    TIME: [5, 6, 5], WRITE_SEQ: [0, 1, 2]})
    merged = storage.deduplicate([(1, old), (2, new)], columns, sort_key=["t", TIME])
    assert merged.to_pylist() == [{"t": None, "f1": 0, "f2": 1, TIME: 5}, {"t": None, "f1": None, "f2": None, TIME: 6},
                                  {"t": "A", "f1": U64_MAX, "f2": 3, TIME: 5}]


@pytest.mark.parametrize("seed", range(max(1, CASES // 3)))
def test_sort_table_sorts_as_arrow_does(seed: int) -> None:
    """`files.sort_table` (integer codes, one stable sort) against Arrow's `sort_by` on the same columns."""
    rng = random.Random(seed)
    tags = rng.sample(["host", "region", "rack", "os"], rng.randint(1, 4))
    values = [*TAG_VALUES, None]
    n = rng.randint(0, 60)
    times = _times(rng)
    table = pa.table({**{t: _tag_array(rng, [rng.choice(values) for _ in range(n)]).cast(pa.string()) for t in tags},
                      TIME: pa.array([rng.choice(times) for _ in range(n)], pa.int64()),
                      "v": pa.array(range(n), pa.int64())})  # equal keys keep their row order (a stable sort)
    key = _key_order(rng, tags)
    expected = table.sort_by([(c, "ascending", "at_start") for c in key])
    assert storage.sort_table(table, key).to_pylist() == expected.to_pylist()
