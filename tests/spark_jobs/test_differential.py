"""Differential test on Spark: random scenarios, the optimized plan and the naive plan (one dedup over
everything), both run on Spark, against an independent reference written here in plain Python.

The reference never touches the files, the planner or the executor: it replays the scenario's own rows in
write order (chunk order, then position in the chunk) and applies PRODUCT.md's semantics directly.

Every scenario runs over a local warehouse (Spark's own Parquet reader) and, sampled in CI (IOX_TEST_ALL=1: all),
over an s3:// warehouse on the suite's S3 server (the executor's object-store reader, `spark_jobs/store_read.py`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from common_support import sampled
from iox_planner.catalog.store import Catalog
from spark_support import load, run_jsonl

pytestmark = pytest.mark.spark

SCENARIOS = 50
CASES = ([(seed, "local") for seed in range(SCENARIOS)]
         + sampled([(seed, "s3") for seed in range(SCENARIOS)], ci=6))
"""(seed, warehouse): every seed on a local warehouse; on an s3 one, six seeds in CI, spread over the strategies
and both query shapes (seed % 3, seed % 2)."""
DAY = 86_400_000_000_000
T0 = 1_704_067_200_000_000_000
TAG_VALUES = {"t1": ["a", "b", None], "t2": ["x", "y", None]}
FIELDS = {"f": "float", "g": "integer", "s": "string", "b": "boolean"}


@dataclass
class Row:
    tags: dict[str, str | None]
    fields: dict[str, Any]
    time: int


def _lp_value(kind: str, value: Any) -> str:
    if kind == "float":
        return repr(float(value))
    if kind == "integer":
        return f"{value}i"
    if kind == "boolean":
        return "true" if value else "false"
    return '"' + value + '"'


def random_scenario(rng: random.Random) -> tuple[list[dict[str, Any]], list[tuple[int, list[Row]]]]:
    """Chunks as scenario entries, and the same rows as (order, rows in write order) for the reference."""
    chunks: list[dict[str, Any]] = []
    truth: list[tuple[int, list[Row]]] = []
    keys = [(t1, t2) for t1 in TAG_VALUES["t1"] for t2 in TAG_VALUES["t2"]]
    for order in range(1, rng.randint(2, 7) + 1):
        kind = rng.choice(["parquet", "ingester"])
        day = rng.randint(0, 2)
        start = T0 + day * DAY + rng.randint(0, 8) * 1_000_000_000
        width = rng.choice([0, 2, 5, 12]) * 1_000_000_000
        # The first chunk has every field, so every column a query names exists in the table.
        fields = list(FIELDS) if order == 1 else [f for f in FIELDS if rng.random() < 0.7] or ["f"]
        rows: list[Row] = []
        for _ in range(rng.randint(1, 12)):
            t1, t2 = rng.choice(keys)
            time = start + rng.randint(0, width // 1_000_000_000) * 1_000_000_000 + rng.choice([0, 0, 0, 1, 1000])
            values: dict[str, Any] = {}
            for f in fields:
                if rng.random() < 0.75 or (order == 1 and not rows):
                    values[f] = {"float": lambda: round(rng.uniform(-5, 5), 2), "integer": lambda: rng.randint(-3, 9),
                                 "string": lambda: rng.choice(["p", "q", "r"]), "boolean": lambda: rng.random() < 0.5}[
                        FIELDS[f]]()
            if not values:
                values[fields[0]] = 1.0 if FIELDS[fields[0]] == "float" else {"integer": 1, "string": "p",
                                                                              "boolean": True}[FIELDS[fields[0]]]
            rows.append(Row({"t1": t1, "t2": t2}, values, time))
            if kind == "ingester" and rng.random() < 0.3:  # a rewrite inside the same chunk
                rows.append(Row({"t1": t1, "t2": t2}, {fields[0]: values.get(fields[0])} if values.get(fields[0])
                                is not None else dict(values), time))
        lines = []
        for row in rows:
            tags = "".join(f",{k}={v}" for k, v in sorted(row.tags.items()) if v is not None)
            fvals = ",".join(f"{k}={_lp_value(FIELDS[k], v)}" for k, v in sorted(row.fields.items()))
            lines.append(f"m{tags} {fvals} {row.time}")
        chunks.append({"id": f"C{order}", "kind": kind, "order": order, "lines": "\n".join(lines)})
        truth.append((order, rows))
    return chunks, truth


def reference_rows(truth: list[tuple[int, list[Row]]]) -> list[dict[str, Any]]:
    """PRODUCT.md's dedup: per key (tags + time, NULL tag equals NULL tag), every field its last non-null value."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for _, rows in sorted(truth, key=lambda item: item[0]):
        for row in rows:
            key = (row.tags["t1"], row.tags["t2"], row.time)
            out = merged.setdefault(key, {"t1": row.tags["t1"], "t2": row.tags["t2"], "time": row.time,
                                          **{f: None for f in FIELDS}})
            for name, value in row.fields.items():
                if value is not None:
                    out[name] = value
    return list(merged.values())


def random_predicate(rng: random.Random) -> tuple[str, Callable[[dict[str, Any]], bool]]:
    def one() -> tuple[str, Callable[[dict[str, Any]], bool]]:
        choice = rng.randint(0, 6)
        if choice == 0:
            v = rng.choice(["a", "b"])
            return f"t1 = '{v}'", lambda r: r["t1"] == v
        if choice == 1:
            return "t2 IS NULL", lambda r: r["t2"] is None
        if choice == 2:
            x = round(rng.uniform(-3, 3), 1)
            return f"f > {x}", lambda r: r["f"] is not None and r["f"] > x
        if choice == 3:
            n = rng.randint(0, 5)
            return f"g <= {n}", lambda r: r["g"] is not None and r["g"] <= n
        if choice == 4:
            return "s = 'p'", lambda r: r["s"] == "p"
        if choice == 5:
            sec = rng.randint(0, 8)
            day = rng.randint(0, 2)
            us = (T0 + day * DAY) // 1000 + sec * 1_000_000
            text = f"2024-01-0{day + 1} 00:00:0{sec}"
            return f"time >= TIMESTAMP '{text}'", lambda r: r["time"] // 1000 >= us
        v = rng.choice(["x", "y"])
        x = round(rng.uniform(-3, 3), 1)
        return (f"(t2 = '{v}' OR f < {x})",
                lambda r: r["t2"] == v or (r["f"] is not None and r["f"] < x))

    parts = [one() for _ in range(rng.randint(1, 3))]
    return " AND ".join(p for p, _ in parts), lambda r: all(fn(r) for _, fn in parts)


def _norm(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value


def _key(row: dict[str, Any]) -> tuple[str, ...]:
    return tuple(repr(_norm(row[k])) for k in sorted(row))


@pytest.mark.parametrize("seed,store", CASES, ids=[f"{store}-{seed}" for seed, store in CASES])
def test_optimized_naive_and_reference_agree(spark: Any, catalog: Catalog, db: str, seed: int, store: str,
                                             request: pytest.FixtureRequest) -> None:
    from iox_planner.timeutil import format_time

    if store == "s3":
        request.getfixturevalue("s3_warehouse")

    rng = random.Random(seed)
    chunks, truth = random_scenario(rng)
    load(catalog, db, chunks)
    expected_rows = reference_rows(truth)
    where, keep = random_predicate(rng)
    if seed % 2 == 0:
        sql = f"SELECT * FROM m WHERE {where}"
        expected = [{**{k: v for k, v in r.items() if k != "time"}, "time": format_time(r["time"])}
                    for r in expected_rows if keep(r)]
    else:
        sql = (f"SELECT t1, count(*) AS n, sum(f) AS sf, max(g) AS mg, min(s) AS ms FROM m WHERE {where} "
               "GROUP BY t1")
        groups: dict[Any, list[dict[str, Any]]] = {}
        for r in expected_rows:
            if keep(r):
                groups.setdefault(r["t1"], []).append(r)
        expected = []
        for t1, rows in groups.items():
            fs = [r["f"] for r in rows if r["f"] is not None]
            gs = [r["g"] for r in rows if r["g"] is not None]
            ss = [r["s"] for r in rows if r["s"] is not None]
            expected.append({"t1": t1, "n": len(rows), "sf": math.fsum(fs) if fs else None,
                             "mg": max(gs) if gs else None, "ms": min(ss) if ss else None})
    # Every dedup strategy of the executor takes its turn on the optimized plan; the naive plan runs as the
    # literal translation (one groupBy per DeduplicateExec).
    strategy = ("arrow", "shared", "window")[seed % 3]
    optimized = run_jsonl(spark, catalog, db, sql, strategy=strategy)
    naive = run_jsonl(spark, catalog, db, sql, optimize=False, strategy="node")
    want = sorted(map(_key, expected))
    assert sorted(map(_key, optimized)) == want, (sql, chunks)
    assert sorted(map(_key, naive)) == want, (sql, chunks)
