"""A seeded SQLancer-style generator for iox-batch: random scenarios, random predicate trees with an independent
three-valued evaluator, the oracle rows they must select, and a shrinker.

Nothing here touches the planner or the executor: the oracle replays the scenario's own rows in write order
(chunk order, then position in the chunk) with PRODUCT.md's dedup, and evaluates predicates with SQL's
three-valued logic written out in Python. `time` in SQL is a TIMESTAMP of `floor(ns / 1000)` microseconds.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

T0 = 1_704_067_200_000_000_000  # 2024-01-01T00:00:00Z
DAY = 86_400_000_000_000
S = 1_000_000_000
# Tag values include SQL text, so a predicate over them carries it inside a literal.
TAG_VALUES = {"t1": ["a", "b", "x AND time > 5 AND y", None], "t2": ["p", "q AND time > 5 AND r", None]}
FIELDS = {"f": "float", "g": "integer", "s": "string"}
STRINGS = ["p", "q", "it's"]
# Times near one another (1 ns and 1 us neighbours) and around midnight, where partitions split.
TIMES = [T0 + 1 * S, T0 + 1 * S + 1, T0 + 1 * S + 1000, T0 + 2 * S, T0 + 3 * S + 999,
         T0 + DAY - 1, T0 + DAY, T0 + DAY + 1, T0 + DAY + 2 * S]

Tri = bool | None
Row = dict[str, Any]


@dataclass(frozen=True)
class Point:
    tags: tuple[tuple[str, str | None], ...]
    fields: tuple[tuple[str, Any], ...]
    time: int


@dataclass(frozen=True)
class ChunkSpec:
    id: str
    kind: str
    order: int
    points: tuple[Point, ...]


@dataclass(frozen=True)
class Scenario:
    chunks: tuple[ChunkSpec, ...]

    def entries(self) -> list[dict[str, Any]]:
        """As scenario-file chunk entries (line protocol)."""
        return [{"id": c.id, "kind": c.kind, "order": c.order, "lines": "\n".join(_line(p) for p in c.points)}
                for c in self.chunks]

    def rows(self) -> list[Row]:
        """PRODUCT.md's dedup of the whole table: per (tags, time), each field its last non-null value."""
        merged: dict[tuple[Any, ...], Row] = {}
        for chunk in sorted(self.chunks, key=lambda c: c.order):
            for p in chunk.points:
                tags = dict(p.tags)
                key = (tags.get("t1"), tags.get("t2"), p.time)
                out = merged.setdefault(key, {"t1": key[0], "t2": key[1], **{f: None for f in FIELDS},
                                              "time": p.time})
                for name, value in p.fields:
                    if value is not None:
                        out[name] = value
        return list(merged.values())

    def describe(self) -> str:
        return "\n".join(f"  - {e}" for e in self.entries())


def _escape_tag(value: str) -> str:
    return value.replace("\\", "\\\\").replace(" ", "\\ ").replace(",", "\\,").replace("=", "\\=")


def _lp_value(kind: str, value: Any) -> str:
    if kind == "float":
        return repr(float(value))
    if kind == "integer":
        return f"{value}i"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _line(p: Point) -> str:
    tags = "".join(f",{k}={_escape_tag(v)}" for k, v in p.tags if v is not None)
    fields = ",".join(f"{k}={_lp_value(FIELDS[k], v)}" for k, v in p.fields)
    return f"m{tags} {fields} {p.time}"


def random_scenario(rng: random.Random) -> Scenario:
    chunks: list[ChunkSpec] = []
    for order in range(1, rng.randint(2, 5) + 1):
        kind = rng.choice(["parquet", "ingester"])
        # Chunks overlap in time (few distinct times), so most queries run a dedup; some lack columns.
        names = list(FIELDS) if order == 1 else [f for f in FIELDS if rng.random() < 0.7] or ["f"]
        points: list[Point] = []
        base = rng.randrange(len(TIMES) - 2)
        for n in range(rng.randint(1, 8)):
            t1 = "a" if order == 1 and n == 0 else rng.choice(TAG_VALUES["t1"])
            t2 = "p" if order == 1 and n == 0 else rng.choice(TAG_VALUES["t2"])
            values = [(f, _random_value(rng, FIELDS[f])) for f in names
                      if (order == 1 and n == 0) or rng.random() < 0.7]
            values = values or [(names[0], _random_value(rng, FIELDS[names[0]]))]
            time = TIMES[min(len(TIMES) - 1, base + rng.randint(0, 2))] if rng.random() < 0.8 else rng.choice(TIMES)
            points.append(Point((("t1", t1), ("t2", t2)), tuple(values), time))
        chunks.append(ChunkSpec(f"C{order}", kind, order, tuple(points)))
    return Scenario(tuple(chunks))


def generate(seed: int, predicates: int) -> tuple[Scenario, list["Pred"]]:
    """The case of one seed, shared by the Spark leg and the planner leg: a scenario and its predicate trees."""
    rng = random.Random(seed)
    return random_scenario(rng), [random_predicate(rng) for _ in range(predicates)]


def _random_value(rng: random.Random, kind: str) -> Any:
    if kind == "float":
        return rng.randint(-6, 6) / 2
    if kind == "integer":
        return rng.randint(-3, 5)
    return rng.choice(STRINGS)


# ---------------------------------------------------------------------------------------------------------------
# Predicates: SQL text and a three-valued evaluator, built together


@dataclass(frozen=True)
class Pred:
    sql: str
    eval: Callable[[Row], Tri] = field(compare=False)
    shape: str
    children: tuple[Pred, ...] = ()

    def subtrees(self) -> Iterator[Pred]:
        yield self
        for child in self.children:
            yield from child.subtrees()


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _ts(ns: int) -> tuple[str, int]:
    """A TIMESTAMP literal at microsecond precision near `ns`, and its microseconds."""
    import datetime as dt

    us = ns // 1000
    stamp = dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=us)
    return f"TIMESTAMP '{stamp.strftime('%Y-%m-%d %H:%M:%S.%f')}'", us


def _cmp(op: str, a: Any, b: Any) -> Tri:
    if a is None or b is None:
        return None
    return {"=": a == b, "<>": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def _atom(rng: random.Random) -> Pred:
    kind = rng.randint(0, 11)
    op = rng.choice(["=", "<>", "<", "<=", ">", ">="])
    if kind <= 2:
        col = rng.choice(["t1", "t2"])
        value = rng.choice([v for v in TAG_VALUES[col] if v is not None] + ["zz"])
        return Pred(f"{col} {op} {_quote(value)}", lambda r, c=col, o=op, v=value: _cmp(o, r[c], v),
                    f"{col} {op} 's'")
    if kind == 3:
        col = rng.choice(["t1", "t2", "f", "g", "s"])
        negate = rng.random() < 0.5
        return Pred(f"{col} IS {'NOT ' if negate else ''}NULL",
                    lambda r, c=col, n=negate: (r[c] is not None) if n else (r[c] is None),
                    f"{col} IS {'NOT ' if negate else ''}NULL")
    if kind == 4:
        col = rng.choice(["t1", "t2"])
        values = rng.sample([v for v in TAG_VALUES[col] if v is not None] + ["zz"], 2)
        return Pred(f"{col} IN ({', '.join(map(_quote, values))})",
                    lambda r, c=col, vs=tuple(values): None if r[c] is None else r[c] in vs, f"{col} IN (s, s)")
    if kind == 5:
        prefix = rng.choice(["a", "x", "b%", "_"])
        pattern = prefix + "%"
        regex = re.compile("^" + "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch)
                                         for ch in pattern) + "$", re.S)
        return Pred(f"t1 LIKE {_quote(pattern)}",
                    lambda r, rx=regex: None if r["t1"] is None else bool(rx.match(r["t1"])), "t1 LIKE 's'")
    if kind == 6:
        x = rng.randint(-6, 6) / 2
        return Pred(f"f {op} {x}", lambda r, o=op, x=x: _cmp(o, r["f"], x), f"f {op} n")
    if kind == 7:
        lo = rng.randint(-3, 3)
        hi = lo + rng.randint(0, 4)
        return Pred(f"g BETWEEN {lo} AND {hi}",
                    lambda r, lo=lo, hi=hi: None if r["g"] is None else lo <= r["g"] <= hi, "g BETWEEN n AND n")
    if kind == 8:
        value = rng.choice(STRINGS)
        return Pred(f"s {op} {_quote(value)}", lambda r, o=op, v=value: _cmp(o, r["s"], v), f"s {op} 's'")
    if kind == 9:
        lit, us = _ts(rng.choice(TIMES) + rng.choice([0, 1000, -1000]))
        return Pred(f"time {op} {lit}", lambda r, o=op, us=us: _cmp(o, r["time"] // 1000, us), f"time {op} ts")
    if kind == 10:
        a, b = sorted([rng.choice(TIMES), rng.choice(TIMES)])
        (la, ua), (lb, ub) = _ts(a), _ts(b)
        return Pred(f"time BETWEEN {la} AND {lb}",
                    lambda r, ua=ua, ub=ub: ua <= r["time"] // 1000 <= ub, "time BETWEEN ts AND ts")
    # A string literal that holds SQL text: must never be read as a bound.
    text = rng.choice([" AND time > 5 AND ", "x AND time > 2000000000000000000 AND y", "') OR (time < 0"])
    return Pred(f"t2 = {_quote(text)}", lambda r, v=text: _cmp("=", r["t2"], v), "t2 = 'sql'")


def random_predicate(rng: random.Random, depth: int = 3) -> Pred:
    roll = rng.random()
    if depth == 0 or roll < 0.35:
        return _atom(rng)
    if roll < 0.5:
        inner = random_predicate(rng, depth - 1)
        return Pred(f"NOT ({inner.sql})", lambda r, p=inner: _not(p.eval(r)), f"NOT ({inner.shape})", (inner,))
    a, b = random_predicate(rng, depth - 1), random_predicate(rng, depth - 1)
    if roll < 0.78:
        return Pred(f"({a.sql}) AND ({b.sql})", lambda r, a=a, b=b: _and(a.eval(r), b.eval(r)),
                    f"({a.shape}) AND ({b.shape})", (a, b))
    return Pred(f"({a.sql}) OR ({b.sql})", lambda r, a=a, b=b: _or(a.eval(r), b.eval(r)),
                f"({a.shape}) OR ({b.shape})", (a, b))


def _not(a: Tri) -> Tri:
    return None if a is None else not a


def _and(a: Tri, b: Tri) -> Tri:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _or(a: Tri, b: Tri) -> Tri:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


# ---------------------------------------------------------------------------------------------------------------
# Queries: each batches several predicates into one Spark job


def partition_query(pred: Pred) -> str:
    """Ternary logic partitioning with the rows themselves: one branch per part (p, NOT p, p IS NULL), each its
    own scan with its own pushdown, tagged with the part (a `*` next to an item, inside a UNION ALL)."""
    return " UNION ALL ".join(f"SELECT '{part}' AS part, * FROM m WHERE {where}" for part, where in (
        ("p", pred.sql), ("not", f"NOT ({pred.sql})"), ("null", f"({pred.sql}) IS NULL")))


def agg_query(pred: Pred, star: bool = True) -> str:
    """An aggregate with user aliases (one starting with `__`) over a star subquery, or straight over the table
    (`star=False`: then only the columns it names are read, so dedups of different partitions may read different
    columns under one projection: a shape that once lost rows)."""
    source = "(SELECT * FROM m) s" if star else "m"
    return f"SELECT t1 AS __k, count(*) AS n, sum(g) AS sg, max(time) AS mt FROM {source} WHERE {pred.sql} GROUP BY t1"


def expected_partitions(scenario: Scenario, pred: Pred) -> list[tuple[Any, ...]]:
    """The rows of each part, as `partition_query` returns them (time as microseconds)."""
    out = []
    for r in scenario.rows():
        value = pred.eval(r)
        part = "p" if value is True else "not" if value is False else "null"
        out.append((part, r["t1"], r["t2"], _norm(r["f"]), r["g"], r["s"], r["time"] // 1000))
    return sorted(out, key=repr)


def expected_agg(scenario: Scenario, pred: Pred) -> list[tuple[Any, ...]]:
    groups: dict[Any, list[Row]] = {}
    for r in scenario.rows():
        if pred.eval(r) is True:
            groups.setdefault(r["t1"], []).append(r)
    out = []
    for k, rows in groups.items():
        gs = [r["g"] for r in rows if r["g"] is not None]
        out.append((k, len(rows), sum(gs) if gs else None, max(r["time"] for r in rows) // 1000))
    return sorted(out, key=repr)


def _norm(value: Any) -> Any:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def micros_of(text: str) -> int:
    """RFC 3339 text from the output as microseconds (the set operations keep Spark's microseconds)."""
    import datetime as dt

    m = re.fullmatch(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d+))?Z", text)
    assert m, text
    stamp = dt.datetime.strptime(m[1], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.timezone.utc)
    seconds = int((stamp - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)).total_seconds())
    return seconds * 1_000_000 + int((m[2] or "").ljust(9, "0")[:6])


# ---------------------------------------------------------------------------------------------------------------
# Shrinking


def shrink(scenario: Scenario, pred: Pred, fails: Callable[[Scenario, Pred], bool],
           budget: int = 60) -> tuple[Scenario, Pred]:
    """Greedily drop chunks, rows and predicate parts while `fails` still holds (at most `budget` tries)."""
    tries = 0
    changed = True
    while changed and tries < budget:
        changed = False
        for candidate in _smaller(scenario, pred):
            tries += 1
            if tries > budget:
                break
            if fails(*candidate):
                scenario, pred = candidate
                changed = True
                break
    return scenario, pred


def _smaller(scenario: Scenario, pred: Pred) -> Iterator[tuple[Scenario, Pred]]:
    for sub in list(pred.subtrees())[1:]:
        yield scenario, sub
    chunks = scenario.chunks
    if len(chunks) > 1:
        for i in range(len(chunks)):
            yield Scenario(chunks[:i] + chunks[i + 1:]), pred
    for i, chunk in enumerate(chunks):
        if len(chunk.points) > 1:
            for j in range(len(chunk.points)):
                smaller = replace(chunk, points=chunk.points[:j] + chunk.points[j + 1:])
                yield Scenario(chunks[:i] + (smaller,) + chunks[i + 1:]), pred
