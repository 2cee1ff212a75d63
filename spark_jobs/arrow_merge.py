"""The Python-worker side of the ARROW dedup strategy: merge one dedup group's files into deduplicated rows.

Runs inside Spark's Python workers (`mapInArrow`): each input row is a group id; its spec names the group's files
(`store_read.FileRef`: chunk, path under the warehouse, order, whether it is an ingester chunk, size) and optional
inclusive time bounds; the files are read through the warehouse's filesystem (a local folder or a store, the same
code); the output is Arrow batches in the dedup node's schema, with Spark's types (unsigned as DECIMAL(20, 0)).
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa

from iox_planner.ingest.dedup import Part, deduplicate_parts
from iox_planner.model import CHUNK_ORDER, ORDER_SHIFT, TIME, WRITE_ORDER, WRITE_SEQ, ColumnType
from iox_planner.objectstore import Root, parse_root
from spark_jobs.store_read import FileRef, OpenFile, arrow_type


def read_group(root: Root, files: Sequence[Sequence[Any]], columns: Sequence[str], types: Mapping[str, str],
               bounds: Sequence[int | None]) -> tuple[pa.Table, np.ndarray, list[Part]]:
    """All rows of a group's files with `columns` (missing ones NULL), each row's packed write order, and which
    rows came from which file (`dedup.Part`: a Parquet file is duplicate-free, an ingester chunk may not be). Tags
    are read dictionary-encoded (as Parquet stores them) with one dictionary across the group, so the merge
    compares integers and never materializes tag strings it does not emit."""
    tables = []
    orders = []
    parts = []
    tags = [c for c in columns if types[c] == ColumnType.TAG.value]
    for item in files:
        ref = FileRef.from_json(item)
        order, ingester = ref.order, ref.ingester
        opened = OpenFile(root, ref, dictionary=tags)
        present = opened.names
        table = opened.table([*columns, WRITE_SEQ] if ingester else columns, bounds)
        arrays = []
        for name in columns:
            target = arrow_type(types[name])
            if name in tags:
                target = pa.dictionary(pa.int32(), pa.string())
            if name == WRITE_ORDER:
                # A file's own per-row write orders where it has them, else the chunk's order (model.WRITE_ORDER).
                own = table[name].cast(pa.int64()) if name in present and not ingester else None
                fill = pa.scalar(int(order), pa.int64())
                arrays.append(own.fill_null(fill) if own is not None
                              else pa.array(np.full(table.num_rows, int(order), dtype=np.int64)))
            elif name in present:
                column = table[name]
                arrays.append(column if column.type == target else column.cast(target))
            else:
                arrays.append(pa.nulls(table.num_rows, target))
        tables.append(pa.Table.from_arrays(arrays, names=list(columns)))
        parts.append(Part(table.num_rows, duplicate_free=not ingester))
        base = np.int64(order) << np.int64(ORDER_SHIFT)
        if ingester:
            orders.append(base + table[WRITE_SEQ].to_numpy().astype(np.int64))
        else:
            orders.append(np.full(table.num_rows, base, dtype=np.int64))
    table = pa.concat_tables(tables).unify_dictionaries().combine_chunks()
    return table, np.concatenate(orders) if orders else np.zeros(0, dtype=np.int64), parts


def merge_groups(batches: Iterator[pa.RecordBatch], root_uri: str, specs: Sequence[str], schema: Sequence[str],
                 keys: Sequence[str], types: Mapping[str, str],
                 output: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Merge each group whose id (column `id`, an index into `specs`) a batch holds. `output` (default: `schema`)
    is what leaves the worker: only the columns
    the plan reads above the dedup, since moving columns from Python to the JVM is the costly part. Value
    columns nobody reads are not even read: columns merge independently."""
    emit = list(output or schema)
    stored = [c for c in schema if c != CHUNK_ORDER and (c in keys or c in emit)]
    present_keys = [k for k in keys if k in stored]
    root = parse_root(root_uri, what="the warehouse")
    for batch in batches:
        for group in batch.column("id").to_pylist():
            spec = json.loads(specs[group])
            table, order, parts = read_group(root, spec["files"], stored, types, spec["bounds"])
            # Rows of series no other file holds pass unmerged (and unsorted: nothing above relies on order).
            merged, merged_order = deduplicate_parts(table, present_keys, order, parts, TIME)
            columns: dict[str, Any] = {}
            for name in emit:
                if name == CHUNK_ORDER:
                    columns[name] = pa.array(merged_order, pa.int64())
                elif pa.types.is_dictionary(merged[name].type):
                    columns[name] = merged[name].cast(pa.string())
                else:
                    columns[name] = merged[name]
            yield from pa.table(columns).to_batches(max_chunksize=65_536)
