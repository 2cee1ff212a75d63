"""No duplicates: a DeduplicateExec over fewer than two chunks, none of which may hold duplicates, is removed.

```yaml
DeduplicateExec:                        ParquetExec: {files: [F1]}
  UnionExec: [ParquetExec: {files: [F1]}]
```
It counts chunks, not child nodes (one ParquetExec may hold several overlapping files); an ingester chunk alone
keeps its dedup, since it may hold duplicates of its own.
"""

from __future__ import annotations

from iox_planner.planner.context import PassContext
from iox_planner.planner.nodes import DeduplicateExec, ParquetExec, PlanNode, UnionExec
from iox_planner.planner.transform import outside_dedup, transform_up


def remove_dedup_without_duplicates(plan: PlanNode, ctx: PassContext) -> PlanNode:
    def rewrite(node: PlanNode) -> PlanNode:
        if not isinstance(node, DeduplicateExec):
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
