"""The sorts a dedup needs: its input must be one stream sorted on (key, `__chunk_order`).

Sorted partitions (single-file groups declaring `output_ordering`) are merged with a SortPreservingMergeExec;
unsorted inputs beside them get a SortExec each; an input with nothing sorted gets one SortExec.

```yaml
DeduplicateExec: [tag, time]            DeduplicateExec: [tag, time]
  UnionExec:                              SortPreservingMergeExec: [tag, time, __chunk_order]
    - RecordBatchesExec                     UnionExec:
    - ParquetExec: {output_ordering: ..}      - SortExec: [tag, time, __chunk_order]
                                                  RecordBatchesExec
                                              - ParquetExec: {output_ordering: ...}
```
"""

from __future__ import annotations

from iox_planner.planner.context import PassContext
from iox_planner.planner.nodes import (
    DeduplicateExec, PlanNode, SortExec, SortPreservingMergeExec, UnionExec, output_order, sorted_by,
)
from iox_planner.planner.transform import outside_dedup, transform_up


def add_sorts(plan: PlanNode, ctx: PassContext) -> PlanNode:
    def rewrite(node: PlanNode) -> PlanNode:
        if not isinstance(node, DeduplicateExec):
            return node
        required = node.required_order
        child = node.child
        partitions, ordering = output_order(child)
        if sorted_by(ordering, required):
            if partitions == 1:
                return node
            return node.with_children([SortPreservingMergeExec(required, child)])
        if isinstance(child, UnionExec):
            sorted_inputs = [sorted_by(output_order(c)[1], required) for c in child.inputs]
            if any(sorted_inputs):
                inputs = tuple(c if ok else SortExec(required, c) for c, ok in zip(child.inputs, sorted_inputs))
                return node.with_children([SortPreservingMergeExec(required, UnionExec(inputs))])
        return node.with_children([SortExec(required, child)])

    return transform_up(plan, rewrite, only=DeduplicateExec, descend=outside_dedup)
