"""Bounded fan-out: split a plan's scans into at most N part plans, one Spark job each.

A scan tree's topmost union (below its projections, filters and sorts) concatenates groups of chunks whose keys
cannot collide: deduplicated overlap groups and plain scans, split by partition and by time. Each part keeps the
same tree over a share of those groups, so the parts' rows together are exactly the scan's rows; a final Spark
step registers the parts as the scans' views and runs the query's SQL over them.

    ProjectionExec                       part 0: ProjectionExec            part 1: ProjectionExec
      UnionExec                                    UnionExec                         DeduplicateExec (day 2)
        DeduplicateExec (day 1)    ==>               DeduplicateExec (day 1)
        DeduplicateExec (day 2)                      ParquetExec (day 3)
        ParquetExec (day 3)

Groups are dealt to the part with the fewest estimated rows so far (largest first), so parts stay balanced and
the number of jobs never exceeds N however many groups there are. A scan with fewer groups than parts leaves some
parts empty for that scan (an EmptyExec of the same schema). No Airflow and no Spark here.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from iox_planner.planner.nodes import (
    EmptyExec, FilterExec, PlanNode, ProjectionExec, QueryPlan, SortExec, SortPreservingMergeExec, UnionExec,
)

_PASS_THROUGH = (ProjectionExec, FilterExec, SortExec, SortPreservingMergeExec)


def _groups(tree: PlanNode) -> tuple[list[PlanNode], Callable[[list[PlanNode]], PlanNode]]:
    """The independent groups under a scan tree's topmost union, and how to rebuild the tree over a subset."""
    path: list[PlanNode] = []
    node = tree
    while isinstance(node, _PASS_THROUGH):
        path.append(node)
        node = node.children[0]
    if not isinstance(node, UnionExec):
        return [tree], lambda kept: kept[0]

    def rebuild(kept: list[PlanNode]) -> PlanNode:
        inner: PlanNode = kept[0] if len(kept) == 1 else UnionExec(tuple(kept))
        for parent in reversed(path):
            inner = parent.with_children([inner])
        return inner

    return list(node.inputs), rebuild


def _rows(node: PlanNode) -> int:
    return sum(c.rows or 0 for c in node.scanned_chunks())


def split_plan(plan: QueryPlan, max_jobs: int) -> list[QueryPlan]:
    """At most `max_jobs` part plans whose scans together produce exactly `plan`'s scan rows; an empty list when
    the plan cannot be split (one group per scan) or `max_jobs` is 1, so the plan runs as one job."""
    if max_jobs <= 1:
        return []
    split = [_groups(tree) for tree in plan.children]
    parts = min(max_jobs, max((len(groups) for groups, _ in split), default=0))
    if parts <= 1:
        return []
    shares: list[list[list[PlanNode]]] = []
    for groups, _ in split:
        load = [0] * parts
        share: list[list[PlanNode]] = [[] for _ in range(parts)]
        ranked = sorted(range(len(groups)), key=lambda i: (-_rows(groups[i]), i))
        for i in ranked:
            target = min(range(parts), key=lambda p: (load[p], p))
            share[target].append(groups[i])
            load[target] += _rows(groups[i])
        # Keep each part's groups in plan order (the order a union lists them in does not change the rows, but
        # keeping it makes part plans read like the original).
        order = {id(g): i for i, g in enumerate(groups)}
        shares.append([sorted(s, key=lambda g: order[id(g)]) for s in share])
    out = []
    for p in range(parts):
        children = []
        for (groups, rebuild), tree, share in zip(split, plan.children, shares):
            kept = share[p]
            children.append(rebuild(kept) if kept else EmptyExec(tree.schema))
        out.append(dataclasses.replace(plan, children=tuple(children)))
    return out
