"""The one tree walker every pass uses. A rewrite returns the node it was given when it changes nothing, so an
unchanged subtree is kept as the same object (and a pass that changes nothing returns its input).

`only` limits the rewrite to nodes of some types (others are passed through untouched), and `descend(node)`
false keeps the walk out of that node's subtree: both only save time on plans of many thousands of nodes.
"""

from __future__ import annotations

from typing import Callable, Union

from iox_planner.planner.nodes import PlanNode

Rewrite = Callable[[PlanNode], PlanNode]
NodeTypes = Union[type[PlanNode], tuple[type[PlanNode], ...]]


def transform_up(node: PlanNode, rewrite: Rewrite, *, only: NodeTypes = PlanNode,
                 descend: Callable[[PlanNode], bool] | None = None) -> PlanNode:
    """Rewrite the children first, then the node itself (post-order)."""
    children = node.children
    if children and (descend is None or descend(node)):
        if len(children) == 1:
            child = transform_up(children[0], rewrite, only=only, descend=descend)
            if child is not children[0]:
                node = node.with_children((child,))
        else:
            node = node.with_children([transform_up(c, rewrite, only=only, descend=descend) for c in children])
    return rewrite(node) if isinstance(node, only) else node


def transform_down(node: PlanNode, rewrite: Rewrite, *, only: NodeTypes = PlanNode,
                   descend: Callable[[PlanNode], bool] | None = None) -> PlanNode:
    """Rewrite the node first, then the children of what it became (pre-order)."""
    if isinstance(node, only):
        node = rewrite(node)
    children = node.children
    if children and (descend is None or descend(node)):
        if len(children) == 1:
            child = transform_down(children[0], rewrite, only=only, descend=descend)
            if child is not children[0]:
                node = node.with_children((child,))
        else:
            node = node.with_children([transform_down(c, rewrite, only=only, descend=descend) for c in children])
    return node


def outside_dedup(node: PlanNode) -> bool:
    """A `descend` for passes with nothing to do below a DeduplicateExec (dedups never nest)."""
    return node.name != "DeduplicateExec"
