"""What the planner derives from chunks: dedup keys, file sort keys, and the scan leaves over a set of chunks."""

from __future__ import annotations

from operator import attrgetter
from typing import Iterable, Mapping, Sequence

from iox_planner.model import CHUNK_ORDER, TIME, Chunk, ChunkKind, ColumnType, TableSchema
from iox_planner.planner.nodes import ParquetExec, PlanNode, RecordBatchesExec, SortItem

_NO_TIME = -(2**63) - 1  # sorts before every known time


def canonical_columns(schema: TableSchema) -> tuple[str, ...]:
    """The order of every scan-tree schema: `__chunk_order`, tags, fields (each by name), `time`."""
    return (CHUNK_ORDER, *schema.star_columns)


def key_columns(schema: TableSchema) -> frozenset[str]:
    """The primary key: every tag and `time`."""
    return frozenset(c for c, t in schema.columns.items() if t.is_key) | {TIME}


def field_columns(schema: TableSchema) -> frozenset[str]:
    return frozenset(c for c, t in schema.columns.items() if t.is_field)


class SortKeys:
    """Dedup keys and file sort keys of one table, with the partition keys worked out once each."""

    def __init__(self, schema: TableSchema, sort_keys: Mapping[str, tuple[str, ...]]) -> None:
        self.schema = schema
        self.sort_keys = sort_keys
        self.tags = schema.tags
        self._partition: dict[str | None, tuple[str, ...]] = {}
        self._items: dict[tuple[str, ...], tuple[SortItem, ...]] = {}
        self._single: dict[tuple[str, int], tuple[Mapping[str, ColumnType], tuple[SortItem, ...]]] = {}

    def _complete(self, base: Sequence[str]) -> tuple[str, ...]:
        """A partition sort key made total: key columns only, tags it lacks just before `time` (by name)."""
        tags = set(self.tags)
        key = [c for c in base if c in tags]
        key += [t for t in self.tags if t not in key]
        return (*key, TIME)

    def partition_key(self, partition: str | None) -> tuple[str, ...]:
        """The sort key of one partition (None: of several that disagree): the catalog's, else tags by name."""
        found = self._partition.get(partition)
        if found is None:
            base = self.sort_keys.get(partition, self.tags) if partition is not None else self.tags
            found = self._partition[partition] = self._complete(base)
        return found

    def shared_key(self, chunks: Sequence[Chunk]) -> tuple[str, ...]:
        first = chunks[0].partition
        if all(c.partition == first for c in chunks):
            return self.partition_key(first)
        keys = {self.partition_key(p) for p in {c.partition for c in chunks}}
        return keys.pop() if len(keys) == 1 else self.partition_key(None)

    def dedup_key(self, chunks: Sequence[Chunk]) -> tuple[SortItem, ...]:
        """The partition sort key restricted to the key columns that at least one of `chunks` has."""
        if len(chunks) == 1:
            chunk = chunks[0]
            memo = (chunk.partition, id(chunk.columns))
            found = self._single.get(memo)
            if found is None or found[0] is not chunk.columns:
                found = self._single[memo] = (chunk.columns, self._dedup_key(chunks))
            return found[1]
        return self._dedup_key(chunks)

    def _dedup_key(self, chunks: Sequence[Chunk]) -> tuple[SortItem, ...]:
        key = self.shared_key(chunks)
        absent = set(key)
        absent.discard(TIME)
        for chunk in chunks:  # usually the first chunk already has every key column
            if absent:
                absent.difference_update(chunk.columns.keys())
            else:
                break
        columns = tuple(c for c in key if c not in absent)
        items = self._items.get(columns)
        if items is None:
            items = self._items[columns] = tuple(SortItem(c) for c in columns)
        return items

    def file_sort_key(self, chunk: Chunk) -> tuple[str, ...]:
        """What a Parquet file is sorted on: its own sort key, else its partition's restricted to its columns."""
        if chunk.sort_key:
            return tuple(chunk.sort_key)
        return tuple(c for c in self.partition_key(chunk.partition) if c in chunk.columns or c == TIME)

    def sorted_on(self, chunk: Chunk, key: Sequence[SortItem]) -> bool:
        """Whether a Parquet file's rows come out in `key` order (columns it lacks are NULL, hence constant)."""
        if chunk.kind is not ChunkKind.PARQUET or any(s.descending for s in key):
            return False
        expected = tuple(s.column for s in key if s.column in chunk.columns or s.column == TIME)
        return self.file_sort_key(chunk) == expected


_ORDER = attrgetter("order", "id")


def by_order(chunks: Iterable[Chunk]) -> list[Chunk]:
    return sorted(chunks, key=_ORDER)


def deal(files: Sequence[Chunk], groups: int) -> tuple[tuple[Chunk, ...], ...]:
    """Files ordered by chunk order, dealt round-robin into at most `groups` file groups."""
    if len(files) == 1:
        return ((files[0],),)
    ordered = by_order(files)
    n = max(1, min(groups, len(ordered)))
    return tuple(tuple(ordered[i::n]) for i in range(n))


def scan_leaves(chunks: Sequence[Chunk], projection: tuple[str, ...], target_partitions: int) -> list[PlanNode]:
    """One RecordBatchesExec over the ingester chunks, one ParquetExec per store (files dealt into groups)."""
    leaves: list[PlanNode] = []
    ingester = [c for c in chunks if c.kind is ChunkKind.INGESTER]
    if ingester:
        leaves.append(RecordBatchesExec(tuple(by_order(ingester)), projection))
    stores: dict[str, list[Chunk]] = {}
    for chunk in chunks:
        if chunk.kind is ChunkKind.PARQUET:
            stores.setdefault(chunk.store, []).append(chunk)
    for store in sorted(stores):
        leaves.append(ParquetExec(store, deal(stores[store], target_partitions), projection))
    return leaves


def node_order(node: PlanNode) -> tuple[int, int, str, str]:
    """`group_order` of the chunks a node scans."""
    if isinstance(node, ParquetExec) and len(node.file_groups) == 1 and len(node.file_groups[0]) == 1:
        return group_order(node.file_groups[0])
    return group_order(node.scanned_chunks())


def group_order(chunks: Sequence[Chunk]) -> tuple[int, int, str, str]:
    """Where a group of chunks stands among its siblings: (min time, min chunk order, partition, chunk id)."""
    if len(chunks) == 1:
        c = chunks[0]
        return (c.time_min if c.time_min is not None else _NO_TIME, c.order, c.partition, c.id)
    return (
        min((c.time_min if c.time_min is not None else _NO_TIME) for c in chunks),
        min(c.order for c in chunks),
        min(c.partition for c in chunks),
        min(c.id for c in chunks),
    )


def column_types(schema: TableSchema, columns: Sequence[str]) -> tuple[tuple[str, ColumnType], ...]:
    return tuple((c, schema.columns.get(c, ColumnType.TIME if c == TIME else ColumnType.INTEGER)) for c in columns)
