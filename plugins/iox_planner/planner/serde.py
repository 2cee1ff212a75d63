"""The plan as JSON (PRODUCT.md "Plan JSON"): what the Spark job executes. `plan_from_dict(plan_to_dict(p)) == p`.

```json
{"node": "QueryExec", "sql": "...", "spark_sql": "...", "naming_sql": "..." (optional), "now": "2024-01-01T00:00:00Z", "params": {...},
 "time_range": [start_ns, end_ns], "settings": {...},
 "scans": [{"view": "__iox_scan_0", "table": "h2o", "alias": "h2o", "columns": {"city": "tag", "time": "time"}}],
 "time_columns": ["time"],
 "chunks": {"F1": {"kind", "table", "partition", "path", "order", "time": [min, max], "columns": {...}, ...}},
 "pruning": {"__iox_scan_0": {...}}, "notes": [...],
 "retention": {"period_ns", "cutoff"} (when the database has one), "changes": {"since", "until", "watermark"}
 (a changes read),
 "children": [{"node": "ProjectionExec", "columns": [...], "children": [...]}, ...]}
```
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from iox_planner.errors import BadInputError
from iox_planner.model import ChangeWindow, Chunk, ChunkKind, ColumnType
from iox_planner.timeutil import format_time, parse_time
from iox_planner.planner.nodes import (
    DeduplicateExec, EmptyExec, FilterExec, ParamValue, ParquetExec, PlanNode, ProjectionExec, QueryPlan,
    RecordBatchesExec, ScanInfo, ScanPruning, SortExec, SortItem, SortPreservingMergeExec, UnionExec,
)
from iox_planner.planner.predicate import parse_predicate, predicate_sql
from iox_planner.planner.settings import PlannerSettings

_PRUNING_FIELDS = ("partitions_considered", "partitions_pruned", "chunks_considered", "chunks_pruned",
                   "pruned_by_partition", "pruned_by_time", "pruned_by_tag", "time_min", "time_max")
_PRUNING_COUNTS = ("pruned_by_retention", "pruned_by_changes")  # since catalog migration 0008; 0 when absent


def _chunk_to_dict(c: Chunk) -> dict[str, Any]:
    return {
        "kind": c.kind.value, "table": c.table, "partition": c.partition, "path": c.path, "order": c.order,
        "time": [c.time_min, c.time_max], "columns": {k: v.value for k, v in c.columns.items()}, "rows": c.rows,
        "store": c.store, "sort_key": list(c.sort_key),
        "tag_ranges": {k: [lo, hi] for k, (lo, hi) in c.tag_ranges.items()}, "file_size": c.file_size,
    }


def _chunk_from_dict(chunk_id: str, d: Mapping[str, Any]) -> Chunk:
    lo, hi = d["time"]
    return Chunk(
        id=chunk_id, kind=ChunkKind(d["kind"]), table=d["table"], partition=d["partition"], order=int(d["order"]),
        time_min=lo, time_max=hi, columns={k: ColumnType(v) for k, v in d["columns"].items()}, rows=d.get("rows"),
        tag_ranges={k: (v[0], v[1]) for k, v in d.get("tag_ranges", {}).items()},
        sort_key=tuple(d.get("sort_key", ())), store=d["store"], path=d.get("path"),
        file_size=None if d.get("file_size") is None else int(d["file_size"]),
    )


def _sort_to_list(items: Sequence[SortItem]) -> list[dict[str, Any]]:
    return [{"column": i.column, "descending": i.descending, "nulls_first": i.nulls_first} for i in items]


def _sort_from_list(items: Sequence[Mapping[str, Any]] | None) -> tuple[SortItem, ...]:
    return tuple(SortItem(i["column"], bool(i["descending"]), bool(i["nulls_first"])) for i in items or ())


def node_to_dict(node: PlanNode) -> dict[str, Any]:
    out: dict[str, Any] = {"node": node.name}
    if isinstance(node, ProjectionExec):
        out["columns"] = list(node.columns)
    elif isinstance(node, FilterExec):
        out["predicate"] = predicate_sql(node.predicate)
    elif isinstance(node, DeduplicateExec):
        out["sort_key"] = _sort_to_list(node.sort_key)
        if node.time_slice is not None:
            out["time_slice"] = list(node.time_slice)
    elif isinstance(node, (SortExec, SortPreservingMergeExec)):
        out["sort"] = _sort_to_list(node.sort)
    elif isinstance(node, EmptyExec):
        out["columns"] = list(node.columns)
    elif isinstance(node, ParquetExec):
        out.update(
            store=node.store, file_groups=[[c.id for c in g] for g in node.file_groups],
            projection=list(node.projection), predicate=predicate_sql(node.predicate) if node.predicate else None,
            output_ordering=_sort_to_list(node.output_ordering) if node.output_ordering else None,
        )
    elif isinstance(node, RecordBatchesExec):
        out.update(chunks=[c.id for c in node.chunks], projection=list(node.projection))
    out["children"] = [node_to_dict(c) for c in node.children]
    return out


def node_from_dict(d: Mapping[str, Any], chunks: Mapping[str, Chunk]) -> PlanNode:
    name = d["node"]
    children = [node_from_dict(c, chunks) for c in d.get("children", [])]
    if name == "UnionExec":
        return UnionExec(tuple(children))
    if name == "EmptyExec":
        return EmptyExec(tuple(d["columns"]))
    if name == "ParquetExec":
        return ParquetExec(
            store=d["store"], file_groups=tuple(tuple(chunks[i] for i in g) for g in d["file_groups"]),
            projection=tuple(d["projection"]),
            predicate=parse_predicate(d["predicate"]) if d.get("predicate") else (),
            output_ordering=_sort_from_list(d.get("output_ordering")),
        )
    if name == "RecordBatchesExec":
        return RecordBatchesExec(tuple(chunks[i] for i in d["chunks"]), tuple(d["projection"]))
    if len(children) != 1:
        raise BadInputError(f"plan JSON: {name} needs exactly one child, it has {len(children)}")
    child = children[0]
    if name == "ProjectionExec":
        return ProjectionExec(tuple(d["columns"]), child)
    if name == "FilterExec":
        return FilterExec(parse_predicate(d["predicate"]), child)
    if name == "DeduplicateExec":
        time_slice = d.get("time_slice")
        if time_slice is not None:
            if (not isinstance(time_slice, list) or len(time_slice) != 2
                    or not all(type(v) is int for v in time_slice) or time_slice[0] > time_slice[1]):
                raise BadInputError(f"plan JSON: DeduplicateExec time_slice must be [start_ns, end_ns], "
                                    f"got {time_slice!r}")
            time_slice = (time_slice[0], time_slice[1])
        return DeduplicateExec(_sort_from_list(d["sort_key"]), child, time_slice)
    if name == "SortExec":
        return SortExec(_sort_from_list(d["sort"]), child)
    if name == "SortPreservingMergeExec":
        return SortPreservingMergeExec(_sort_from_list(d["sort"]), child)
    raise BadInputError(f"plan JSON: unknown node {name!r}")


def plan_to_dict(plan: QueryPlan) -> dict[str, Any]:
    return {
        "node": plan.name,
        "sql": plan.sql,
        "spark_sql": plan.spark_sql,
        "now": format_time(plan.now),
        "params": dict(plan.params),
        "time_range": list(plan.time_range),
        "settings": plan.settings.to_dict(),
        "scans": [{"view": s.view, "table": s.table, "alias": s.alias,
                   "columns": {name: kind.value for name, kind in s.columns}} for s in plan.scans],
        "time_columns": list(plan.time_columns),
        "chunks": {cid: _chunk_to_dict(c) for cid, c in sorted(plan.chunks().items())},
        "pruning": {p.view: {"table": p.table, **{f: getattr(p, f) for f in (*_PRUNING_FIELDS, *_PRUNING_COUNTS)}}
                    for p in plan.pruning},
        "notes": list(plan.notes),
        "children": [node_to_dict(tree) for tree in plan.children],
        **({"naming_sql": plan.naming_sql} if plan.naming_sql is not None else {}),
        **({"retention": {"period_ns": plan.retention[0], "cutoff": plan.retention[1]}}
           if plan.retention is not None else {}),
        **({"changes": {"since": plan.changes.since, "until": plan.changes.until,
                        "watermark": plan.changes.watermark}} if plan.changes is not None else {}),
    }


def plan_from_dict(d: Mapping[str, Any]) -> QueryPlan:
    try:
        if d.get("node") != QueryPlan.name:
            raise BadInputError(f"plan JSON: the root must be a QueryExec, not {d.get('node')!r}")
        chunks = {cid: _chunk_from_dict(cid, c) for cid, c in d["chunks"].items()}
        params: dict[str, ParamValue] = dict(d["params"])
        start, end = d["time_range"]
        return QueryPlan(
            sql=d["sql"], spark_sql=d["spark_sql"], now=parse_time(d["now"]), params=params,
            time_range=(start, end), settings=PlannerSettings.from_dict(d["settings"]),
            scans=tuple(ScanInfo(s["view"], s["table"], s["alias"],
                                 tuple((k, ColumnType(v)) for k, v in s["columns"].items())) for s in d["scans"]),
            time_columns=tuple(d["time_columns"]),
            pruning=tuple(ScanPruning(view=view, table=p["table"], **{f: p[f] for f in _PRUNING_FIELDS},
                                      **{f: int(p.get(f, 0)) for f in _PRUNING_COUNTS})
                          for view, p in d["pruning"].items()),
            notes=tuple(d["notes"]),
            children=tuple(node_from_dict(c, chunks) for c in d["children"]),
            naming_sql=d.get("naming_sql"),
            retention=(int(d["retention"]["period_ns"]), int(d["retention"]["cutoff"])) if d.get("retention") else None,
            changes=ChangeWindow(int(d["changes"]["since"]), int(d["changes"]["until"]), str(d["changes"]["watermark"]))
            if d.get("changes") else None,
        )
    except (KeyError, TypeError, ValueError) as err:
        raise BadInputError(f"plan JSON is malformed: {type(err).__name__}: {err}") from err


def plan_to_json(plan: QueryPlan) -> str:
    """The plan JSON the Spark jobs execute (indented, so a staged plan file reads well)."""
    return json.dumps(plan_to_dict(plan), indent=2)


def plan_from_json(data: str | Mapping[str, Any]) -> QueryPlan:
    """A plan back from its JSON text (or the parsed document)."""
    return plan_from_dict(json.loads(data) if isinstance(data, str) else data)
