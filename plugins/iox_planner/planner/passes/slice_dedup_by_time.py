"""Time slices: a dedup group estimated above `max_dedup_rows_per_slice` rows is cut into DeduplicateExecs over
consecutive inclusive time slices (`slicing.time_slices`, the rule compaction uses too), so one wide overlap
merges as several independent tasks and no task holds much more than the budget.

```yaml
DeduplicateExec:                       UnionExec:
  UnionExec:                             - DeduplicateExec: {time_slice: [0, 49], UnionExec: [C1[0,99], C2[0,49]]}
    - ChunkExec: {ts: [0, 99]}           - DeduplicateExec: {time_slice: [50, 99], UnionExec: [C1[0,99], C3[50,99]]}
    - ChunkExec: {ts: [0, 49]}
    - ChunkExec: {ts: [50, 99]}
```
Rows with different `time` are never duplicates, so the slices together give exactly the group's rows. Each slice
scans only the chunks whose time range meets it, and a chunk meeting several slices is read by each, filtered to
that slice (the executors apply `time_slice` as inclusive bounds on `time`). The estimate comes from the catalog's
row counts and time ranges; a group with a chunk lacking either stays whole. A sliced dedup is kept even over one
duplicate-free chunk: its slice bounds are what keep that chunk's rows from being emitted twice. A group that is one
duplicate-free chunk (a large compacted file) is not sliced: it needs no dedup at all.
"""

from __future__ import annotations

from iox_planner.planner.context import PassContext, leaf_chunks
from iox_planner.planner.nodes import DeduplicateExec, PlanNode, UnionExec
from iox_planner.planner.transform import outside_dedup, transform_up
from iox_planner.slicing import Span, time_slices


def slice_dedup_by_time(plan: PlanNode, ctx: PassContext) -> PlanNode:
    budget = ctx.settings.max_dedup_rows_per_slice

    def rewrite(node: PlanNode) -> PlanNode:
        if not isinstance(node, DeduplicateExec) or node.time_slice is not None:
            return node
        chunks = leaf_chunks(node.child)
        if not chunks or sum(c.rows or 0 for c in chunks) <= budget:
            return node
        if len(chunks) == 1 and not chunks[0].may_contain_pk_duplicates:
            return node  # nothing to merge: `remove_dedup_without_duplicates` drops this dedup, a slice would not go
        spans = []
        for c in chunks:
            if c.rows is None or c.time_min is None or c.time_max is None:
                return node
            spans.append(Span(c.time_min, c.time_max, c.rows))
        slices = time_slices(spans, budget)
        if len(slices) < 2:
            return node
        projection = node.child.schema
        out: list[PlanNode] = []
        for start, end in slices:
            inside = [c for c in chunks if c.time_min <= end and c.time_max >= start]  # type: ignore[operator]
            if not inside:
                continue  # a gap no chunk covers (time_slices covers the whole range, holes included)
            sliced = ctx.dedup(inside, projection)
            out.append(DeduplicateExec.trusted(sliced.sort_key, sliced.child, (start, end)))
        return out[0] if len(out) == 1 else UnionExec(tuple(out))

    return transform_up(plan, rewrite, only=DeduplicateExec, descend=outside_dedup)
