"""A small reference evaluator, independent of the planner: runs a plan's JSON over in-memory chunk rows, and
computes what a query must return straight from the rows (dedup of the whole table, then the WHERE).

Semantics follow PRODUCT.md: duplicates are rows with equal tags and time (NULL tag equals NULL tag); each other
column takes its last non-null value by chunk order, then write position. Predicates are evaluated from their
SQL text (parsed by sqlglot) with SQL's three-valued logic. In scan predicates `time` is int64 nanoseconds; in the
user's WHERE (as Spark sees the views) `time` is a TIMESTAMP, i.e. `floor(ns / 1000)` microseconds.
"""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from typing import Any, Iterable, Mapping, Sequence

import sqlglot
from sqlglot import exp

Row = dict[str, Any]
DIALECT = "spark, normalization_strategy = case_sensitive"
CO = "__chunk_order"


# ---------------------------------------------------------------------------------------------------------------
# Deduplication, written from PRODUCT.md


def dedup_rows(rows: Sequence[Row], key: Sequence[str], order: str | None = None) -> list[Row]:
    """Merge rows with equal `key` (None equals None): each other column's last non-null value, rows ordered by
    `order` (if given) and then by position in `rows`."""
    indexed = list(enumerate(rows))
    if order is not None:
        indexed.sort(key=lambda p: (p[1][order], p[0]))
    groups: dict[tuple[Any, ...], Row] = {}
    for _, row in indexed:
        k = tuple(row.get(c) for c in key)
        merged = groups.setdefault(k, {c: row.get(c) for c in key})
        for column, value in row.items():
            if column in key:
                continue
            if value is not None or column not in merged:
                merged[column] = value if value is not None else merged.get(column)
    return list(groups.values())


# ---------------------------------------------------------------------------------------------------------------
# Predicates


def _timestamp_us(text: str) -> int:
    m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})(?:[ T](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,6}))?)?)?Z?", text.strip())
    assert m, f"test evaluator cannot read timestamp {text!r}"
    y, mo, d, h, mi, s, frac = m.groups()
    stamp = dt.datetime(int(y), int(mo), int(d), int(h or 0), int(mi or 0), int(s or 0), tzinfo=dt.timezone.utc)
    seconds = int((stamp - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)).total_seconds())
    return seconds * 1_000_000 + int((frac or "").ljust(6, "0"))


class Predicate:
    """A SQL predicate evaluated over a row. `spark_time=True`: `time` reads as microseconds (a TIMESTAMP)."""

    def __init__(self, sql: str, *, spark_time: bool = False, params: Mapping[str, Any] | None = None) -> None:
        self.tree = sqlglot.parse_one(sql, dialect=DIALECT)
        self.spark_time = spark_time
        self.params = params or {}

    def __call__(self, row: Row) -> bool:
        return self.value(self.tree, row) is True

    def value(self, node: exp.Expression, row: Row) -> Any:  # noqa: C901 - one case per node type
        v = self.value
        if isinstance(node, exp.Paren):
            return v(node.this, row)
        if isinstance(node, exp.Column):
            value = row.get(node.name)
            if node.name == "time" and self.spark_time and value is not None:
                return value // 1000
            return value
        if isinstance(node, exp.Literal):
            if node.is_string:
                return node.this
            text = str(node.this)
            return int(text) if re.fullmatch(r"-?\d+", text) else float(text)
        if isinstance(node, exp.Boolean):
            return bool(node.this)
        if isinstance(node, exp.Null):
            return None
        if isinstance(node, exp.Placeholder):
            return self.params[node.name]
        if isinstance(node, exp.Neg):
            x = v(node.this, row)
            return None if x is None else -x
        if isinstance(node, (exp.Cast, exp.TryCast)):
            x = v(node.this, row)
            target = node.to.this
            if x is None:
                return None
            if target in (exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ, exp.DataType.Type.TIMESTAMPLTZ):
                return _timestamp_us(x) if isinstance(x, str) else x
            if target == exp.DataType.Type.DOUBLE:
                return float(x)
            raise NotImplementedError(f"cast to {target}")
        if isinstance(node, exp.Not):
            x = v(node.this, row)
            return None if x is None else not x
        if isinstance(node, exp.And):
            a, b = v(node.this, row), v(node.expression, row)
            if a is False or b is False:
                return False
            return None if a is None or b is None else True
        if isinstance(node, exp.Or):
            a, b = v(node.this, row), v(node.expression, row)
            if a is True or b is True:
                return True
            return None if a is None or b is None else False
        if isinstance(node, exp.Is):
            return v(node.this, row) is None
        if isinstance(node, exp.Like):
            x, pattern = v(node.this, row), v(node.expression, row)
            if x is None or pattern is None:
                return None
            return _like_regex(pattern).fullmatch(x) is not None
        if isinstance(node, exp.Between):
            x, lo, hi = v(node.this, row), v(node.args["low"], row), v(node.args["high"], row)
            if x is None or lo is None or hi is None:
                return None
            return lo <= x <= hi
        if isinstance(node, exp.In):
            x = v(node.this, row)
            if x is None:
                return None
            values = [v(e, row) for e in node.expressions]
            if x in values:
                return True
            return None if None in values else False
        compare = {exp.EQ: lambda a, b: a == b, exp.NEQ: lambda a, b: a != b, exp.GT: lambda a, b: a > b,
                   exp.GTE: lambda a, b: a >= b, exp.LT: lambda a, b: a < b, exp.LTE: lambda a, b: a <= b}
        for kind, fn in compare.items():
            if isinstance(node, kind):
                a, b = v(node.this, row), v(node.expression, row)
                if a is None or b is None:
                    return None
                if isinstance(a, str) != isinstance(b, str) and self.spark_time:
                    # time (a TIMESTAMP) compared with text: Spark reads the text as a timestamp
                    a, b = (_timestamp_us(a) if isinstance(a, str) else a), (_timestamp_us(b) if isinstance(b, str) else b)
                return fn(a, b)
        raise NotImplementedError(f"test evaluator: {type(node).__name__} in {node.sql()}")


def _like_regex(pattern: str) -> re.Pattern[str]:
    """Spark's LIKE: `%` any run, `_` one character, `\\` escapes the next character; written out here."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if ch == "%" else "." if ch == "_" else re.escape(ch))
        i += 1
    return re.compile("".join(out), re.DOTALL)


# ---------------------------------------------------------------------------------------------------------------
# Plans


class PlanEvaluator:
    """Evaluates plan JSON nodes over the rows of chunks (`rows[chunk_id]`, in write order)."""

    def __init__(self, plan: Mapping[str, Any], rows: Mapping[str, Sequence[Row]]) -> None:
        self.chunks = plan["chunks"]
        self.rows = rows

    def scan(self, node: Mapping[str, Any]) -> list[Row]:
        name = node["node"]
        kids = node["children"]
        if name == "ProjectionExec":
            return [{c: r.get(c) for c in node["columns"]} for r in self.scan(kids[0])]
        if name == "FilterExec":
            keep = Predicate(node["predicate"])
            return [r for r in self.scan(kids[0]) if keep(r)]
        if name == "UnionExec":
            return [r for k in kids for r in self.scan(k)]
        if name in ("SortExec", "SortPreservingMergeExec"):
            out = self.scan(kids[0])
            for item in reversed(node["sort"]):
                out.sort(key=lambda r, c=item["column"]: (r[c] is not None, r[c] if r[c] is not None else 0))
            return out
        if name == "DeduplicateExec":
            key = [s["column"] for s in node["sort_key"]]
            rows = self.scan(kids[0])
            if node.get("time_slice") is not None:  # PRODUCT.md Plan JSON: inclusive bounds on time
                low, high = node["time_slice"]
                rows = [r for r in rows if low <= r["time"] <= high]
            return dedup_rows(rows, key, order=CO)
        if name == "EmptyExec":
            return []
        if name == "ParquetExec":
            keep = Predicate(node["predicate"]) if node.get("predicate") else None
            return [r for g in node["file_groups"] for cid in g for r in self._read(cid, node["projection"], keep)]
        if name == "RecordBatchesExec":
            return [r for cid in node["chunks"] for r in self._read(cid, node["projection"], None)]
        raise NotImplementedError(name)

    def _read(self, chunk_id: str, projection: Sequence[str], keep: Predicate | None) -> Iterable[Row]:
        meta = self.chunks[chunk_id]
        for position, raw in enumerate(self.rows[chunk_id]):
            row = {c: raw.get(c) if c in meta["columns"] else None for c in meta["columns"]}
            if keep is not None and not keep(row):
                continue
            out = {c: row.get(c) for c in projection if c != CO}
            if CO in projection:
                out[CO] = (meta["order"], position)
            yield out


def multiset(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r.get(c) for c in columns) for r in rows)


def expected_rows(all_rows: Mapping[str, Sequence[Row]], chunk_orders: Mapping[str, int], key: Sequence[str],
                  where: str | None, columns: Sequence[str], time_range: tuple[int | None, int | None],
                  params: Mapping[str, Any] | None = None) -> Counter[tuple[Any, ...]]:
    """What `SELECT columns FROM t WHERE where` must return, computed from all chunks of the table."""
    tagged = [{**r, CO: (chunk_orders[cid], pos)} for cid, rs in all_rows.items() for pos, r in enumerate(rs)]
    merged = dedup_rows(tagged, key, order=CO)
    start, end = time_range
    merged = [r for r in merged if (start is None or r["time"] >= start) and (end is None or r["time"] < end)]
    if where:
        keep = Predicate(where, spark_time=True, params=params)
        merged = [r for r in merged if keep(r)]
    return multiset(merged, columns)
