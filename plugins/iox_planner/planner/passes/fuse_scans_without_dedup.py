"""Fuse scans that need no dedup: a union's groups are put in order (min time, min chunk order, partition, chunk
id), and adjacent Parquet scans outside any dedup become one scan per store.

```yaml
UnionExec:                                   UnionExec:
  - ParquetExec: {files: [F3]}  # [20, 29]     - DeduplicateExec: ...          # [0, 15]
  - DeduplicateExec: ...        # [0, 15]      - ParquetExec: {files: [F2, F3]}
  - ParquetExec: {files: [F2]}  # [16, 19]
```
"""

from __future__ import annotations

from iox_planner.planner.chunks import deal, node_order
from iox_planner.planner.context import PassContext
from iox_planner.planner.nodes import ParquetExec, PlanNode, UnionExec
from iox_planner.planner.transform import outside_dedup, transform_down


def fuse_scans_without_dedup(plan: PlanNode, ctx: PassContext) -> PlanNode:
    def fuse(run: list[ParquetExec]) -> list[PlanNode]:
        if len(run) == 1:
            return list(run)
        stores: dict[str, list[ParquetExec]] = {}
        for scan in run:
            stores.setdefault(scan.store, []).append(scan)
        out: list[PlanNode] = []
        for scans in stores.values():
            files = [f for s in scans for f in s.files()]
            out.append(ParquetExec.merge(scans, deal(files, ctx.settings.target_partitions)))
        return out

    def rewrite(node: PlanNode) -> PlanNode:
        if not isinstance(node, UnionExec) or not any(isinstance(c, ParquetExec) for c in node.inputs):
            return node
        ordered = sorted(node.inputs, key=node_order)
        inputs: list[PlanNode] = []
        run: list[ParquetExec] = []
        for child in ordered:
            if isinstance(child, ParquetExec) and not child.predicate and not child.output_ordering:
                run.append(child)
                continue
            inputs.extend(fuse(run))
            run = []
            inputs.append(child)
        inputs.extend(fuse(run))
        if len(inputs) == len(node.inputs) and all(a is b for a, b in zip(inputs, node.inputs)):
            return node
        return UnionExec(tuple(inputs))

    return transform_down(plan, rewrite, only=UnionExec, descend=outside_dedup)
