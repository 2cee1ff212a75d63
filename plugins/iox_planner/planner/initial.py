"""The initial plan of seed 000: correct and naive, one deduplication over every chunk of the scan.

```yaml
ProjectionExec:                 # the columns the reference needs
  FilterExec:                   # its pushed conjuncts and the query's time range (omitted when none)
    DeduplicateExec:            # the dedup key of all the chunks
      UnionExec:                # only if there are several scans ("optional" in seed 000)
        - RecordBatchesExec     # every ingester chunk
        - ParquetExec: {store: A}   # every file of store A, dealt into target_partitions groups
```
Leaves read every column of the table plus the virtual `__chunk_order` (and `hidden` columns: a changes read's
`__write_order`, which its filter reads above the dedup and the projection drops). No chunk left: `EmptyExec`.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from iox_planner.model import Chunk, TableSchema
from iox_planner.planner.chunks import SortKeys, canonical_columns, scan_leaves
from iox_planner.planner.nodes import DeduplicateExec, EmptyExec, FilterExec, PlanNode, ProjectionExec, UnionExec
from iox_planner.planner.predicate import Conjunct
from iox_planner.planner.settings import PlannerSettings


def initial_plan(chunks: Sequence[Chunk], schema: TableSchema, sort_keys: Mapping[str, tuple[str, ...]],
                 columns: tuple[str, ...], predicate: tuple[Conjunct, ...], settings: PlannerSettings,
                 hidden: tuple[str, ...] = ()) -> PlanNode:
    if not chunks:
        return EmptyExec(columns)
    full = canonical_columns(schema)
    full = (full[0], *hidden, *full[1:])
    leaves = scan_leaves(chunks, full, settings.target_partitions)
    node: PlanNode = leaves[0] if len(leaves) == 1 else UnionExec(tuple(leaves))
    node = DeduplicateExec(SortKeys(schema, sort_keys).dedup_key(chunks), node)
    if predicate:
        node = FilterExec(predicate, node)
    return ProjectionExec(columns, node)
