"""The planner's entry points: `plan_query` (SQL and chunks in, QueryPlan out) and `render`."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator, Literal, Mapping

from sqlglot import exp

from iox_planner import timeutil
from iox_planner.errors import CatalogError
from iox_planner.model import WRITE_ORDER, ChangeWindow, Chunk, ChunkSource
from iox_planner.planner.chunks import column_types
from iox_planner.planner.context import PassContext
from iox_planner.planner.explain import render_tree, render_yaml
from iox_planner.planner.initial import initial_plan
from iox_planner.planner.nodes import PlanNode, QueryPlan, ScanInfo, ScanPruning
from iox_planner.planner.optimizer import optimize as run_passes
from iox_planner.planner.predicate import Conjunct, column
from iox_planner.planner.pruning import prune
from iox_planner.planner.serde import plan_to_json
from iox_planner.planner.settings import PlannerSettings
from iox_planner.planner.sql import analyze


def plan_query(
    sql: str,
    source: ChunkSource,
    *,
    params: Mapping[str, object] | None = None,
    time_start: int | None = None,
    time_end: int | None = None,
    settings: PlannerSettings | None = None,
    now_ns: int | None = None,
    optimize: bool = True,
    stop_after: str | None = None,
    changes: ChangeWindow | None = None,
) -> QueryPlan:
    """Plan `sql` over the chunks of `source`.

    `time_start`/`time_end` are a half-open `[start, end)` range in ns applied to every scan (rows and pruning).
    `now_ns` fixes `now()` (default: the wall clock, truncated to microseconds as Spark's timestamps are), and with
    it the retention cutoff of `source.retention()`: no scan returns a row with `time <= now - retention`.
    `changes` makes every scan return only the keys whose newest write order lies in the window (a changes read).
    `optimize=False` returns the naive initial plan; `stop_after` names the last pass to run (for tests).
    """
    with _gc_paused():
        return _plan(sql, source, params, time_start, time_end, settings or PlannerSettings(), now_ns, optimize,
                     stop_after, changes)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Planning allocates many small, short-lived objects next to many long-lived chunks: CPython's cyclic
    collector would rescan the chunks again and again (it costs more than the planning itself at 100,000
    chunks). Plans hold no cycles, so pausing it is safe."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _plan(sql: str, source: ChunkSource, params: Mapping[str, object] | None, time_start: int | None,
          time_end: int | None, settings: PlannerSettings, now_ns: int | None, optimize: bool,
          stop_after: str | None, changes: ChangeWindow | None) -> QueryPlan:
    timeutil.check_range(time_start, time_end)
    now = timeutil.now_ns() if now_ns is None else now_ns
    now -= now % 1_000
    retention = source.retention()
    cutoff = None if retention is None else now - retention
    tables = source.tables()
    query = analyze(sql, tables, params=params, now_ns=now)
    range_conjuncts: list[Conjunct] = []
    if time_start is not None:
        range_conjuncts.append(Conjunct.of(exp.GTE(this=column("time"), expression=exp.Literal.number(time_start))))
    if time_end is not None:
        range_conjuncts.append(Conjunct.of(exp.LT(this=column("time"), expression=exp.Literal.number(time_end))))

    trees: list[PlanNode] = []
    scans: list[ScanInfo] = []
    reports: list[ScanPruning] = []
    notes: list[str] = list(query.notes)
    by_id: dict[str, Chunk] = {}
    for scan in query.scans:
        schema = tables[scan.table]
        lo = _max(scan.time_min, time_start)
        hi = _min(scan.time_max, None if time_end is None else time_end - 1)
        written = None if changes is None else source.written(scan.table, changes.since, changes.until)
        chunks, report = prune(scan, source.chunks(scan.table, lo, hi), lo, hi, retention_cutoff=cutoff,
                               written=written)
        _check_unique_ids(chunks, by_id)
        sort_keys = source.sort_keys(scan.table)
        lifecycle = [*_retention_conjuncts(chunks, cutoff), *_changes_conjuncts(changes)]
        predicate = tuple(dict((c.sql, c) for c in (*scan.conjuncts, *range_conjuncts, *lifecycle)).values())
        tree = initial_plan(chunks, schema, sort_keys, scan.columns, predicate, settings,
                            hidden=(WRITE_ORDER,) if changes is not None else ())
        if optimize:
            ctx = PassContext(settings, schema, sort_keys, f"{scan.view} ({scan.table})")
            tree = run_passes(tree, ctx, stop_after=stop_after)
            notes.extend(ctx.notes)
        trees.append(tree)
        scans.append(ScanInfo(scan.view, scan.table, scan.alias, column_types(schema, tree.schema)))
        reports.append(report)
    return QueryPlan(
        sql=sql, spark_sql=query.spark_sql, now=now, params=dict(query.params), time_range=(time_start, time_end),
        settings=settings, scans=tuple(scans), time_columns=query.time_columns, pruning=tuple(reports),
        notes=tuple(notes), children=tuple(trees), naming_sql=query.naming_sql,
        retention=None if retention is None or cutoff is None else (retention, cutoff), changes=changes,
    )


def _retention_conjuncts(chunks: list[Chunk], cutoff: int | None) -> list[Conjunct]:
    """`time > cutoff` (IOx's retention filter) where a chunk left after pruning may hold a row at or before the
    cutoff: the boundary partition is filtered exactly, to the nanosecond; chunks wholly inside need no filter."""
    if cutoff is None or not any(c.time_min is None or c.time_min <= cutoff for c in chunks):
        return []
    return [Conjunct.of(exp.GT(this=column("time"), expression=exp.Literal.number(cutoff)))]


def _changes_conjuncts(changes: ChangeWindow | None) -> list[Conjunct]:
    """`since < __write_order <= until`, above the dedup (the write order is no key column, so no pass pushes it
    below): a key counts by its newest write, merged like any field."""
    if changes is None:
        return []
    order = column(WRITE_ORDER)
    return [Conjunct.of(exp.GT(this=order, expression=exp.Literal.number(changes.since))),
            Conjunct.of(exp.LTE(this=order.copy(), expression=exp.Literal.number(changes.until)))]


def _check_unique_ids(chunks: list[Chunk], seen: dict[str, Chunk]) -> None:
    """The plan names chunks by id: two different chunks with one id would be one in the plan JSON."""
    for chunk in chunks:
        other = seen.setdefault(chunk.id, chunk)
        if other is not chunk and other != chunk:
            raise CatalogError(f"chunk id {chunk.id!r} names two different chunks (tables {other.table} and "
                               f"{chunk.table}, partitions {other.partition} and {chunk.partition}); chunk ids "
                               "must be unique in a database")


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def render(plan: QueryPlan, fmt: Literal["tree", "yaml", "json"] = "tree") -> str:
    """The plan as EXPLAIN tree text, seed 000's YAML, or the plan JSON the Spark job executes."""
    if fmt == "tree":
        return render_tree(plan)
    if fmt == "yaml":
        return render_yaml(plan)
    if fmt == "json":
        return plan_to_json(plan) + "\n"
    raise ValueError(f"unknown plan format {fmt!r}; use tree, yaml or json")

