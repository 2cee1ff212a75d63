"""A seeded, replayable query fuzzer on real Spark and real Postgres (SQLancer-style), against the independent
oracle of `tests/fuzz_sql.py`.

Each seed builds one random scenario (overlapping ingester and Parquet chunks, NULL tags, missing columns, 1 ns
neighbours, midnight crossings, tag values holding SQL text) and `PREDICATES_PER_SEED` random predicate trees
(NOT/AND/OR over tags, fields and time; IN, BETWEEN, LIKE, IS NULL; literals holding SQL text). One case is one
predicate; per seed, batched into a few Spark jobs:
- its rows (`SELECT q, * ... UNION ALL ...`) equal the oracle's;
- ternary logic partitioning: the counts under p, NOT p and p IS NULL add up to the table's count, each equal to
  the oracle's;
- an aggregate with `__` aliases over a star subquery equals the oracle's.
All of it runs on the optimized plan under a dedup strategy (rotating by seed through arrow, shared, window and
node; `IOX_FUZZ_STRATEGIES=all` runs every one per seed) and on the naive plan (one dedup over everything, no
pushdown). Since every run must equal the oracle, they equal one another.

`IOX_FUZZ_CASES` sets the number of cases (default 240 in CI); `IOX_FUZZ_SEED` the first seed. A failure prints
the seed, the strategy, and a scenario and SQL shrunk by dropping chunks, rows and predicate parts; replay it
with `pytest tests/spark/test_fuzz.py -k 'seed=N'` (same IOX_FUZZ_SEED).
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

import fuzz_sql as fz
from iox_planner.catalog import Catalog
from iox_planner.errors import IoxError
from spark_helpers import load, run_jsonl

pytestmark = pytest.mark.spark

PREDICATES_PER_SEED = 8
CASES = int(os.environ.get("IOX_FUZZ_CASES", "240"))
FIRST_SEED = int(os.environ.get("IOX_FUZZ_SEED", "0"))
STRATEGIES = ("arrow", "shared", "window", "node")
SEEDS = range(FIRST_SEED, FIRST_SEED + max(1, CASES // PREDICATES_PER_SEED))


def generate(seed: int) -> tuple[fz.Scenario, list[fz.Pred]]:
    rng = random.Random(seed)
    return fz.random_scenario(rng), [fz.random_predicate(rng) for _ in range(PREDICATES_PER_SEED)]


def runs(seed: int) -> list[tuple[str, bool]]:
    """(strategy, optimize) pairs a seed runs: the optimized plan under one or every strategy, and the naive."""
    chosen = STRATEGIES if os.environ.get("IOX_FUZZ_STRATEGIES") == "all" else (STRATEGIES[seed % 4],)
    return [(s, True) for s in chosen] + [("node", False)]


def check(spark: Any, catalog: Catalog, db: str, scenario: fz.Scenario, preds: list[fz.Pred], strategy: str,
          optimize: bool) -> tuple[int, str] | None:
    """The first mismatch with the oracle as (predicate index, what differs), or None."""
    def run(sql: str) -> list[dict[str, Any]]:
        return run_jsonl(spark, catalog, db, sql, optimize=optimize, strategy=strategy)

    got_tlp = {(r["q"], r["part"]): r["n"] for r in run(fz.tlp_query(preds))}
    want_tlp = fz.expected_tlp(scenario, preds)
    for i in range(len(preds)):
        parts = [got_tlp[(i, k)] for k in ("p", "not", "null")]
        if sum(parts) != got_tlp[(-1, "all")]:
            return i, f"TLP: p + NOT p + p IS NULL = {parts} does not add up to count(*) = {got_tlp[(-1, 'all')]}"
        want = [want_tlp[(i, k)] for k in ("p", "not", "null")]
        if parts != want:
            return i, f"TLP counts (p, NOT p, IS NULL) {parts}, oracle {want}"
    got_rows = sorted(((r["q"], r["t1"], r["t2"], fz._norm(r["f"]), r["g"], r["s"], fz.micros_of(r["time"]))
                       for r in run(fz.rows_query(preds))), key=repr)
    want_rows = fz.expected_rows(scenario, preds)
    if got_rows != want_rows:
        i = next(j for j in range(len(preds)) if [r for r in got_rows if r[0] == j] != [r for r in want_rows
                                                                                      if r[0] == j])
        return i, f"rows differ: got {[r for r in got_rows if r[0] == i]}, oracle {[r for r in want_rows if r[0] == i]}"
    for i, pred in enumerate(preds[:2]):
        rows = run(fz.agg_query(pred))
        if any(list(r) != ["__k", "n", "sg", "mt"] for r in rows):
            return i, f"aggregate columns {[list(r) for r in rows[:1]]}, want ['__k', 'n', 'sg', 'mt']"
        got = sorted(((r["__k"], r["n"], r["sg"], fz.micros_of(r["mt"])) for r in rows), key=repr)
        if got != fz.expected_agg(scenario, pred):
            return i, f"aggregate rows {got}, oracle {fz.expected_agg(scenario, pred)}"
    return None


def _report(spark: Any, catalog: Catalog, db: str, seed: int, scenario: fz.Scenario, pred: fz.Pred,
            strategy: str, optimize: bool, why: str) -> str:
    attempts = [0]

    def fails(sc: fz.Scenario, p: fz.Pred) -> bool:
        attempts[0] += 1
        name = f"{db}_s{attempts[0]}"
        try:
            load(catalog, name, sc.entries())
            return check(spark, catalog, name, sc, [p], strategy, optimize) is not None
        except IoxError as err:
            return "unknown column" not in str(err)  # a dropped chunk took a column away: not the same failure

    small, p = fz.shrink(scenario, pred, fails)
    return (f"fuzz seed={seed} strategy={strategy} optimized={optimize}: {why}\n"
            f"shrunk predicate: {p.sql}\nshrunk scenario:\n{small.describe()}\n"
            f"queries: {fz.tlp_query([p])}\n         {fz.rows_query([p])}")


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed={s}")
def test_fuzz(spark: Any, catalog: Catalog, db: str, seed: int) -> None:
    scenario, preds = generate(seed)
    load(catalog, db, scenario.entries())
    for strategy, optimize in runs(seed):
        try:
            found = check(spark, catalog, db, scenario, preds, strategy, optimize)
        except IoxError as err:
            pytest.fail(f"fuzz seed={seed} strategy={strategy} optimized={optimize} raised {err}\n"
                        f"predicates: {[p.sql for p in preds]}\nscenario:\n{scenario.describe()}")
        if found is not None:
            i, why = found
            pytest.fail(_report(spark, catalog, db, seed, scenario, preds[i], strategy, optimize, why))


def test_generator_is_replayable_and_varied() -> None:
    """Same seed, same case; and the predicates reach many shapes (counted, not just hoped for)."""
    assert [p.sql for p in generate(7)[1]] == [p.sql for p in generate(7)[1]]
    assert generate(7)[0] == generate(7)[0]
    shapes = {p.shape for seed in range(40) for p in generate(seed)[1]}
    assert len(shapes) > 150
