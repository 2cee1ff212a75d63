"""Predicate pushdown: a FilterExec moves through unions, sends its conjuncts over key columns alone through a
dedup, and hands its conjuncts to a ParquetExec as its predicate (the FilterExec stays: the scan may only use the
predicate partially). Never into a RecordBatchesExec, which cannot filter.

```yaml
FilterExec: (field = 1) AND (tag > 0)        FilterExec: field = 1
  DeduplicateExec:                             DeduplicateExec:
    UnionExec:                                   UnionExec:
      - RecordBatchesExec                          - FilterExec: tag > 0
      - ParquetExec                                    RecordBatchesExec
                                                   - FilterExec: tag > 0
                                                       ParquetExec: {predicate: tag > 0}
```
A conjunct that reads a field stays above the dedup: it must see the merged row.
"""

from __future__ import annotations

from iox_planner.planner.context import PassContext
from iox_planner.planner.nodes import DeduplicateExec, FilterExec, ParquetExec, PlanNode, UnionExec
from iox_planner.planner.predicate import merge_conjuncts
from iox_planner.planner.transform import transform_down


def push_down_predicates(plan: PlanNode, ctx: PassContext) -> PlanNode:
    keys = ctx.key_columns

    def step(node: FilterExec) -> PlanNode:
        child = node.child
        if isinstance(child, FilterExec):
            return FilterExec(merge_conjuncts(child.predicate, node.predicate), child.child)
        if isinstance(child, UnionExec):
            return UnionExec(tuple(FilterExec(node.predicate, c) for c in child.inputs))
        if isinstance(child, DeduplicateExec):
            below = tuple(c for c in node.predicate if c.columns <= keys)
            if not below:
                return node
            above = tuple(c for c in node.predicate if not c.columns <= keys)
            dedup = child.with_children([FilterExec(below, child.child)])
            return FilterExec(above, dedup) if above else dedup
        if isinstance(child, ParquetExec):
            merged = merge_conjuncts(child.predicate, node.predicate)
            if merged == child.predicate:
                return node
            return FilterExec(node.predicate, child.derive(predicate=merged))
        return node

    def rewrite(node: PlanNode) -> PlanNode:
        while isinstance(node, FilterExec):
            new = step(node)
            if new is node:
                break
            node = new
        return node

    return transform_down(plan, rewrite, only=FilterExec)
