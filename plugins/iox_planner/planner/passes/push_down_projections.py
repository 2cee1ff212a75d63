"""Projection pushdown: a ProjectionExec moves through unions, through filters (keeping the filter's columns),
through dedups (keeping the key and `__chunk_order`), and into scans, which then read only those columns.

```yaml
ProjectionExec: [tag1, field2, time]        ProjectionExec: [tag1, field2, time]
  DeduplicateExec: [tag1, tag2, time]         DeduplicateExec: [tag1, tag2, time]
    ParquetExec: {projection: all}              ParquetExec: {projection: [__chunk_order, tag1, tag2, field2, time]}
```
A projection that drops a key column does not go through a dedup: it stays above it, and a projection that keeps
the key goes below.
"""

from __future__ import annotations

from typing import Iterable

from iox_planner.model import CHUNK_ORDER
from iox_planner.planner.context import PassContext
from iox_planner.planner.nodes import (
    LEAVES, DeduplicateExec, EmptyExec, FilterExec, PlanNode, ProjectionExec, SortExec, SortPreservingMergeExec,
    UnionExec, leaf_with_projection,
)
from iox_planner.planner.predicate import columns_of
from iox_planner.planner.transform import transform_down


def _keep(schema: tuple[str, ...], wanted: Iterable[str]) -> tuple[str, ...]:
    """The wanted columns, in the input's order."""
    want = set(wanted)
    return tuple(c for c in schema if c in want)


def push_down_projections(plan: PlanNode, ctx: PassContext) -> PlanNode:
    def through(node: ProjectionExec, child: PlanNode, needs: Iterable[str]) -> PlanNode:
        """Push `node` below a unary `child` that reads `needs` itself."""
        inner = child.children[0]
        lower = _keep(inner.schema, [*node.columns, *needs])
        if lower == inner.schema:
            return node
        moved = child.with_children([ProjectionExec(lower, inner)])
        return moved if lower == node.columns else ProjectionExec(node.columns, moved)

    def step(node: ProjectionExec) -> PlanNode:
        child = node.child
        if node.columns == child.schema:
            return child
        if _keep(child.schema, node.columns) != node.columns:
            return node  # it reorders: leave it where it is
        if isinstance(child, ProjectionExec):
            return ProjectionExec(node.columns, child.child)
        if isinstance(child, UnionExec):
            return UnionExec(tuple(ProjectionExec(node.columns, c) for c in child.inputs))
        if isinstance(child, FilterExec):
            return through(node, child, columns_of(child.predicate))
        if isinstance(child, DeduplicateExec):
            return through(node, child, [*(s.column for s in child.sort_key), CHUNK_ORDER])
        if isinstance(child, (SortExec, SortPreservingMergeExec)):
            return through(node, child, [s.column for s in child.sort])
        if isinstance(child, LEAVES):
            return leaf_with_projection(child, node.columns)
        if isinstance(child, EmptyExec):
            return EmptyExec(node.columns)
        return node

    def rewrite(node: PlanNode) -> PlanNode:
        while isinstance(node, ProjectionExec):
            new = step(node)
            if new is node:
                break
            node = new
        return node

    return transform_down(plan, rewrite, only=ProjectionExec)
