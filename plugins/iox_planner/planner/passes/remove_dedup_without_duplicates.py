"""No duplicates: a DeduplicateExec over fewer than two chunks, none of which may hold duplicates, is removed.

```yaml
DeduplicateExec:                        ParquetExec: {files: [F1]}
  UnionExec: [ParquetExec: {files: [F1]}]
```
It counts chunks, not child nodes (one ParquetExec may hold several overlapping files); an ingester chunk alone
keeps its dedup, since it may hold duplicates of its own, and so does a time-sliced dedup (its slice bounds keep
a chunk read by several slices from being emitted more than once).
"""

from __future__ import annotations

from iox_planner.planner.context import PassContext
from iox_planner.planner.nodes import DeduplicateExec, ParquetExec, PlanNode, UnionExec
from iox_planner.planner.transform import outside_dedup, transform_up


def remove_dedup_without_duplicates(plan: PlanNode, ctx: PassContext) -> PlanNode:
    def rewrite(node: PlanNode) -> PlanNode:
        if not isinstance(node, DeduplicateExec) or node.time_slice is not None:
            return node
        child = node.child
        while isinstance(child, UnionExec) and len(child.inputs) == 1:
            child = child.inputs[0]
        if isinstance(child, ParquetExec) and len(child.file_groups) == 1 and len(child.file_groups[0]) == 1:
            return child  # the common case, decided without listing chunks: one Parquet file
        chunks = child.scanned_chunks()
        if len(chunks) >= 2 or any(c.may_contain_pk_duplicates for c in chunks):
            return node
        return child

    return transform_up(plan, rewrite, only=DeduplicateExec, descend=outside_dedup)
