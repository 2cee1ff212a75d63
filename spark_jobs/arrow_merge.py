"""The Python-worker side of the ARROW dedup strategy: merge one dedup group's files into deduplicated rows.

Runs inside Spark's Python workers (`mapInArrow`): each input row is a group id; its spec names the group's files
(path, chunk order, whether it is an ingester chunk) and optional inclusive time bounds, and for a group split for
pass-through its base files and the late chunks' values (then only rows that may have a duplicate are merged and
emitted here); the output is Arrow batches in the dedup node's schema, with Spark's types (unsigned as
DECIMAL(20, 0)).
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from iox_planner.ingest.dedup import deduplicate_table, may_meet
from iox_planner.model import CHUNK_ORDER, ORDER_SHIFT, TIME, WRITE_SEQ, ColumnType

ARROW_TYPES: Mapping[str, pa.DataType] = {
    ColumnType.TAG.value: pa.string(),
    ColumnType.FLOAT.value: pa.float64(),
    ColumnType.INTEGER.value: pa.int64(),
    ColumnType.UNSIGNED.value: pa.decimal128(20, 0),
    ColumnType.BOOLEAN.value: pa.bool_(),
    ColumnType.STRING.value: pa.string(),
    ColumnType.TIME.value: pa.int64(),
}


def read_group(files: Sequence[Sequence[Any]], columns: Sequence[str], types: Mapping[str, str],
               bounds: Sequence[int | None]) -> tuple[pa.Table, np.ndarray, list[int]]:
    """All rows of a group's files with `columns` (missing ones NULL), each row's packed write order, and how many
    rows each file gave (in file order). Tags are read dictionary-encoded (as Parquet stores them) with one dictionary
    across the group, so the merge compares integers and never materializes tag strings it does not emit."""
    tables = []
    orders = []
    sizes = []
    lo, hi = bounds
    filters: list[tuple[str, str, int]] = []
    if lo is not None:
        filters.append((TIME, ">=", lo))
    if hi is not None:
        filters.append((TIME, "<=", hi))
    tags = [c for c in columns if types[c] == ColumnType.TAG.value]
    for path, order, ingester in files:
        present = set(pq.read_schema(path).names)
        wanted = [c for c in columns if c in present]
        if ingester:
            wanted.append(WRITE_SEQ)
        table = pq.read_table(path, columns=wanted, filters=filters or None,
                              read_dictionary=[t for t in tags if t in present])
        arrays = []
        for name in columns:
            arrow_type = ARROW_TYPES[types[name]]
            if name in tags:
                arrow_type = pa.dictionary(pa.int32(), pa.string())
            if name in present:
                column = table[name]
                arrays.append(column if column.type == arrow_type else column.cast(arrow_type))
            else:
                arrays.append(pa.nulls(table.num_rows, arrow_type))
        tables.append(pa.Table.from_arrays(arrays, names=list(columns)))
        sizes.append(table.num_rows)
        base = np.int64(order) << np.int64(ORDER_SHIFT)
        if ingester:
            orders.append(base + table[WRITE_SEQ].to_numpy().astype(np.int64))
        else:
            orders.append(np.full(table.num_rows, base, dtype=np.int64))
    table = pa.concat_tables(tables).unify_dictionaries().combine_chunks()
    return table, np.concatenate(orders) if orders else np.zeros(0, dtype=np.int64), sizes


def _without_passing_rows(table: pa.Table, order: np.ndarray, sizes: Sequence[int], base: Sequence[int],
                          late_values: Mapping[str, Sequence[str | None]]) -> tuple[pa.Table, np.ndarray]:
    """The rows this worker merges when the group is split (`execute.py`, pass-through): every row of the late
    files, and the rows of the base files that may meet one of theirs. The base files' other rows are emitted by
    Spark's scan, never here."""
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    in_base = np.zeros(table.num_rows, dtype=bool)
    for i in base:
        in_base[starts[i]:starts[i + 1]] = True
    keep = ~in_base
    keep[in_base] = may_meet(table.filter(pa.array(in_base)), late_values)
    return table.filter(pa.array(keep)), order[keep]


def merge_groups(batches: Iterator[pa.RecordBatch], specs: Sequence[str], schema: Sequence[str],
                 keys: Sequence[str], types: Mapping[str, str],
                 output: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Merge each group whose id (column `id`, an index into `specs`) a batch holds. `output` (default: `schema`)
    is what leaves the worker: only the columns
    the plan reads above the dedup, since moving columns from Python to the JVM is the costly part. Value
    columns nobody reads are not even read: columns merge independently."""
    emit = list(output or schema)
    stored = [c for c in schema if c != CHUNK_ORDER and (c in keys or c in emit)]
    present_keys = [k for k in keys if k in stored]
    for batch in batches:
        for group in batch.column("id").to_pylist():
            spec = json.loads(specs[group])
            table, order, sizes = read_group(spec["files"], stored, types, spec["bounds"])
            if spec.get("base"):
                table, order = _without_passing_rows(table, order, sizes, spec["base"], spec["late_values"])
            merged, merged_order = deduplicate_table(table, present_keys, order)
            columns: dict[str, Any] = {}
            for name in emit:
                if name == CHUNK_ORDER:
                    columns[name] = pa.array(merged_order, pa.int64())
                elif pa.types.is_dictionary(merged[name].type):
                    columns[name] = merged[name].cast(pa.string())
                else:
                    columns[name] = merged[name]
            yield from pa.table(columns).to_batches(max_chunksize=65_536)
