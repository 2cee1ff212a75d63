"""Union clean-up: nested unions are flattened and a union of one input is replaced by that input.

```yaml
UnionExec:                      UnionExec:
  - UnionExec: [Some1, Some2]     - Some1
  - Some3                         - Some2
                                  - Some3
UnionExec: [Some1]              Some1
```
"""

from __future__ import annotations

from iox_planner.planner.context import PassContext
from iox_planner.planner.nodes import PlanNode, UnionExec
from iox_planner.planner.transform import outside_dedup, transform_up


def clean_unions(plan: PlanNode, ctx: PassContext) -> PlanNode:
    def rewrite(node: PlanNode) -> PlanNode:
        if not isinstance(node, UnionExec):
            return node
        if len(node.inputs) == 1:
            return node.inputs[0]
        if not any(isinstance(c, UnionExec) for c in node.inputs):
            return node
        flat: list[PlanNode] = []
        for child in node.inputs:
            flat.extend(child.inputs if isinstance(child, UnionExec) else (child,))
        return UnionExec(tuple(flat))

    # Unions under a dedup are built flat, with several inputs: nothing to clean there.
    return transform_up(plan, rewrite, only=UnionExec, descend=outside_dedup)
