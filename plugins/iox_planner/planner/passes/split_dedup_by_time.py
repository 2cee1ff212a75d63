"""Time split: chunks whose inclusive time ranges do not overlap (even transitively) share no key, so each group
of overlapping chunks gets its own DeduplicateExec.

```yaml
DeduplicateExec:                   UnionExec:
  UnionExec:                         - DeduplicateExec: {UnionExec: [ChunkExec[1,10], ChunkExec[2,5], ChunkExec[5,5]]}
    - ChunkExec: {ts: [1, 10]}       - DeduplicateExec: {UnionExec: [ChunkExec[11,15]]}
    - ChunkExec: {ts: [2, 5]}
    - ChunkExec: {ts: [5, 5]}
    - ChunkExec: {ts: [11, 15]}
```
Touching ranges (`[3,5]`, `[5,10]`) overlap. A chunk with an unknown time range keeps its dedup's chunks in one
group. More groups than `max_dedup_time_split`: the dedup stays whole and a note says so.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Sequence

from iox_planner.model import Chunk
from iox_planner.planner.context import PassContext, leaf_chunks
from iox_planner.planner.nodes import DeduplicateExec, PlanNode, UnionExec
from iox_planner.planner.transform import outside_dedup, transform_up


def time_groups(chunks: Sequence[Chunk]) -> list[list[Chunk]]:
    """Groups of transitively overlapping chunks, by ascending time; one group if any time range is unknown."""
    if any(c.time_min is None or c.time_max is None for c in chunks):
        return [list(chunks)]
    ordered = sorted(chunks, key=attrgetter("time_min", "time_max", "order", "id"))
    groups: list[list[Chunk]] = []
    group_max = 0
    current: list[Chunk] = []
    for chunk in ordered:
        low, high = chunk.time_min, chunk.time_max
        assert low is not None and high is not None
        if current and low <= group_max:
            current.append(chunk)
            if high > group_max:
                group_max = high
        else:
            current = [chunk]
            groups.append(current)
            group_max = high
    return groups


def split_dedup_by_time(plan: PlanNode, ctx: PassContext) -> PlanNode:
    def rewrite(node: PlanNode) -> PlanNode:
        if not isinstance(node, DeduplicateExec):
            return node
        chunks = leaf_chunks(node.child)
        if chunks is None:
            return node
        groups = time_groups(chunks)
        if len(groups) < 2:
            return node
        limit = ctx.settings.max_dedup_time_split
        if len(groups) > limit:
            partitions = sorted({c.partition for c in chunks})
            where = f"partition {partitions[0]}" if len(partitions) == 1 else f"{len(partitions)} partitions"
            ctx.note(f"time split skipped in {where}: {len(groups)} time groups exceed max_dedup_time_split="
                     f"{limit}, so its DeduplicateExec stays whole (raise the setting to split)")
            return node
        projection = node.child.schema
        return UnionExec(tuple(ctx.dedup(g, projection) for g in groups))

    return transform_up(plan, rewrite, only=DeduplicateExec, descend=outside_dedup)
