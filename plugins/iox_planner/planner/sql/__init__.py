"""The SQL front end: from a Spark SQL query to one scan request per table reference, and the query Spark runs.

The query must be one SELECT over catalog tables. sqlglot analyzes it (what each reference reads, what can be
pushed into its scan, what is refused); what Spark runs is the user's own text with the planner's edits spliced
in (`splice.py`), never sqlglot's re-printing of it. Each table reference (a self-join has two) becomes a scan,
registered as the view `__iox_scan_<n>`, aliased as the reference was.

- `parse.py`: tokens, the tree and the source positions, within the limits;
- `refusals.py`: what a query may not do (functions, tables, reserved names, parameters, constant sizes);
- `clocks.py`: the clock calls fixed at planning time;
- `scans.py`: what each reference reads and which conjuncts its scan evaluates;
- `nanoseconds.py`: exact nanoseconds for time columns passed through;
- `guards.py`: run-time guards around sizes computed from the data;
- `splice.py`: the text Spark runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from sqlglot import exp

from iox_planner.errors import BadQueryError
from iox_planner.model import INTERNAL_NAMES, INTERNAL_PREFIX, TableSchema
from iox_planner.planner.limits import SqlLimits
from iox_planner.planner.nodes import ParamValue
from iox_planner.planner.sql.clocks import mark_clocks
from iox_planner.planner.sql.guards import guard_sizes
from iox_planner.planner.sql.nanoseconds import Nanoseconds, shape_of
from iox_planner.planner.sql.parse import parse, within_limits
from iox_planner.planner.sql.refusals import (
    check_allocations, check_params, check_patterns, is_internal_name, reject_internal_names, reject_outside,
)
from iox_planner.planner.sql.scans import Analysis, ScanRequest, TagFilter, qualify_query, tag_table_references
from iox_planner.planner.sql.splice import Splicer

__all__ = ["AnalyzedQuery", "ScanRequest", "TagFilter", "analyze", "is_internal_name"]


@dataclass(frozen=True)
class AnalyzedQuery:
    sql: str
    spark_sql: str
    """The text Spark runs: `sql` with the planner's edits spliced in."""
    params: Mapping[str, ParamValue]
    scans: tuple[ScanRequest, ...]
    output_columns: tuple[str, ...]
    time_columns: tuple[str, ...]
    naming_sql: str | None = None
    """`spark_sql` without the clock edits, when a pinned clock sits in a result column Spark names after its
    text: the job takes the result's column names from it (they are the user's query's names)."""
    notes: tuple[str, ...] = ()
    """The planner's run-time guards, one line each (EXPLAIN's notes)."""


@within_limits
def analyze(sql: str, tables: Mapping[str, TableSchema], *, params: Mapping[str, object] | None = None,
            now_ns: int) -> AnalyzedQuery:
    """Check the query, derive what each table reference's scan must produce, and splice the text Spark runs."""
    limits = SqlLimits.from_env()
    statement, source = parse(sql, limits)
    reject_outside(statement, source, tables)
    reject_internal_names(statement)
    bound = check_params(statement, params or {})
    check_allocations(statement, source, limits, bound)
    check_patterns(statement, source)
    mark_clocks(statement, source, tables)
    refs = tag_table_references(statement, tables)
    shape = shape_of(statement)
    qualified, lenient = qualify_query(statement, tables)
    front = Analysis(statement, qualified, lenient, tables, refs, bound, now_ns)
    scans = tuple(front.scan(i) for i in range(len(refs)))
    output = _output_columns(qualified)
    nanos = Nanoseconds(front, shape).edits()
    guards = guard_sizes(statement, source, qualified, tables, limits)
    splicer = Splicer(statement, source, front, scans, nanos, now_ns, guards.edits)
    naming = splicer.spark_sql(clocks=False, guards=False) if splicer.clock_in_unnamed_output() else None
    return AnalyzedQuery(sql, splicer.spark_sql(), bound, scans, output, tuple(nanos.time_columns), naming,
                         guards.notes)


def _output_columns(qualified: exp.Query) -> tuple[str, ...]:
    names = list(qualified.named_selects)
    seen: set[str] = set()
    for name in names:
        if is_internal_name(name):
            raise BadQueryError(f"the result column {name!r} would clash with an internal column of iox-batch "
                                f"(names starting with {INTERNAL_PREFIX!r} and {', '.join(sorted(INTERNAL_NAMES))} "
                                "are reserved); give it another alias")
        if name in seen:
            raise BadQueryError(f"the result has two columns named {name!r}; give one of them an alias "
                                f"(... AS {name}_2)")
        seen.add(name)
    return tuple(names)
