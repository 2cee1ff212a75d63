"""Sort grouping: file groups chosen so a dedup can merge sorted files instead of sorting them.

Under a DeduplicateExec, a ParquetExec whose files are each sorted on the dedup key gets one group per file (in
chunk order) and declares `output_ordering` (key, `__chunk_order`), up to `max_parquet_fanout` files; beyond
that, or if a file is sorted otherwise, its files are dealt into `target_partitions` unsorted groups (a group of
several files is not sorted: IOx issue #6125). Outside a dedup order does not matter: files are dealt into
`target_partitions` groups.

```yaml
DeduplicateExec: [tag, time]                 DeduplicateExec: [tag, time]
  ParquetExec: {file_groups: [[F1, F2]]}       ParquetExec: {file_groups: [[F1], [F2]],
                                                             output_ordering: [tag, time, __chunk_order]}
```
"""

from __future__ import annotations

from iox_planner.model import CHUNK_ORDER, Chunk
from iox_planner.planner.chunks import by_order, deal
from iox_planner.planner.context import PassContext
from iox_planner.planner.nodes import DeduplicateExec, ParquetExec, PlanNode, SortItem
from iox_planner.planner.transform import outside_dedup, transform_down, transform_up


def group_files_by_sort(plan: PlanNode, ctx: PassContext) -> PlanNode:
    def regroup(scan: ParquetExec, groups: tuple[tuple[Chunk, ...], ...], ordering: tuple[SortItem, ...]) -> ParquetExec:
        if groups == scan.file_groups and ordering == scan.output_ordering:
            return scan
        return scan.derive(file_groups=groups, output_ordering=ordering)

    def under_dedup(dedup: DeduplicateExec) -> PlanNode:
        ordering = dedup.sort_key + (SortItem(CHUNK_ORDER),)

        def rewrite(node: PlanNode) -> PlanNode:
            if not isinstance(node, ParquetExec):
                return node
            files = by_order(node.files())
            fits = len(files) <= ctx.settings.max_parquet_fanout
            if fits and all(s.column in node.projection for s in ordering) and all(
                ctx.keys.sorted_on(f, dedup.sort_key) for f in files
            ):
                return regroup(node, tuple((f,) for f in files), ordering)
            if not fits:
                ctx.note(f"{len(files)} files under one DeduplicateExec exceed max_parquet_fanout="
                         f"{ctx.settings.max_parquet_fanout}: dealt into unsorted groups and sorted before the dedup")
            return regroup(node, deal(files, ctx.settings.target_partitions), ())

        return dedup.with_children([transform_up(dedup.child, rewrite, only=ParquetExec)])

    def rewrite(node: PlanNode) -> PlanNode:
        if isinstance(node, DeduplicateExec):
            return under_dedup(node)
        if isinstance(node, ParquetExec):
            return regroup(node, deal(node.files(), ctx.settings.target_partitions), ())
        return node

    return transform_down(plan, rewrite, only=(DeduplicateExec, ParquetExec), descend=outside_dedup)
