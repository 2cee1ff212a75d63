"""Type grouping: in a union, all RecordBatchesExec become one, and ParquetExecs become one per store (each at
the place of its first).

```yaml
UnionExec:                                UnionExec:
  - RecordBatchesExec: {chunks: [C1, C2]}   - RecordBatchesExec: {chunks: [C1, C2, C6]}
  - ParquetExec: {store: A, files: [C4]}    - ParquetExec: {store: A, files: [C4, C7]}
  - ParquetExec: {store: B, files: [C5]}    - ParquetExec: {store: B, files: [C5]}
  - RecordBatchesExec: {chunks: [C6]}
  - ParquetExec: {store: A, files: [C7]}
```
"""

from __future__ import annotations

from iox_planner.planner.chunks import by_order, deal
from iox_planner.planner.context import PassContext
from iox_planner.planner.nodes import ParquetExec, PlanNode, RecordBatchesExec, UnionExec
from iox_planner.planner.transform import outside_dedup, transform_up


def group_scans_by_type(plan: PlanNode, ctx: PassContext) -> PlanNode:
    def rewrite(node: PlanNode) -> PlanNode:
        if not isinstance(node, UnionExec):
            return node
        slots: dict[tuple[str, str, tuple[str, ...]], list[PlanNode]] = {}
        order: list[tuple[str, str, tuple[str, ...]] | int] = []
        for i, child in enumerate(node.inputs):
            if isinstance(child, RecordBatchesExec):
                key = ("rb", "", child.projection)
            elif isinstance(child, ParquetExec) and not child.predicate:
                key = ("pq", child.store, child.projection)
            else:
                order.append(i)
                continue
            if key not in slots:
                slots[key] = []
                order.append(key)
            slots[key].append(child)
        if all(len(group) == 1 for group in slots.values()):
            return node
        inputs: list[PlanNode] = []
        for entry in order:
            if isinstance(entry, int):
                inputs.append(node.inputs[entry])
                continue
            group = slots[entry]
            if len(group) == 1:
                inputs.append(group[0])
            elif entry[0] == "rb":
                chunks = by_order(c for g in group if isinstance(g, RecordBatchesExec) for c in g.chunks)
                inputs.append(RecordBatchesExec(tuple(chunks), entry[2]))
            else:
                scans = [g for g in group if isinstance(g, ParquetExec)]
                files = [f for s in scans for f in s.files()]
                inputs.append(ParquetExec.merge(scans, deal(files, ctx.settings.target_partitions)))
        return UnionExec(tuple(inputs))

    # A dedup's own union is built with one scan per kind and store already.
    return transform_up(plan, rewrite, only=UnionExec, descend=outside_dedup)
