"""Chunk files' contents: Arrow tables from points, IOx deduplication, sort keys, tag ranges, reading a chunk.
(Where files go and how they are written atomically: `storage.py`.)

Time is stored as int64 nanoseconds (Spark reads Parquet nanosecond timestamps only as plain longs); ingester
chunks also keep each row's write position in `__seq`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping, Sequence, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from iox_planner.errors import CatalogError
from iox_planner.ingest import arrow_np
from iox_planner.ingest.lineprotocol import Point
from iox_planner.model import TIME, WRITE_ORDER, WRITE_SEQ, ColumnType, pack_order
from iox_planner.objectstore import Root, store_errors

ARROW_TYPES: Mapping[ColumnType, pa.DataType] = {
    ColumnType.TAG: pa.string(),
    ColumnType.FLOAT: pa.float64(),
    ColumnType.INTEGER: pa.int64(),
    ColumnType.UNSIGNED: pa.uint64(),
    ColumnType.BOOLEAN: pa.bool_(),
    ColumnType.STRING: pa.string(),
    ColumnType.TIME: pa.int64(),
}


def column_layout(columns: Mapping[str, ColumnType]) -> list[str]:
    """File column order: tags by name, fields by name, then time."""
    tags = sorted(c for c, t in columns.items() if t is ColumnType.TAG)
    fields = sorted(c for c, t in columns.items() if t.is_field)
    return [*tags, *fields, TIME]


def arrow_schema(columns: Mapping[str, ColumnType], *, with_seq: bool = False) -> pa.Schema:
    names = column_layout(columns)
    schema = pa.schema([pa.field(n, ARROW_TYPES[columns[n]], nullable=n != TIME) for n in names])
    if with_seq:
        schema = schema.append(pa.field(WRITE_SEQ, pa.int64(), nullable=False))
    return schema


def points_to_table(points: Sequence[Point], columns: Mapping[str, ColumnType]) -> pa.Table:
    """Rows in write order, with `__seq` = write position, columns as `column_layout`. Each column is built from
    the values its points hold (then spread over the rows), so a point costs its own tags and fields, never every
    column of the table: many columns each on few lines stay linear."""
    positions: dict[str, list[int]] = {name: [] for name in columns}
    values: dict[str, list[object]] = {name: [] for name in columns}
    for row, point in enumerate(points):
        for name, value in point.tags.items():
            if columns.get(name) is ColumnType.TAG:
                positions[name].append(row)
                values[name].append(value)
        for name, (_, field_value) in point.fields.items():
            ctype = columns.get(name)
            if ctype is not None and ctype.is_field:
                positions[name].append(row)
                values[name].append(field_value)
    n = len(points)
    schema = arrow_schema(columns, with_seq=True)
    # arrow_np, not pa.array: pa.array imports pandas (a third of a CPU-second) on first use.
    arrays = []
    for f in schema:
        if f.name == TIME:
            arrays.append(arrow_np.from_numpy(np.fromiter((p.time for p in points), dtype=np.int64, count=n)))
        elif f.name == WRITE_SEQ:
            arrays.append(arrow_np.from_numpy(np.arange(n, dtype=np.int64)))
        elif f.type == pa.string():  # positions ascend: rows are visited in order
            arrays.append(arrow_np.spread_strings(n, np.array(positions[f.name], dtype=np.int64),
                                                  cast(list[str], values[f.name])))
        else:
            arrays.append(arrow_np.scatter(n, np.array(positions[f.name], dtype=np.int64),
                                           arrow_np.column(values[f.name], f.type)))
    return pa.Table.from_arrays(arrays, schema=schema)


def chunk_columns(points: Iterable[Point]) -> dict[str, ColumnType]:
    """The columns a set of points has (tags, fields with their types, time)."""
    columns: dict[str, ColumnType] = {}
    for point in points:
        for tag in point.tags:
            columns[tag] = ColumnType.TAG
        for name, (ctype, _) in point.fields.items():
            columns[name] = ctype
    columns[TIME] = ColumnType.TIME
    return columns


def _used_values(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A dictionary-encoded column's values as plain values, each at least once: the values its rows use, not the
    whole dictionary (it may hold values no row kept), and few (a dictionary's values, not every row's). Other
    columns as they are."""
    if not pa.types.is_dictionary(column.type):
        return column
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    return pa.chunked_array([c.dictionary.take(pc.unique(c.indices).drop_null()) for c in chunks],
                            type=column.type.value_type)


def tag_ranges(table: pa.Table, columns: Mapping[str, ColumnType]) -> dict[str, tuple[str, str]]:
    """Per tag (min, max) of its non-null values; a tag with no values has no range."""
    out: dict[str, tuple[str, str]] = {}
    names = set(table.column_names)  # a set: a list per tag would make a wide table quadratic
    for name, ctype in columns.items():
        if ctype is ColumnType.TAG and name in names:
            mm = pc.min_max(_used_values(table[name])).as_py()
            if mm["min"] is not None:
                out[name] = (mm["min"], mm["max"])
    return out


def derive_sort_key(table: pa.Table, columns: Mapping[str, ColumnType]) -> list[str]:
    """Tags by ascending number of distinct values (ties by name), then time. Deduplication keeps every tag value
    (each key keeps a row), so the rows before a merge give the same key as the merged rows."""
    tags = [c for c, t in columns.items() if t is ColumnType.TAG]
    names = set(table.column_names)
    counts = {tag: pc.count_distinct(_used_values(table[tag])).as_py() if tag in names else 0 for tag in tags}
    return [*sorted(tags, key=lambda t: (counts[t], t)), TIME]


def extend_sort_key(sort_key: Sequence[str], columns: Mapping[str, ColumnType], table: pa.Table) -> list[str]:
    """A fixed sort key stays; tags that appear later go just before time (ordered as a fresh key would be)."""
    known = set(sort_key)
    new_tags = [c for c in derive_sort_key(table, columns) if c != TIME and c not in known]
    head = [c for c in sort_key if c != TIME]
    return [*head, *new_tags, TIME]


def sort_table(table: pa.Table, sort_key: Sequence[str]) -> pa.Table:
    """Sort on the key, ascending, NULLs first (Spark's ascending default), as Arrow's `sort_by` would; through
    the dedup's integer codes of the key columns (one stable integer sort instead of comparing strings column by
    column: rows already sorted on a prefix of the key cost a pass)."""
    from iox_planner.ingest.dedup import sort_indices

    keys = [c for c in sort_key if c in table.column_names]
    if not keys:
        return table
    return table.take(arrow_np.from_numpy(sort_indices(table, keys)))


def deduplicate(parts: Sequence[tuple[int, pa.Table]], columns: Mapping[str, ColumnType],
                sort_key: Sequence[str] | None = None, *, keep_dictionary: bool = False,
                write_orders: bool = False) -> pa.Table:
    """IOx deduplication of `(chunk order, table)` parts: one row per primary key (tags + time, NULL tag equals
    NULL tag); every other column takes its last non-null value by chunk order, then write position (`__seq`).
    Parts may lack columns; the result has all of `columns` and no `__seq`. Tags a part holds dictionary encoded (as
    `read_dictionary` reads them) stay so through the merge, which then compares integers and moves indices; the
    result has plain strings as `arrow_schema` says. The merge itself is THE one Arrow
    dedup, `dedup.deduplicate_table` (the Spark runner's workers use it too), ranked by `pack_order`. With
    `sort_key` (the primary key's columns in sort order), the rows come out sorted on it: no sort needed after.
    `keep_dictionary`: the tags merged dictionary encoded stay so in the result (a writer that encodes them as
    Parquet dictionaries anyway then skips expanding them to strings and hashing them back). `write_orders`: the
    result also has `__write_order` (model.WRITE_ORDER), each key's newest write order: a part's own column where
    it has one (a persisted or compacted file), else the part's order, merged as a never-null field is (the
    newest row's), which persist and compaction write so that a changes read can tell which keys came when."""
    import numpy as np

    from iox_planner.ingest.dedup import deduplicate_table

    schema = arrow_schema(columns)
    if write_orders:
        schema = schema.append(pa.field(WRITE_ORDER, pa.int64(), nullable=False))
    # A tag column is dictionary encoded in the merge when any part has it so (all parts must then agree).
    encoded = {name for _, part in parts for name in part.column_names
               if name in columns and columns[name] is ColumnType.TAG and pa.types.is_dictionary(part[name].type)}
    merge_schema = pa.schema([f.with_type(pa.dictionary(pa.int32(), pa.string())) if f.name in encoded else f
                              for f in schema])
    aligned = []
    ranks = []
    for order, part in parts:
        arrays = [_write_orders(part, order) if f.name == WRITE_ORDER
                  else part[f.name].cast(f.type) if f.name in part.column_names else pa.nulls(len(part), f.type)
                  for f in merge_schema]
        aligned.append(pa.Table.from_arrays(arrays, schema=merge_schema))
        seq = (part[WRITE_SEQ].to_numpy() if WRITE_SEQ in part.column_names
               else np.arange(len(part), dtype=np.int64)).astype(np.int64)
        ranks.append(pack_order(order, 0) + seq)
    if not aligned:
        return schema.empty_table()
    keys = [n for n in schema.names if n in columns and columns[n].is_key]
    if sort_key is not None:
        if sorted(sort_key) != sorted(keys):
            raise ValueError(f"sort key {list(sort_key)} is not an order of the primary key {keys}")
        keys = list(sort_key)
    table = pa.concat_tables(aligned)
    if encoded:
        table = table.unify_dictionaries()
    merged, _ = deduplicate_table(table, keys, np.concatenate(ranks))
    return merged.select(schema.names).cast(merge_schema if keep_dictionary else schema)


def _write_orders(part: pa.Table, order: int) -> pa.Array | pa.ChunkedArray:
    """A part's per-row write orders: its own where it has them, else its chunk order."""
    if WRITE_ORDER in part.column_names:
        return part[WRITE_ORDER].cast(pa.int64()).fill_null(pa.scalar(order, pa.int64()))
    return arrow_np.from_numpy(np.full(len(part), order, dtype=np.int64))


def dictionary_columns(columns: Mapping[str, ColumnType]) -> list[str]:
    """The columns worth a Parquet dictionary in a freshly written chunk: tags and strings (few distinct values),
    and time (many series share each timestamp). Numeric fields rarely repeat: a dictionary of them is built
    only to be dropped when it grows too large, about a third of the time a write spends in Parquet."""
    return [name for name, ctype in columns.items()
            if ctype in (ColumnType.TAG, ColumnType.STRING, ColumnType.TIME)]


def read_chunk(root: Root, rel: str, chunk_id: str, dictionary: Sequence[str] = ()) -> pa.Table:
    """Read a chunk's file `rel` under the warehouse `root` (`dictionary`: these columns dictionary-encoded, as
    Parquet stores them; a name the file lacks is ignored); a missing or corrupt file is an error naming the file
    and its chunk, a store that does not answer the retryable `StoreUnavailableError`."""
    path = root.uri_of(rel)
    try:
        with store_errors(root, "read", rel):
            return pq.read_table(root.path(rel), filesystem=root.filesystem(),
                                 read_dictionary=list(dictionary) or None)
    except FileNotFoundError as err:
        raise CatalogError(f"chunk {chunk_id}: its file {path} is missing from the warehouse") from err
    except (pa.ArrowInvalid, OSError) as err:
        raise CatalogError(f"chunk {chunk_id}: its file {path} cannot be read as Parquet ({err})") from err


def partition_sort_key(
    fixed: Sequence[str] | None, columns: Mapping[str, ColumnType], data: pa.Table
) -> list[str]:
    """The partition's sort key after persisting `data`: fixed at the first persist, later tags before time."""
    if fixed is None:
        return derive_sort_key(data, columns)
    return extend_sort_key(fixed, columns, data)
