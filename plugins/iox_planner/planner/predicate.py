"""Predicates as plan nodes hold them: a tuple of AND-conjuncts, each Spark SQL text over plain column names.

Conjuncts are values (text plus the columns they read), so passes can split a filter and move its parts without
parsing SQL again. The Spark SQL dialect used everywhere in the planner lives here too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect

from iox_planner.errors import InternalError

SPARK: Dialect = Dialect.get_or_raise("spark, normalization_strategy = case_sensitive")
"""Spark SQL with case-sensitive names (`Host` and `host` are different columns), as the product runs Spark."""

# Words Spark will not take as a bare column name (its ANSI reserved words, minus TIME, which Spark accepts
# unquoted by default and which every table has). Such names, and any that are not plain identifiers, get quoted.
_RESERVED = frozenset(
    """all and any as authorization both case cast check collate column constraint create cross current_date
    current_time current_timestamp current_user distinct else end escape except false fetch filter for foreign
    from full grant group having in inner intersect into is join lateral leading left natural not null offset on
    only or order outer overlaps primary references right select session_user some table then to trailing true
    union unique unknown user using when where with""".split()
)
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def identifier(name: str) -> exp.Identifier:
    """A column identifier, quoted only where Spark needs it."""
    quoted = not _PLAIN_NAME.fullmatch(name) or name.lower() in _RESERVED
    return exp.Identifier(this=name, quoted=quoted)


def column(name: str) -> exp.Column:
    return exp.Column(this=identifier(name))


def to_sql(expression: exp.Expr) -> str:
    return expression.sql(dialect=SPARK)


@dataclass(frozen=True, slots=True)
class Conjunct:
    """One AND-conjunct: Spark SQL text over plain column names, the columns it reads, and whether it is an OR
    (so joining conjuncts knows where parentheses go)."""

    sql: str
    columns: frozenset[str]
    is_or: bool = False

    @staticmethod
    def of(expression: exp.Expr) -> Conjunct:
        """The conjunct for an expression that is not itself an AND."""
        while isinstance(expression, exp.Paren):
            expression = expression.this
        if isinstance(expression, exp.And):
            raise InternalError(f"a conjunct must not be an AND: {to_sql(expression)}")
        # Generate, parse and generate again so the text is the fixed point that parsing the plan JSON gives back.
        text = to_sql(sqlglot.parse_one(to_sql(expression), dialect=SPARK))
        names = frozenset(c.name for c in expression.find_all(exp.Column))
        return Conjunct(text, names, isinstance(expression, (exp.Or, exp.Xor)))

    def __str__(self) -> str:
        return self.sql


def split_conjuncts(expression: exp.Expr) -> Iterator[exp.Expr]:
    """The AND-conjuncts of an expression, left to right, looking through parentheses. Iterative: a predicate
    parsed back from plan JSON is a left-deep chain as deep as it has conjuncts."""
    stack = [expression]
    while stack:
        node = stack.pop()
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, exp.And):
            stack.append(node.expression)
            stack.append(node.this)
        else:
            yield node


def predicate_sql(conjuncts: Iterable[Conjunct]) -> str:
    """The conjuncts as one Spark SQL predicate."""
    return " AND ".join(f"({c.sql})" if c.is_or else c.sql for c in conjuncts)


def parse_predicate(text: str) -> tuple[Conjunct, ...]:
    """The conjuncts of a Spark SQL predicate (the inverse of `predicate_sql`)."""
    try:
        parsed = sqlglot.parse_one(text, dialect=SPARK)
    except sqlglot.errors.SqlglotError as err:
        raise InternalError(f"predicate {text!r} does not parse as Spark SQL: {err}") from err
    return tuple(Conjunct.of(part) for part in split_conjuncts(parsed))


def columns_of(conjuncts: Iterable[Conjunct]) -> frozenset[str]:
    out: set[str] = set()
    for c in conjuncts:
        out |= c.columns
    return frozenset(out)


def merge_conjuncts(first: tuple[Conjunct, ...], second: Iterable[Conjunct]) -> tuple[Conjunct, ...]:
    """`first` followed by the conjuncts of `second` it does not already hold."""
    seen = set(c.sql for c in first)
    extra = []
    for c in second:
        if c.sql not in seen:
            seen.add(c.sql)
            extra.append(c)
    return first + tuple(extra)
