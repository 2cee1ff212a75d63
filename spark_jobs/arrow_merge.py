"""The Python-worker side of the ARROW dedup strategy: merge one dedup group's files into deduplicated rows.

Runs inside Spark's Python workers (`mapInArrow`): each input row names a group's files (path, chunk order,
whether it is an ingester chunk) and optional inclusive time bounds; the output is Arrow batches in the dedup
node's schema, with Spark's types (unsigned as DECIMAL(20, 0)).
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from iox_planner.dedup import deduplicate_table
from iox_planner.model import CHUNK_ORDER, TIME, WRITE_SEQ, ColumnType

_ORDER_SHIFT = 32
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
               bounds: Sequence[int | None]) -> tuple[pa.Table, np.ndarray]:
    """All rows of a group's files with `columns` (missing ones NULL) and each row's packed write order."""
    tables = []
    orders = []
    lo, hi = bounds
    filters: list[tuple[str, str, int]] = []
    if lo is not None:
        filters.append((TIME, ">=", lo))
    if hi is not None:
        filters.append((TIME, "<=", hi))
    for path, order, ingester in files:
        present = set(pq.read_schema(path).names)
        wanted = [c for c in columns if c in present]
        if ingester:
            wanted.append(WRITE_SEQ)
        table = pq.read_table(path, columns=wanted, filters=filters or None)
        arrays = []
        for name in columns:
            arrow_type = ARROW_TYPES[types[name]]
            if name in present:
                arrays.append(table[name].cast(arrow_type))
            else:
                arrays.append(pa.nulls(table.num_rows, arrow_type))
        tables.append(pa.Table.from_arrays(arrays, names=list(columns)))
        base = np.int64(order) << np.int64(_ORDER_SHIFT)
        if ingester:
            orders.append(base + table[WRITE_SEQ].to_numpy().astype(np.int64))
        else:
            orders.append(np.full(table.num_rows, base, dtype=np.int64))
    return pa.concat_tables(tables), np.concatenate(orders) if orders else np.zeros(0, dtype=np.int64)


def merge_groups(batches: Iterator[pa.RecordBatch], schema: Sequence[str], keys: Sequence[str],
                 types: Mapping[str, str]) -> Iterator[pa.RecordBatch]:
    stored = [c for c in schema if c != CHUNK_ORDER]
    present_keys = [k for k in keys if k in stored]
    for batch in batches:
        for spec_text in batch.column("spec").to_pylist():
            spec = json.loads(spec_text)
            table, order = read_group(spec["files"], stored, types, spec["bounds"])
            merged, merged_order = deduplicate_table(table, present_keys, order)
            columns = {name: merged[name] for name in stored}
            columns[CHUNK_ORDER] = pa.array(merged_order, pa.int64())
            out = pa.table({name: columns[name] for name in schema})
            yield from out.to_batches(max_chunksize=65_536)
