"""What a compaction run reports: each partition's outcome, the totals PRODUCT.md's summary names, the dry run's
lines, and the report as JSON-ready values (the CLI's summary, a spark-submit job's report, the DAG's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from iox_planner.maintenance.compact.plan import PartitionPlan, Skip
from iox_planner.timeutil import format_time


@dataclass(frozen=True)
class Outcome:
    """What happened to one partition."""

    table: str
    partition: str
    level: int
    files_in: int
    files_out: int
    rows_in: int
    rows_out: int
    skipped: str | None = None
    files_promoted: int = 0
    """L0 files made L1 in place: not in files_in/rows_in, which count rewritten files only."""
    rows_promoted: int = 0
    waits: str | None = None
    """Done, but the partition's rewrite waits (`PartitionPlan.waits`): its promotions only were made."""

    @property
    def duplicates_removed(self) -> int:
        return self.rows_in - self.rows_out


@dataclass
class Report:
    """A compaction run: what each partition got, and the totals PRODUCT.md's summary names."""

    outcomes: list[Outcome] = field(default_factory=list)
    plans: list[PartitionPlan | Skip] = field(default_factory=list)

    @property
    def compacted(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.skipped is None]

    def totals(self) -> dict[str, int]:
        done = self.compacted
        return {
            "partitions": len(done),
            "skipped": len(self.outcomes) - len(done),
            "files_in": sum(o.files_in for o in done),
            "files_out": sum(o.files_out for o in done),
            "rows_in": sum(o.rows_in for o in done),
            "rows_out": sum(o.rows_out for o in done),
            "duplicates_removed": sum(o.duplicates_removed for o in done),
            "files_promoted": sum(o.files_promoted for o in done),
            "rows_promoted": sum(o.rows_promoted for o in done),
        }


def describe_plan(item: PartitionPlan | Skip) -> list[str]:
    """The dry run's lines for one partition: which files, which level, why, and how it is sliced."""
    if isinstance(item, Skip):
        return [f"{item.table} {item.partition}: waits ({item.reason})"]
    orders = sorted(set(item.slice_orders)) if item.slice_orders else [item.order]
    order_text = "order " + ", ".join(map(str, orders)) if item.inputs else "no rewrite, no Spark job"
    lines = [f"{item.table} {item.partition}: {len(item.inputs)} file(s), {item.rows_in:,} rows rewritten -> "
             f"L{item.level}, {order_text}; {len(item.promoted)} file(s), {item.rows_promoted:,} rows promoted "
             f"to L{item.level} in place; {item.reason}"]
    for c in item.inputs:
        lines.append(f"  in  {c.display_id} L{c.level} order {c.order}, {c.row_count:,} rows, "
                     f"{format_time(c.min_time)} .. {format_time(c.max_time)}"
                     + (f"; {item.why[c.id]}" if c.id in item.why else ""))
    if item.waits:
        lines.append(f"  the rewrite waits: {item.waits}")
    for c in item.promoted:
        lines.append(f"  promote {c.display_id} L{c.level} -> L{item.level} order {c.order}, {c.row_count:,} rows, "
                     f"{format_time(c.min_time)} .. {format_time(c.max_time)}; {item.why.get(c.id, 'promoted')}")
    if len(item.groups) > 1:
        lines.append(f"  {len(item.groups)} independent rewrite groups (disjoint time ranges, each its own order)")
    if not item.slices:
        pass
    elif len(item.slices) == 1:
        lines.append("  one slice: the inputs fit one task's budget")
    else:
        lines.append(f"  {len(item.slices)} time slices (each task reads at most about its budget of rows):")
        for lo, hi in item.slices:
            lines.append(f"    {format_time(lo)} .. {format_time(hi)}")
    return lines


def outcome_note(outcome: Mapping[str, Any]) -> str | None:
    """The line a run's report prints for one outcome of `report_dict` that was skipped or whose rewrite waits
    (the CLI's and the `iox_compact` DAG's report alike); None for a partition compacted in full."""
    where = f"{outcome['table']} {outcome['partition']}"
    if outcome["skipped"]:
        return f"{where}: {outcome['skipped']}"
    if outcome.get("waits"):
        return f"{where}: promoted {outcome['files_promoted']} file(s); the rewrite waits: {outcome['waits']}"
    return None


def report_dict(report: Report) -> dict[str, Any]:
    """A run's report as JSON-ready values (the DAG's per-run report, a spark-submit job's output)."""
    return {**report.totals(), "outcomes": [
        {"table": o.table, "partition": o.partition, "level": o.level, "files_in": o.files_in,
         "files_out": o.files_out, "rows_in": o.rows_in, "rows_out": o.rows_out,
         "files_promoted": o.files_promoted, "rows_promoted": o.rows_promoted, "skipped": o.skipped,
         "waits": o.waits}
        for o in report.outcomes]}
