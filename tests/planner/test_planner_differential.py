"""Differential test: for seeded random chunk sets (several partitions, overlapping and disjoint chunks, ingester
chunks with duplicates of their own, missing columns, NULLs) and random queries (filters on tags, fields and
time, projections, parameters, time ranges, small limits), three answers must agree:

- the optimized plan, executed by the reference evaluator (`reference_support`), then the query's WHERE;
- the naive initial plan, executed the same way;
- the oracle: every chunk's rows deduplicated as PRODUCT.md says, then the WHERE (no planner code involved).

`IOX_DIFF_CASES` sets the number of cases (default 400); a failure names its seed, and `IOX_DIFF_SEED=<n>`
replays one.
"""

from __future__ import annotations

import datetime as dt
import os
import random
from dataclasses import dataclass
from typing import Any

import pytest

from iox_planner.model import CHUNK_ORDER, Chunk, ChunkKind, ColumnType, StaticSource
from iox_planner.planner import PlannerSettings, plan_query
from iox_planner.planner.explain import render_tree
from iox_planner.planner.serde import plan_to_dict

from reference_support import PlanEvaluator, Predicate, dedup_rows, expected_rows, multiset

CASES = int(os.environ.get("IOX_DIFF_CASES", "400"))
BATCH = 25
DAY = 86_400 * 10**9
BASE = 1_704_067_200 * 10**9  # 2024-01-01T00:00:00Z
TAGS = ["t1", "t2", "t3"]
FIELDS = {"f": ColumnType.FLOAT, "i": ColumnType.INTEGER, "s": ColumnType.STRING, "b": ColumnType.BOOLEAN}
# Offsets within a day, in ns: neighbours 1 ns and 1 µs apart, so that both key equality and Spark's microsecond
# view of time are exercised.
OFFSETS = [0, 1, 999, 1_000, 1_001, 1_999, 2_000, 5_000, 5_001, 7_000, 1_000_000, 1_000_001, 3_600 * 10**9]


@dataclass
class Case:
    seed: int
    chunks: list[Chunk]
    rows: dict[str, list[dict[str, Any]]]
    sort_keys: dict[str, tuple[str, ...]]
    query: str
    where: str | None
    select: list[str]
    params: dict[str, Any]
    time_range: tuple[int | None, int | None]
    settings: PlannerSettings


def _timestamp_literal(ns: int) -> str:
    us = ns // 1000
    stamp = dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=us)
    return stamp.strftime("%Y-%m-%d %H:%M:%S.%f")


def make_case(seed: int) -> Case:
    r = random.Random(seed)
    days = r.choice([1, 1, 2, 3])
    chunks: list[Chunk] = []
    rows: dict[str, list[dict[str, Any]]] = {}
    orders = r.sample(range(1, 100), 9)
    for n in range(r.randint(1, 8)):
        kind = ChunkKind.INGESTER if r.random() < 0.3 else ChunkKind.PARQUET
        day = r.randrange(days)
        tags = [t for t in TAGS if r.random() < 0.8]
        fields = [f for f in FIELDS if r.random() < 0.7]
        columns = {**{t: ColumnType.TAG for t in tags}, **{f: FIELDS[f] for f in fields}, "time": ColumnType.TIME}
        # Spans of one point, a few neighbours, or a long stretch over others; rows sit on both ends of the span,
        # so neighbouring chunks often touch, and a long chunk overlaps short ones that do not overlap each other.
        first = r.randrange(len(OFFSETS))
        last = min(len(OFFSETS) - 1, first + r.choice([0, 0, 1, 2, 4, 12]))
        span = OFFSETS[first: last + 1]
        data = []
        for n_row in range(r.randint(1, 6)):
            at = span[0] if n_row == 0 else span[-1] if n_row == 1 else r.choice(span)
            row: dict[str, Any] = {"time": BASE + day * DAY + at}
            for t in tags:
                row[t] = r.choice(["a", "b", "c", None] if r.random() < 0.2 else ["a", "a", "b"])
            for f in fields:
                if r.random() < 0.25:
                    row[f] = None
                elif f == "f":
                    row[f] = r.choice([0.5, 1.5, 2.5])
                elif f == "i":
                    row[f] = r.choice([1, 2, 3])
                elif f == "s":
                    row[f] = r.choice(["a", "x"])
                else:
                    row[f] = r.choice([True, False])
            data.append(row)
        if kind is ChunkKind.PARQUET:
            data = dedup_rows(data, [*tags, "time"])
        times = [d["time"] for d in data]
        known = r.random() > 0.1
        ranges = {}
        for t in tags:
            values = [d[t] for d in data if d[t] is not None]
            if values and r.random() < 0.5:
                ranges[t] = (min(values), max(values))
        cid = f"C{n}"
        chunks.append(Chunk(
            id=cid, kind=kind, table="m", partition=(dt.date(2024, 1, 1) + dt.timedelta(days=day)).isoformat(),
            order=orders[n], time_min=min(times) if known else None, time_max=max(times) if known else None,
            columns=columns, rows=len(data), tag_ranges=ranges,
            store="s3://x" if kind is ChunkKind.PARQUET and r.random() < 0.2 else "file://"))
        rows[cid] = data
    table_columns: dict[str, ColumnType] = {}
    for c in chunks:
        table_columns.update(c.columns)
    tags = sorted(c for c, t in table_columns.items() if t is ColumnType.TAG)
    fields = sorted(c for c, t in table_columns.items() if t.is_field)
    star = [*tags, *fields, "time"]
    sort_keys = {}
    for day in range(days):
        if tags and r.random() < 0.3:
            key = r.sample(tags, len(tags))
            sort_keys[(dt.date(2024, 1, 1) + dt.timedelta(days=day)).isoformat()] = (*key, "time")

    all_times = sorted({d["time"] for rs in rows.values() for d in rs})
    params: dict[str, Any] = {}

    def a_time() -> int:
        return r.choice(all_times) + r.choice([-1000, -1, 0, 0, 1, 1000])

    def conjunct() -> str:
        kind = r.randrange(12)
        if kind <= 3 and tags:
            t = r.choice(tags)
            return r.choice([f"{t} = 'a'", f"{t} <> 'b'", f"{t} IN ('a', 'c')", f"{t} > 'a'", f"{t} IS NULL",
                             f"{t} IS NOT NULL", f"NOT ({t} = 'b')", f"{t} <= 'a'"])
        if kind == 4 and tags:
            params["p"] = r.choice(["a", "b"])
            return f"{r.choice(tags)} = :p"
        if kind <= 6 and fields:
            f = r.choice(fields)
            return {"f": r.choice(["f > 1", "f IS NULL", "f = 2.5"]), "i": r.choice(["i >= 2", "i IS NOT NULL"]),
                    "s": r.choice(["s = 'x'", "s IS NULL"]), "b": r.choice(["b = true", "b IS NULL"])}[f]
        if kind <= 9:
            a, b = sorted([a_time(), a_time()])
            return r.choice([
                f"time >= TIMESTAMP '{_timestamp_literal(a)}'", f"time < TIMESTAMP '{_timestamp_literal(b)}'",
                f"time > TIMESTAMP '{_timestamp_literal(a)}'", f"time <= TIMESTAMP '{_timestamp_literal(b)}'",
                f"time = TIMESTAMP '{_timestamp_literal(a)}'", f"time <> TIMESTAMP '{_timestamp_literal(a)}'",
                f"time BETWEEN TIMESTAMP '{_timestamp_literal(a)}' AND TIMESTAMP '{_timestamp_literal(b)}'",
                f"TIMESTAMP '{_timestamp_literal(a)}' < time",
            ])
        if kind == 10 and tags and fields and "s" in fields:
            return f"{r.choice(tags)} = s"
        if tags and fields and "f" in fields:
            return f"({r.choice(tags)} = 'a' OR f > 1)"
        return "time IS NOT NULL"

    conjuncts = [conjunct() for _ in range(r.randint(0, 3))]
    where = " AND ".join(conjuncts) or None
    select = star if r.random() < 0.3 else r.sample(star, r.randint(1, len(star)))
    query = f"SELECT {'*' if select == star else ', '.join(select)} FROM m" + (f" WHERE {where}" if where else "")
    time_range: tuple[int | None, int | None] = (None, None)
    if r.random() < 0.3:
        a, b = sorted(r.sample(all_times + [all_times[-1] + 1], 2)) if len(all_times) > 1 else (
            all_times[0], all_times[0] + 1)
        time_range = (r.choice([a, None]), b)
    settings = PlannerSettings(target_partitions=r.randint(1, 4), max_dedup_partition_split=r.randint(1, 3),
                               max_dedup_time_split=r.randint(1, 3), max_parquet_fanout=r.randint(1, 3),
                               max_dedup_rows_per_slice=r.choice([1_000_000, r.randint(1, 6)]))
    return Case(seed, chunks, rows, sort_keys, query, where, select, params, time_range, settings)


def check(case: Case) -> None:
    source = StaticSource(tuple(case.chunks), partition_sort_keys={"m": case.sort_keys})
    kwargs = dict(params=case.params, time_start=case.time_range[0], time_end=case.time_range[1],
                  settings=case.settings, now_ns=0)
    optimized = plan_query(case.query, source, **kwargs)  # type: ignore[arg-type]
    naive = plan_query(case.query, source, optimize=False, **kwargs)  # type: ignore[arg-type]
    columns = [c for c, _ in optimized.scans[0].columns]
    assert columns == [c for c, _ in naive.scans[0].columns]
    assert CHUNK_ORDER not in columns
    got_plan, naive_plan = plan_to_dict(optimized), plan_to_dict(naive)
    got = PlanEvaluator(got_plan, case.rows).scan(got_plan["children"][0])  # type: ignore[index]
    want = PlanEvaluator(naive_plan, case.rows).scan(naive_plan["children"][0])  # type: ignore[index]
    assert multiset(got, columns) == multiset(want, columns), "optimized and naive scans differ"

    keep = Predicate(case.where, spark_time=True, params=case.params) if case.where else None
    result = multiset((r for r in got if keep is None or keep(r)), case.select)
    tags = sorted({c for ch in case.chunks for c, t in ch.columns.items() if t is ColumnType.TAG})
    oracle = expected_rows(case.rows, {c.id: c.order for c in case.chunks}, [*tags, "time"], case.where,
                           case.select, case.time_range, case.params)
    assert result == oracle, "the plan's answer differs from the rows deduplicated directly"


def _describe(case: Case) -> str:
    return (f"seed {case.seed}: {case.query} params={case.params} time_range={case.time_range} "
            f"settings={case.settings}\n" + "\n".join(f"  {c}\n    rows={case.rows[c.id]}" for c in case.chunks))


@pytest.mark.parametrize("first", range(0, CASES, BATCH), ids=lambda f: f"seeds {f}..{min(f + BATCH, CASES) - 1}")
def test_optimized_naive_and_oracle_agree(first: int) -> None:
    only = os.environ.get("IOX_DIFF_SEED")
    seeds = [int(only)] if only else range(first, min(first + BATCH, CASES))
    for seed in seeds:
        case = make_case(seed)
        try:
            check(case)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{_describe(case)}") from err


def test_cases_cover_what_matters() -> None:
    """The generator does produce the situations the test is for."""
    seen: dict[str, int] = {}
    for seed in range(CASES):
        case = make_case(seed)
        plan = plan_query(case.query, StaticSource(tuple(case.chunks), partition_sort_keys={"m": case.sort_keys}),
                          params=case.params, time_start=case.time_range[0], time_end=case.time_range[1],
                          settings=case.settings, now_ns=0)
        text = render_tree(plan)
        for what, hit in {
            "ingester chunk with duplicates": any(
                len({tuple(sorted(r.items())) for r in rs}) < len(rs) or len({r["time"] for r in rs}) < len(rs)
                for cid, rs in case.rows.items()),
            "several partitions": len({c.partition for c in case.chunks}) > 1,
            "dedup kept": "DeduplicateExec" in text,
            "dedup removed": "DeduplicateExec" not in text and len(case.chunks) > 1,
            "field filter above a dedup": any("FilterExec" in line and ("f " in line or "i " in line)
                                              for line in text.splitlines()),
            "partition limit note": "partition split skipped" in text,
            "time limit note": "time split skipped" in text,
            "fanout note": "max_parquet_fanout" in text,
            "time slices": "time_slice=" in text,
            "pruned by tag": "(by tag" in text or ", tag " in text,
            "unknown time range": any(c.time_min is None for c in case.chunks),
            "EmptyExec": "EmptyExec" in text,
        }.items():
            seen[what] = seen.get(what, 0) + bool(hit)
    assert all(seen.values()), seen
