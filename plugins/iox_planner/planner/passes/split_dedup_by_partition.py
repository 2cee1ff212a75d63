"""Partition split: partitions never share keys, so one DeduplicateExec per partition does the same work.

```yaml
DeduplicateExec:                 UnionExec:
  UnionExec:                       - DeduplicateExec: {UnionExec: [ChunkExec(partition A), ChunkExec(partition A)]}
    - ChunkExec: {partition: A}    - DeduplicateExec: {UnionExec: [ChunkExec(partition B)]}
    - ChunkExec: {partition: B}
    - ChunkExec: {partition: A}
```
More partitions than `max_dedup_partition_split`: the dedup stays whole (the one case where a dedup spans
partitions) and a note says so.
"""

from __future__ import annotations

from iox_planner.model import Chunk
from iox_planner.planner.context import PassContext, leaf_chunks
from iox_planner.planner.nodes import DeduplicateExec, PlanNode, UnionExec
from iox_planner.planner.transform import outside_dedup, transform_up


def split_dedup_by_partition(plan: PlanNode, ctx: PassContext) -> PlanNode:
    def rewrite(node: PlanNode) -> PlanNode:
        if not isinstance(node, DeduplicateExec):
            return node
        chunks = leaf_chunks(node.child)
        if chunks is None:
            return node
        by_partition: dict[str, list[Chunk]] = {}
        for chunk in chunks:
            by_partition.setdefault(chunk.partition, []).append(chunk)
        if len(by_partition) < 2:
            return node
        limit = ctx.settings.max_dedup_partition_split
        if len(by_partition) > limit:
            ctx.note(f"partition split skipped: {len(by_partition)} partitions exceed max_dedup_partition_split="
                     f"{limit}, so one DeduplicateExec spans them all (raise the setting to split)")
            return node
        projection = node.child.schema
        return UnionExec(tuple(ctx.dedup(by_partition[p], projection) for p in sorted(by_partition)))

    return transform_up(plan, rewrite, only=DeduplicateExec, descend=outside_dedup)
