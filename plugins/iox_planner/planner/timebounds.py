"""Inclusive nanosecond bounds that AND-conjuncts put on `time`: the one place that derives them.

Bounds come from parsed conjuncts, never from predicate text: only a conjunct that is, as a whole, a comparison of
the bare `time` column with an integer constant (or a BETWEEN of two) bounds `time`. Anything nested under NOT,
OR, a function or a string literal bounds nothing, so `NOT (host = 'b' AND time < 5)` and
`host = 'x AND time > 5'` leave `time` open.
"""

from __future__ import annotations

import re
from typing import Iterable

import sqlglot
from sqlglot import exp

from iox_planner.errors import InternalError
from iox_planner.model import TIME
from iox_planner.planner.predicate import SPARK, Conjunct, split_conjuncts

Bounds = tuple[int | None, int | None]


def expression_time_bounds(part: exp.Expr) -> Bounds:
    """Inclusive ns bounds one conjunct (an expression that is not an AND) puts on `time` (None: open)."""
    while isinstance(part, exp.Paren):
        part = part.this
    if isinstance(part, exp.Between) and _is_time(part.this):
        return _int(part.args["low"]), _int(part.args["high"])
    mirrored: dict[type[exp.Expr], type[exp.Expr]] = {
        exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE, exp.EQ: exp.EQ}
    kind = type(part)
    if kind not in mirrored or not isinstance(part, exp.Binary):
        return None, None
    if _is_time(part.this):
        value = _int(part.expression)
    elif _is_time(part.expression):
        value, kind = _int(part.this), mirrored[kind]
    else:
        return None, None
    if value is None:
        return None, None
    if kind is exp.GTE:
        return value, None
    if kind is exp.GT:
        return value + 1, None
    if kind is exp.LTE:
        return None, value
    if kind is exp.LT:
        return None, value - 1
    return value, value


def combine(bounds: Iterable[Bounds]) -> Bounds:
    """The intersection of several bounds (all must hold)."""
    lo: int | None = None
    hi: int | None = None
    for low, high in bounds:
        if low is not None:
            lo = low if lo is None else max(lo, low)
        if high is not None:
            hi = high if hi is None else min(hi, high)
    return lo, hi


def time_bounds(conjuncts: Iterable[Conjunct]) -> Bounds:
    """Inclusive ns bounds on `time` implied by plan conjuncts (Spark SQL over plain names, `time` in int64 ns):
    each conjunct is parsed, and only its top-level AND parts count."""
    found: list[Bounds] = []
    for conjunct in conjuncts:
        try:
            tree = sqlglot.parse_one(conjunct.sql, dialect=SPARK)
        except sqlglot.errors.SqlglotError as err:
            raise InternalError(f"plan conjunct {conjunct.sql!r} does not parse as Spark SQL: {err}") from err
        found.extend(expression_time_bounds(part) for part in split_conjuncts(tree))
    return combine(found)


def _is_time(node: exp.Expr) -> bool:
    while isinstance(node, exp.Paren):
        node = node.this
    return isinstance(node, exp.Column) and node.name == TIME and not node.table


def _int(node: exp.Expr) -> int | None:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Literal) and not node.is_string and re.fullmatch(r"-?[0-9]+", str(node.this)):
        return int(str(node.this))
    if isinstance(node, exp.Neg):
        inner = _int(node.this)
        return None if inner is None else -inner
    return None
