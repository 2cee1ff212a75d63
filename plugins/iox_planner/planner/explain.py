"""EXPLAIN: the plan as InfluxDB 3 shows it (tree text), and as seed 000 writes plans (YAML).

Tree text, one node per line, two spaces per level; sort expressions name the column and its index in the input
(`state@2 ASC`), as DataFusion does:

    DeduplicateExec: [state@2 ASC,city@1 ASC,time@3 ASC]
      SortExec: expr=[state@2 ASC,city@1 ASC,time@3 ASC,__chunk_order@0 ASC]
        RecordBatchesExec: chunks=1, projection=[__chunk_order, city, state, time], chunk_ids=[I1]
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import yaml

from iox_planner.timeutil import format_duration, format_time
from iox_planner.planner.nodes import (
    DeduplicateExec, EmptyExec, FilterExec, ParquetExec, PlanNode, ProjectionExec, QueryPlan, RecordBatchesExec,
    ScanPruning, SortExec, SortItem, SortPreservingMergeExec, UnionExec,
)
from iox_planner.planner.predicate import predicate_sql


def _sort_item(item: SortItem, schema: Sequence[str]) -> str:
    index = schema.index(item.column) if item.column in schema else "?"
    if item.descending:
        opts = "DESC" if item.nulls_first else "DESC NULLS LAST"
    else:
        opts = "ASC" if item.nulls_first else "ASC NULLS LAST"
    return f"{item.column}@{index} {opts}"


def _sort_list(items: Sequence[SortItem], schema: Sequence[str], sep: str = ",") -> str:
    return "[" + sep.join(_sort_item(i, schema) for i in items) + "]"


def _names(columns: Sequence[str]) -> str:
    return "[" + ", ".join(columns) + "]"


def node_line(node: PlanNode) -> str:
    """One node as its EXPLAIN line."""
    if isinstance(node, ProjectionExec):
        schema = node.child.schema
        return "ProjectionExec: expr=[" + ", ".join(f"{c}@{schema.index(c)} as {c}" for c in node.columns) + "]"
    if isinstance(node, FilterExec):
        return f"FilterExec: {predicate_sql(node.predicate)}"
    if isinstance(node, DeduplicateExec):
        line = f"DeduplicateExec: {_sort_list(node.sort_key, node.child.schema)}"
        if node.time_slice is not None:
            line += f", time_slice=[{node.time_slice[0]}, {node.time_slice[1]}]"
        return line
    if isinstance(node, UnionExec):
        return "UnionExec"
    if isinstance(node, SortExec):
        return f"SortExec: expr={_sort_list(node.sort, node.child.schema)}"
    if isinstance(node, SortPreservingMergeExec):
        return f"SortPreservingMergeExec: {_sort_list(node.sort, node.child.schema)}"
    if isinstance(node, EmptyExec):
        return f"EmptyExec: projection={_names(node.columns)}"
    if isinstance(node, ParquetExec):
        n = len(node.file_groups)
        groups = ", ".join("[" + ", ".join(c.id for c in g) + "]" for g in node.file_groups)
        parts = [f"file_groups={{{n} group{'s' if n != 1 else ''}: [{groups}]}}", f"projection={_names(node.projection)}"]
        if node.output_ordering:
            parts.append(f"output_ordering={_sort_list(node.output_ordering, node.projection, ', ')}")
        if node.predicate:
            parts.append(f"predicate={predicate_sql(node.predicate)}")
        if node.store != "file://":
            parts.append(f"store={node.store}")
        return "ParquetExec: " + ", ".join(parts)
    if isinstance(node, RecordBatchesExec):
        ids = ", ".join(c.id for c in node.chunks)
        return f"RecordBatchesExec: chunks={len(node.chunks)}, projection={_names(node.projection)}, chunk_ids=[{ids}]"
    raise TypeError(f"cannot render {type(node).__name__}")


Annotate = Callable[[PlanNode], str]
"""Extra text for a node's line (EXPLAIN ANALYZE's metrics), or "" for none."""


def render_node(node: PlanNode, indent: int = 0, annotate: Annotate | None = None) -> str:
    """A scan (sub)tree as EXPLAIN text."""
    lines: list[str] = []

    def visit(n: PlanNode, depth: int) -> None:
        extra = annotate(n) if annotate is not None else ""
        lines.append("  " * depth + node_line(n) + (f", {extra}" if extra else ""))
        for child in n.children:
            visit(child, depth + 1)

    visit(node, indent)
    return "\n".join(lines)


def _pruning_text(p: ScanPruning) -> str:
    text = (f"partitions {p.partitions_considered} considered, {p.partitions_pruned} pruned; "
            f"chunks {p.chunks_considered} considered, {p.chunks_pruned} pruned")
    why = [f"{name} {count}" for name, count in
           (("retention", p.pruned_by_retention), ("changes", p.pruned_by_changes), ("partition", p.pruned_by_partition),
            ("time", p.pruned_by_time), ("tag", p.pruned_by_tag)) if count]
    if why:
        text += f" (by {', '.join(why)})"
    bounds = [f"{op} {format_time(t)}" for op, t in ((">=", p.time_min), ("<=", p.time_max)) if t is not None]
    if bounds:
        text += f"; time {' and '.join(bounds)}"
    return text


def render_tree(plan: QueryPlan, annotate: Annotate | None = None, summary: str = "") -> str:
    """The whole plan as EXPLAIN text: the QueryExec line, notes, then each scan with its pruning and tree.
    `annotate` adds per-node text (metrics) and `summary` a line after the head (EXPLAIN ANALYZE)."""
    head = f"QueryExec: now={format_time(plan.now)}"
    start, end = plan.time_range
    if start is not None or end is not None:
        head += f", time_range=[{'' if start is None else format_time(start)}, " \
                f"{'' if end is None else format_time(end)})"
    lines = [head]
    lines.extend(f"  {line}" for line in lifecycle_lines(plan))
    if summary:
        lines.append(f"  {summary}")
    lines.extend(f"  note: {note}" for note in plan.notes)
    for scan, pruning, tree in zip(plan.scans, plan.pruning, plan.children):
        lines.append(f"  scan {scan.view} ({scan.table} AS {scan.alias}): {_pruning_text(pruning)}")
        lines.append(render_node(tree, 2, annotate))
    return "\n".join(lines) + "\n"


def lifecycle_lines(plan: QueryPlan) -> list[str]:
    """What the database's retention and a changes read exclude, as EXPLAIN says it."""
    lines = []
    if plan.retention is not None:
        period, cutoff = plan.retention
        lines.append(f"retention: {format_duration(period)}, rows at or before {format_time(cutoff)} excluded")
    if plan.changes is not None:
        c = plan.changes
        lines.append(f"changes: keys whose newest write order is in ({c.since}, {c.until}]; next watermark "
                     f"{c.watermark}")
    return lines


def _sort_names(items: Sequence[SortItem]) -> list[str]:
    return [i.column + (" DESC" if i.descending else "") for i in items]


def _yaml_node(node: PlanNode) -> dict[str, Any]:
    body: dict[str, Any]
    if isinstance(node, UnionExec):
        return {"UnionExec": [_yaml_node(c) for c in node.inputs]}
    if isinstance(node, ProjectionExec):
        body = {"keep": list(node.columns)}
    elif isinstance(node, FilterExec):
        body = {"expr": predicate_sql(node.predicate)}
    elif isinstance(node, DeduplicateExec):
        body = {"sort_key": _sort_names(node.sort_key)}
        if node.time_slice is not None:
            body["time_slice"] = list(node.time_slice)
    elif isinstance(node, (SortExec, SortPreservingMergeExec)):
        body = {"expr": _sort_names(node.sort)}
    elif isinstance(node, EmptyExec):
        body = {"projection": list(node.columns)}
    elif isinstance(node, ParquetExec):
        body = {"store": node.store, "file_groups": [[c.id for c in g] for g in node.file_groups],
                "projection": list(node.projection)}
        if node.predicate:
            body["predicate"] = predicate_sql(node.predicate)
        if node.output_ordering:
            body["output_ordering"] = _sort_names(node.output_ordering)
    elif isinstance(node, RecordBatchesExec):
        body = {"chunks": [c.id for c in node.chunks], "projection": list(node.projection)}
    else:
        raise TypeError(f"cannot render {type(node).__name__}")
    if node.children:
        body["child"] = _yaml_node(node.children[0])
    return {node.name: body}


def render_yaml(plan: QueryPlan) -> str:
    """The plan in seed 000's YAML form."""
    doc = {
        "QueryExec": {
            "sql": plan.sql,
            "now": format_time(plan.now),
            "notes": [*lifecycle_lines(plan), *plan.notes],
            "scans": [
                {"view": s.view, "table": s.table, "alias": s.alias, "pruning": _pruning_text(p),
                 "plan": _yaml_node(tree)}
                for s, p, tree in zip(plan.scans, plan.pruning, plan.children)
            ],
        }
    }
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120, allow_unicode=True)
