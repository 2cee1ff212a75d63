"""The final check: changes nothing, raises InternalError (with the offending subtree rendered) if the plan
breaks an invariant:

- no DeduplicateExec spans two partitions, unless the scan has more partitions than max_dedup_partition_split;
- no predicate below a DeduplicateExec reads a field (it must see merged rows);
- every DeduplicateExec gets one input stream sorted on (key, `__chunk_order`), and every
  SortPreservingMergeExec inputs sorted on its order;
- every column a node reads is produced below it, and every scan reads only the table's columns (and the virtual
  `__write_order` a changes read filters on, model.WRITE_ORDER).
"""

from __future__ import annotations

from typing import Iterable

from iox_planner.errors import InternalError
from iox_planner.model import WRITE_ORDER
from iox_planner.planner.chunks import canonical_columns
from iox_planner.planner.context import PassContext
from iox_planner.planner.explain import render_node
from iox_planner.planner.nodes import (
    DeduplicateExec, FilterExec, ParquetExec, PlanNode, ProjectionExec, RecordBatchesExec, SortExec,
    SortPreservingMergeExec, UnionExec, output_order, sorted_by,
)
from iox_planner.planner.predicate import columns_of


def sanity_check(plan: PlanNode, ctx: PassContext) -> PlanNode:
    partitions = len({c.partition for c in plan.scanned_chunks()})
    split_limited = partitions > ctx.settings.max_dedup_partition_split
    table_columns = set(canonical_columns(ctx.schema)) | {WRITE_ORDER}
    fields = ctx.field_columns

    def fail(node: PlanNode, why: str) -> InternalError:
        return InternalError(f"the plan of {ctx.label} breaks an invariant: {why}; please report this bug with "
                             f"the subtree:\n{render_node(node)}")

    def needs(node: PlanNode, columns: Iterable[str], available: Iterable[str]) -> None:
        missing = sorted(set(columns) - set(available))
        if missing:
            raise fail(node, f"{node.name} reads {missing}, which its input does not produce")

    for node in plan.walk():
        if isinstance(node, ProjectionExec):
            needs(node, node.columns, node.child.schema)
        elif isinstance(node, FilterExec):
            needs(node, columns_of(node.predicate), node.child.schema)
        elif isinstance(node, (SortExec, SortPreservingMergeExec)):
            needs(node, [s.column for s in node.sort], node.child.schema)
            if isinstance(node, SortPreservingMergeExec) and not sorted_by(output_order(node.child)[1], node.sort):
                raise fail(node, "a SortPreservingMergeExec over inputs not sorted on its order")
        elif isinstance(node, UnionExec):
            if any(c.schema != node.schema for c in node.inputs):
                raise fail(node, "union inputs differ in schema")
        elif isinstance(node, (ParquetExec, RecordBatchesExec)):
            needs(node, node.projection, table_columns)
            if isinstance(node, ParquetExec):
                needs(node, columns_of(node.predicate), table_columns)
        elif isinstance(node, DeduplicateExec):
            needs(node, [s.column for s in node.required_order], node.child.schema)
            spanned = {c.partition for c in node.scanned_chunks()}
            if len(spanned) > 1 and not split_limited:
                raise fail(node, f"a DeduplicateExec spans {len(spanned)} partitions although the scan has "
                                 f"{partitions}, not more than max_dedup_partition_split")
            parts, ordering = output_order(node.child)
            if parts != 1 or not sorted_by(ordering, node.required_order):
                raise fail(node, "a DeduplicateExec whose input is not one stream sorted on its key and "
                                 "__chunk_order")
            for below in node.child.walk():
                if isinstance(below, (FilterExec, ParquetExec)) and columns_of(below.predicate) & fields:
                    raise fail(node, f"a predicate on field(s) {sorted(columns_of(below.predicate) & fields)} "
                                     "below a DeduplicateExec")
    return plan
