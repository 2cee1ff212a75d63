"""What a pass knows besides the plan: the settings, the scan's table and partition sort keys, and a place to say
why the plan is the way it is (notes shown by EXPLAIN)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping, Sequence

from iox_planner.model import Chunk, ChunkKind, TableSchema
from iox_planner.planner.chunks import SortKeys, field_columns, key_columns, scan_leaves
from iox_planner.planner.nodes import DeduplicateExec, ParquetExec, PlanNode, RecordBatchesExec, UnionExec
from iox_planner.planner.settings import PlannerSettings


@dataclass
class PassContext:
    settings: PlannerSettings
    schema: TableSchema
    sort_keys: Mapping[str, tuple[str, ...]]
    label: str
    """The scan, as notes name it: `__iox_scan_0 (h2o)`."""
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.notes.append(f"{self.label}: {text}")

    @cached_property
    def keys(self) -> SortKeys:
        return SortKeys(self.schema, self.sort_keys)

    @cached_property
    def key_columns(self) -> frozenset[str]:
        return key_columns(self.schema)

    @cached_property
    def field_columns(self) -> frozenset[str]:
        return field_columns(self.schema)

    def dedup(self, chunks: Sequence[Chunk], projection: tuple[str, ...]) -> DeduplicateExec:
        """A DeduplicateExec over exactly `chunks` (through a union if they need several scans), with their own
        dedup key."""
        child: PlanNode
        if len(chunks) == 1 and chunks[0].kind is ChunkKind.PARQUET:
            child = ParquetExec.single(chunks[0], projection)
        else:
            leaves = scan_leaves(chunks, projection, self.settings.target_partitions)
            child = leaves[0] if len(leaves) == 1 else UnionExec(tuple(leaves))
        return DeduplicateExec.trusted(self.keys.dedup_key(chunks), child)


def leaf_chunks(node: PlanNode) -> list[Chunk] | None:
    """The chunks of a scan leaf or of a union of scan leaves with no predicate pushed yet; None otherwise (a
    split only applies to a dedup straight over its chunks, as IOx's do)."""
    inputs = node.inputs if isinstance(node, UnionExec) else (node,)
    out: list[Chunk] = []
    for leaf in inputs:
        if isinstance(leaf, RecordBatchesExec):
            out.extend(leaf.chunks)
        elif isinstance(leaf, ParquetExec) and not leaf.predicate:
            out.extend(leaf.files())
        else:
            return None
    return out
