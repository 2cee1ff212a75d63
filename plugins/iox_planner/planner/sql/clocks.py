"""The clock functions fixed at planning time, so a rerun of the same plan gives the same answer (PRODUCT.md: `now()`
is fixed at planning time): which calls they are, as Spark resolves them, and the constant each becomes.

Pinned: `now()`, `current_timestamp[()]`, `current_date[()]`, `curdate()`, `localtimestamp()` and
`unix_timestamp()` without arguments. Left to Spark: `current_time` and `localtime` (Spark 4.3 offers no TIME
expression the planning time could be written into with the same type: TIME casts and functions are refused by
its default `timeType` setting), and a bare `localtimestamp`, which Spark does not resolve.
"""

from __future__ import annotations

import datetime as dt
from typing import Mapping

from sqlglot import exp
from sqlglot.tokenizer_core import TokenType

from iox_planner.errors import BadQueryError
from iox_planner.model import TableSchema
from iox_planner.planner.sql.parse import CALL, Source, call_name

CLOCK = "iox_clock"
"""Meta of a call pinned to the planning time: its kind (`timestamp`, `date`, `local`, `unix`)."""

_PINNED = {"now": "timestamp", "current_timestamp": "timestamp", "current_date": "date", "curdate": "date",
           "localtimestamp": "local", "unix_timestamp": "unix"}
_BARE = frozenset({"current_timestamp", "current_date"})
"""Clocks Spark also resolves as a bare word, when no column of that name is in scope."""
BARE_CLOCK_WORDS = frozenset({"current_time", "localtime"})
"""Clocks Spark resolves as a bare word that sqlglot takes for a column (analyzed as calls; not pinned)."""


def mark_clocks(statement: exp.Query, source: Source, tables: Mapping[str, TableSchema]) -> None:
    """Mark every pinned clock call of the query as written with its kind (`CLOCK`)."""
    columns = {c for schema in tables.values() for c in schema.columns}
    # Every name the query itself gives (aliases, a subquery's columns, lambda variables, LATERAL VIEW columns):
    # Spark reads a bare clock word as one of these where it is in scope, and as the clock only elsewhere.
    named = {ident.name.lower() for ident in statement.find_all(exp.Identifier)}
    for node in statement.walk():
        if not isinstance(node, exp.Func) or CALL not in node.meta:
            continue
        name = (call_name(node, source) or "").lower()
        kind = _PINNED.get(name)
        if kind is None:
            continue
        start, end = node.meta[CALL]
        i = source.token_index(start)
        called = i is not None and i + 1 < len(source.tokens) and \
            source.tokens[i + 1].token_type is TokenType.L_PAREN
        if not called:
            if name not in _BARE:
                continue
            if source.sql[start:end] in columns or source.sql[start:end].lower() in named:
                raise BadQueryError(f"{source.sql[start:end]!r} is both a name of the query (a column, an alias, a "
                                    "lambda variable) and a clock function Spark would call for it; qualify "
                                    "the column (t.current_date), rename the alias, or call the function with "
                                    "parentheses")
        elif i is not None and source.group_end(i + 1) != i + 2:
            continue  # arguments: unix_timestamp(x) reads x, not the clock
        node.meta[CLOCK] = kind


def clock_text(kind: str, now_ns: int) -> str:
    """The Spark SQL constant a pinned clock becomes: the same type, the planning time's value."""
    now_us = now_ns // 1_000
    if kind == "timestamp":
        return f"TIMESTAMP_MICROS({now_us})"
    if kind == "date":
        return f"DATE_FROM_UNIX_DATE({now_us // 86_400_000_000})"
    if kind == "local":
        stamp = dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=now_us)  # the session's zone is UTC
        return f"TIMESTAMP_NTZ '{stamp.isoformat(sep=' ', timespec='microseconds')}'"
    if kind == "unix":
        return f"unix_timestamp(TIMESTAMP_MICROS({now_us}))"
    raise ValueError(f"unknown clock kind {kind!r}")


def clock_value_us(kind: str, now_ns: int) -> int | None:
    """The microseconds since the epoch a pinned clock stands for, for comparisons with `time` (None: a number)."""
    now_us = now_ns // 1_000
    if kind in ("timestamp", "local"):
        return now_us
    if kind == "date":
        return now_us - now_us % 86_400_000_000
    return None
