"""Run-time guards around sizes computed from the data: the query fails alone, with one paragraph, instead of
taking the shared Spark server's memory.

A size argument of a `GUARDED` call (`sizing.SIZED`: `repeat`, `lpad`, `array_insert`, `sequence`...) that reads
the rows cannot be checked when planning, so the splicer wraps it in a guard that passes the value through
unchanged within `IOX_MAX_SQL_ALLOC` and raises past it. The value is evaluated once (a lambda over a one-element
array, so a random or costly size is not computed twice), keeps its type, and a NULL stays NULL:

    repeat(city, n)  ->  repeat(city, element_at(transform(array(n), __iox_n -> CASE WHEN __iox_n IS NULL OR
                         __iox_n BETWEEN -L AND L THEN __iox_n ELSE raise_error('...') END), 1))

`sequence(a, b[, s])` is guarded on its count, from its bounds as one struct: `(b - a) / s` for integers, the
microseconds between over the step's for dates and timestamps (constant ones too: Spark builds those while it
plans, where the guard stops it just the same); a sequence of any other type is refused. The gate lets
`raise_error` through only with the guard's own message (`GUARD_MARKER`), and `spark_jobs/errors.py` reports it as a
bad query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from sqlglot import exp
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.tokenizer_core import Token, TokenType

from iox_planner.errors import UnsupportedError
from iox_planner.model import TableSchema
from iox_planner.planner.limits import SqlLimits
from iox_planner.planner.predicate import SPARK
from iox_planner.planner.sizing import SIZED, Bound
from iox_planner.planner.sql.parse import CALL, GUARD, Source, call_name
from iox_planner.planner.sql.refusals import call_arguments, constant, reads_a_column
from iox_planner.planner.sql.scans import sql_schema
from iox_planner.planner.sql.splice import Edit

GUARD = "iox_guard"
"""Meta key of a call the splicer guards."""
GUARD_MARKER = "iox-batch guard: "
"""How every guard's message starts: the one `raise_error` the gate lets through."""

_VALUE = "__iox_n"
_BOUNDS = "__iox_q"
_INTEGRAL = {exp.DataType.Type.TINYINT, exp.DataType.Type.SMALLINT, exp.DataType.Type.INT, exp.DataType.Type.BIGINT}
_TEMPORAL = {exp.DataType.Type.DATE, exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPLTZ,
             exp.DataType.Type.TIMESTAMPNTZ, exp.DataType.Type.TIMESTAMPTZ, exp.DataType.Type.DATETIME}


@dataclass(frozen=True)
class Guards:
    edits: tuple[Edit, ...]
    notes: tuple[str, ...]


def guard_sizes(statement: exp.Query, source: Source, qualified: exp.Query, tables: Mapping[str, TableSchema],
                limits: SqlLimits) -> Guards:
    """The guard edits of every size computed from the data, and a note for each (EXPLAIN shows them)."""
    edits: list[Edit] = []
    notes: list[str] = []
    types: dict[tuple[int, int], list[exp.DataType | None]] | None = None
    for node in statement.walk():
        if not isinstance(node, exp.Func) or CALL not in node.meta:
            continue
        name = (call_name(node, source) or "").lower()
        sized = SIZED.get(name)
        if sized is None or sized.bound is not Bound.GUARDED:
            continue
        arguments = call_arguments(source, node.meta[CALL])
        if arguments is None:
            continue
        if name == "sequence":
            if len(arguments) < 2 or all(constant(arguments, i) is not None for i in range(len(arguments))):
                continue  # whole numbers: counted when planning
            _refuse_subquery(name, [t for a in arguments for t in a])
            if types is None:
                types = _sequence_types(qualified, tables)
            edits.extend(_sequence_guard(source, node, arguments, types.get(node.meta[CALL]), limits))
        else:
            [position] = sized.positions
            if position >= len(arguments) or constant(arguments, position) is not None \
                    or not reads_a_column(arguments[position]):
                continue
            _refuse_subquery(name, arguments[position])
            edits.extend(_value_guard(arguments[position], name, sized.what, limits))
        node.meta[GUARD] = True
        notes.append(f"run-time guard: the size of {name}(...) at offset {node.meta[CALL][0]} is computed from the "
                     f"data and fails the query past {limits.max_alloc:,} (IOX_MAX_SQL_ALLOC)")
    return Guards(tuple(edits), tuple(notes))


def _refuse_subquery(name: str, tokens: Sequence[Token]) -> None:
    """Spark takes no subquery inside a higher-order function, which the guard is."""
    if any(t.token_type is TokenType.SELECT for t in tokens):
        raise UnsupportedError(f"the size of {name}(...) is computed by a subquery, which iox-batch cannot guard at "
                               "run time (Spark takes no subquery inside the guard's lambda); compute the size as a "
                               "column (a CTE or a join) and pass that column")


def _message(name: str, what: str, limits: SqlLimits) -> str:
    text = (f"{GUARD_MARKER}{name}(...) was given a size computed from the data that would build more than "
            f"{limits.max_alloc:,} {what} in one value (IOX_MAX_SQL_ALLOC); bound the size in the query (least(n, "
            f"{limits.max_alloc})) or raise IOX_MAX_SQL_ALLOC")
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _value_guard(tokens: list[Token], name: str, what: str, limits: SqlLimits) -> list[Edit]:
    start, end = tokens[0].start, tokens[-1].end + 1
    n, bound = _VALUE, limits.max_alloc
    return [Edit(start, start, "element_at(transform(array("),
            Edit(end, end, f"), {n} -> CASE WHEN {n} IS NULL OR {n} BETWEEN -{bound} AND {bound} THEN {n} "
                           f"ELSE raise_error({_message(name, what, limits)}) END), 1)")]


def _sequence_types(qualified: exp.Query, tables: Mapping[str, TableSchema]
                    ) -> dict[tuple[int, int], list[exp.DataType | None]]:
    """The types sqlglot infers for each sequence call's arguments, by the call's place in the text."""
    typed = annotate_types(qualified.copy(), schema=sql_schema(tables), dialect=SPARK)
    found: dict[tuple[int, int], list[exp.DataType | None]] = {}
    for node in typed.walk():
        if isinstance(node, exp.Func) and CALL in node.meta:
            start, end = node.meta[CALL]
            found[(int(start), int(end))] = [a.type for a in node.iter_expressions()]
    return found


def _sequence_guard(source: Source, node: exp.Func, arguments: list[list[Token]],
                    types: list[exp.DataType | None] | None, limits: SqlLimits) -> list[Edit]:
    kinds = [t.this if t is not None else None for t in (types or [])]
    step = len(arguments) > 2
    q, bound = _BOUNDS, limits.max_alloc
    if len(kinds) >= 2 and all(k in _INTEGRAL for k in kinds):
        width = f"abs(CAST({q}.b AS DECIMAL(38, 0)) - CAST({q}.a AS DECIMAL(38, 0)))"
        per = f"greatest(abs(CAST({q}.s AS DECIMAL(38, 0))), 1)" if step else "1"
    elif len(kinds) >= 2 and all(k in _TEMPORAL for k in kinds[:2]):
        # microseconds apart over the step's (a month's step counts from January 1970: 31 days, within 10% of
        # any month's); Spark's default step for dates and timestamps is one day
        width = (f"abs(CAST(unix_micros(CAST({q}.b AS TIMESTAMP)) AS DECIMAL(38, 0)) - "
                 f"CAST(unix_micros(CAST({q}.a AS TIMESTAMP)) AS DECIMAL(38, 0)))")
        per = (f"greatest(abs(CAST(unix_micros(timestamp_micros(0) + {q}.s) AS DECIMAL(38, 0))), 1)" if step
               else "86400000000")
    else:
        raise UnsupportedError("sequence(...) with bounds iox-batch cannot count before running takes integers "
                               "(cast them: CAST(x AS BIGINT)), dates or timestamps; write the bounds as numbers or "
                               "cast them")
    within = f"{width} < {bound} * {per}"
    tokens = source.tokens
    first = source.token_index(node.meta[CALL][0])
    assert first is not None
    close = tokens[source.group_end(first + 1)]
    commas = _top_level_commas(tokens, first + 1, source.group_end(first + 1))
    fields = ["a", "b", "s"]
    edits = [Edit(tokens[first].start, tokens[first + 1].end + 1, "element_at(transform(array(named_struct('a', ")]
    edits += [Edit(c.start, c.end + 1, f", '{fields[i + 1]}',") for i, c in enumerate(commas)]
    call = f"sequence({q}.a, {q}.b{f', {q}.s' if step else ''})"
    nulls = f"{q}.a IS NULL OR {q}.b IS NULL" + (f" OR {q}.s IS NULL" if step else "")
    message = _message("sequence", "elements", limits)
    edits.append(Edit(close.start, close.end + 1, f")), {q} -> CASE WHEN {nulls} OR {within} THEN {call} "
                                                  f"ELSE raise_error({message}) END), 1)"))
    return edits


def _top_level_commas(tokens: Sequence[Token], open_index: int, close_index: int) -> list[Token]:
    depth = 0
    commas = []
    for token in tokens[open_index + 1:close_index]:
        if token.token_type in (TokenType.L_PAREN, TokenType.L_BRACKET):
            depth += 1
        elif token.token_type in (TokenType.R_PAREN, TokenType.R_BRACKET):
            depth -= 1
        elif token.token_type is TokenType.COMMA and depth == 0:
            commas.append(token)
    return commas
