"""A seeded, replayable query fuzzer on real Spark and real Postgres (SQLancer-style), against the independent
oracle of `tests/fuzz_support.py`.

Each seed builds one random scenario (overlapping ingester and Parquet chunks, NULL tags, missing columns, 1 ns
neighbours, midnight crossings, tag values holding SQL text) and `PREDICATES_PER_SEED` random predicate trees
(NOT/AND/OR over tags, fields and time; IN, BETWEEN, LIKE, IS NULL; literals holding SQL text). One case is one
predicate, checked with one Spark job of three scans (`WHERE p`, `WHERE NOT (p)`, `WHERE (p) IS NULL`, each with
its own pushdown):
- ternary logic partitioning: the three parts together hold exactly `count(*)` rows of the table;
- each part's rows equal the oracle's (so a row lost or added by pushdown, pruning or a dedup shows);
- per seed, an aggregate with `__` aliases, over a star subquery and straight over the table, equals the
  oracle's.
Cases rotate through five runs: the optimized plan under each dedup strategy (arrow, shared, window, node) and
the naive plan (one dedup over everything, no pushdown); `IOX_FUZZ_STRATEGIES=all` runs all five for every
case. Every run must equal the oracle, so they equal one another.

Spark's cost is per scan, and unions of many scans cost more than their parts, so a case is one small job. Each
query runs with `spark.sql.shuffle.partitions=1` (restored afterwards): results never depend on it, and tiny
scenarios spend most of their time scheduling empty shuffle tasks otherwise.

Every case runs on the in-process runner over a local warehouse; over an s3:// warehouse (the suite's S3 server)
two seeds' first five cases (one turn of each run) in CI, every case with IOX_TEST_ALL=1; on the connect runner
(`tests/connect_support.py`) the first `ON_CONNECT` cases of one seed drawn from IOX_CONNECT_SEED (one run each
of the five), or every case with IOX_CONNECT_RUN=all, against the same oracle.

`IOX_FUZZ_CASES` sets the number of cases (default 64 in CI: about 80 s measured on the shared 2-core
machine); `IOX_FUZZ_SEED` the first seed. A failure prints the seed, the run, and a scenario and SQL shrunk by
dropping chunks, rows and predicate parts; replay it with `pytest tests/spark_jobs/test_fuzz.py -k 'seed=N'` (same
IOX_FUZZ_SEED).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

import fuzz_support as fz
from common_support import FULL, sampled
from connect_support import RUN_ALL, Leg, runner_param, sample
from iox_planner.catalog.store import Catalog
from iox_planner.errors import IoxError
from spark_support import load

pytestmark = pytest.mark.spark

PREDICATES_PER_SEED = 8
CASES = int(os.environ.get("IOX_FUZZ_CASES", "64"))
FIRST_SEED = int(os.environ.get("IOX_FUZZ_SEED", "0"))
RUNS = (("arrow", True), ("shared", True), ("window", True), ("node", True), ("node", False))
SEEDS = range(FIRST_SEED, FIRST_SEED + max(1, -(-CASES // PREDICATES_PER_SEED)))
ON_CONNECT = len(RUNS)
SMALL_SHUFFLES = {"spark.sql.shuffle.partitions": "1"}


def generate(seed: int) -> tuple[fz.Scenario, list[fz.Pred]]:
    return fz.generate(seed, PREDICATES_PER_SEED)


def runs(seed: int, i: int) -> list[tuple[str, bool]]:
    """The (strategy, optimize) runs of case i of a seed: one, rotating, or all of them."""
    if os.environ.get("IOX_FUZZ_STRATEGIES") == "all":
        return list(RUNS)
    return [RUNS[(seed * PREDICATES_PER_SEED + i) % len(RUNS)]]


def check(runner: Leg, catalog: Catalog, db: str, scenario: fz.Scenario, pred: fz.Pred, strategy: str,
          optimize: bool, aggregate: bool = False) -> str | None:
    """What differs from the oracle for one predicate, or None."""
    def run(sql: str) -> list[dict[str, Any]]:
        return runner.jsonl(catalog, db, sql, optimize=optimize, strategy=strategy, conf=SMALL_SHUFFLES)

    got = sorted(((r["part"], r["t1"], r["t2"], fz._norm(r["f"]), r["g"], r["s"], fz.micros_of(r["time"]))
                  for r in run(fz.partition_query(pred))), key=repr)
    want = fz.expected_partitions(scenario, pred)
    if len(got) != len(want):
        return f"TLP: p, NOT p and p IS NULL hold {len(got)} rows together; the table has {len(want)}"
    if got != want:
        extra, missing = sorted(set(got) - set(want), key=repr), sorted(set(want) - set(got), key=repr)
        return f"parts differ: got {extra}, oracle {missing}"
    for star in ((True, False) if aggregate else ()):
        rows = run(fz.agg_query(pred, star))
        if any(list(r) != ["__k", "n", "sg", "mt"] for r in rows):
            return f"aggregate columns {[list(r) for r in rows[:1]]}, want ['__k', 'n', 'sg', 'mt']"
        agg = sorted(((r["__k"], r["n"], r["sg"], fz.micros_of(r["mt"])) for r in rows), key=repr)
        if agg != fz.expected_agg(scenario, pred):
            return f"aggregate rows {agg} ({fz.agg_query(pred, star)}), oracle {fz.expected_agg(scenario, pred)}"
    return None


def _report(runner: Leg, catalog: Catalog, db: str, seed: int, scenario: fz.Scenario, pred: fz.Pred,
            strategy: str, optimize: bool, why: str) -> str:
    attempts = [0]

    def fails(sc: fz.Scenario, p: fz.Pred) -> bool:
        attempts[0] += 1
        name = f"{db}_s{attempts[0]}"
        try:
            load(catalog, name, sc.entries())
            return check(runner, catalog, name, sc, p, strategy, optimize, aggregate=True) is not None
        except IoxError as err:
            return "unknown column" not in str(err)  # a dropped chunk took a column away: not the same failure

    small, p = fz.shrink(scenario, pred, fails)
    return (f"fuzz seed={seed} runner={runner.name} strategy={strategy} optimized={optimize}: {why}\n"
            f"shrunk predicate: {p.sql}\nshrunk scenario:\n{small.describe()}\n"
            f"query: {fz.partition_query(p)}")


@pytest.mark.parametrize(("runner", "seed"), [runner_param("in-process", seed=seed) for seed in SEEDS]
                         + [runner_param("connect", seed=seed) for seed in sample(SEEDS, 1)], indirect=["runner"])
def test_fuzz(runner: Leg, catalog: Catalog, db: str, seed: int) -> None:
    first = (seed - FIRST_SEED) * PREDICATES_PER_SEED
    cases = max(0, CASES - first)
    if runner.name == "connect" and not RUN_ALL:
        cases = min(cases, ON_CONNECT)
    fuzz(runner, catalog, db, seed, cases)


@pytest.mark.parametrize(("runner", "seed"), [runner_param("in-process", seed=seed)
                                              for seed in sampled(list(SEEDS), ci=2)], indirect=["runner"])
def test_fuzz_on_an_s3_warehouse(runner: Leg, catalog: Catalog, db: str, seed: int, s3_warehouse: str) -> None:
    """The same cases over an s3:// warehouse (the executor's object-store reader): in CI two seeds, one turn of
    each of the five runs (IOX_TEST_ALL=1: every seed, every case)."""
    fuzz(runner, catalog, db, seed, PREDICATES_PER_SEED if FULL else len(RUNS))


def fuzz(runner: Leg, catalog: Catalog, db: str, seed: int, cases: int) -> None:
    """The first `cases` predicates of `seed`, each against the oracle; a failure shrunk and reported."""
    scenario, preds = generate(seed)
    load(catalog, db, scenario.entries())
    for i, pred in enumerate(preds[:cases]):
        for strategy, optimize in runs(seed, i):
            try:
                why = check(runner, catalog, db, scenario, pred, strategy, optimize, aggregate=i == 0)
            except IoxError as err:
                pytest.fail(f"fuzz seed={seed} runner={runner.name} strategy={strategy} optimized={optimize} "
                            f"raised {err}\npredicate: {pred.sql}\nscenario:\n{scenario.describe()}")
            if why is not None:
                pytest.fail(_report(runner, catalog, db, seed, scenario, pred, strategy, optimize, why))


def test_generator_is_replayable_and_varied() -> None:
    """Same seed, same case; and the predicates reach many shapes (counted, not just hoped for)."""
    assert [p.sql for p in generate(7)[1]] == [p.sql for p in generate(7)[1]]
    assert generate(7)[0] == generate(7)[0]
    shapes = {p.shape for seed in range(40) for p in generate(seed)[1]}
    assert len(shapes) > 150
