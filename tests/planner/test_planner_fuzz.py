"""The query fuzzer's planner leg: the same seeded scenarios and predicate trees as `tests/spark_jobs/test_fuzz.py`, but
the plans are executed by the reference evaluator (`reference_support.PlanEvaluator`) instead of Spark, so many
more cases fit in CI. It checks what the planner decides (pruning by partition, time and tag; predicate and
projection pushdown; dedup splitting and removal) against the oracle of `tests/fuzz_support.py`:

- ternary logic partitioning: for each predicate p, the plans of `WHERE p`, `WHERE NOT (p)` and `WHERE (p) IS NULL`
  are each evaluated (their scan trees, then the query's own predicate by the oracle's three-valued evaluator), and
  each part holds exactly the oracle's rows, so together they hold the table;
- the optimized plan and the naive plan (one dedup over everything, no pushdown) give those same rows.

The executor's part (Spark reading files, the dedup strategies, time bounds for the merge workers) is the Spark
leg's. `IOX_FUZZ_PLANNER_CASES` sets the number of predicates (default 256 in CI: about 25 s on the 2-core machine with `-n 2`),
`IOX_FUZZ_SEED` the first seed (shared with the Spark leg, so a seed means the same case in both).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

import fuzz_support as fz
from iox_planner.ingest.scenario import parse_scenario, scenario_source
from iox_planner.planner import plan_query
from iox_planner.planner.serde import plan_to_dict
from reference_support import PlanEvaluator, dedup_rows

PREDICATES_PER_SEED = 8
CASES = int(os.environ.get("IOX_FUZZ_PLANNER_CASES", "256"))
FIRST_SEED = int(os.environ.get("IOX_FUZZ_SEED", "0"))
SEEDS_PER_TEST = 10
SEEDS = range(FIRST_SEED, FIRST_SEED + max(1, -(-CASES // PREDICATES_PER_SEED)))
BATCHES = [SEEDS[i:i + SEEDS_PER_TEST] for i in range(0, len(SEEDS), SEEDS_PER_TEST)]
COLUMNS = ("t1", "t2", "f", "g", "s", "time")
PARTS = (("p", "{}"), ("not", "NOT ({})"), ("null", "({}) IS NULL"))


def chunk_rows(scenario: fz.Scenario) -> dict[str, list[dict[str, Any]]]:
    """Each (suffixed) chunk's rows in write order, as the files hold them: a Parquet chunk already deduplicated
    (keys unique, each field its last non-null value), an ingester chunk exactly as written."""
    parsed = parse_scenario({"chunks": scenario.entries()})
    rows: dict[str, list[dict[str, Any]]] = {}
    for chunk in parsed.chunks:
        for cid, _table, _partition, points in chunk.groups():
            data = [{**p.tags, **{k: v for k, (_t, v) in p.fields.items()}, "time": p.time} for p in points]
            if chunk.kind.value == "parquet":
                tags = sorted({k for p in points for k in p.tags})
                data = dedup_rows(data, [*tags, "time"])
            rows[cid] = data
    return rows


def source_of(scenario: fz.Scenario) -> Any:
    return scenario_source(parse_scenario({"db": "fuzz", "chunks": scenario.entries()}))


def part_rows(source: Any, rows: dict[str, list[dict[str, Any]]], where: str, pred: fz.Pred,
              part: str, optimize: bool) -> list[tuple[Any, ...]]:
    plan = plan_to_dict(plan_query(f"SELECT * FROM m WHERE {where}", source, optimize=optimize))
    [tree] = plan["children"]
    scanned = PlanEvaluator(plan, rows).scan(tree)
    out = []
    for r in scanned:
        full = {c: r.get(c) for c in COLUMNS}
        value = pred.eval(full)
        if {"p": value is True, "not": value is False, "null": value is None}[part]:
            out.append((part, full["t1"], full["t2"], fz._norm(full["f"]), full["g"], full["s"],
                        full["time"] // 1000))
    return out


@pytest.mark.parametrize("seeds", BATCHES, ids=lambda b: f"seeds={b.start}-{b.stop - 1}")
def test_planner_fuzz(seeds: range) -> None:
    for seed in seeds:
        scenario, preds = fz.generate(seed, PREDICATES_PER_SEED)
        rows = chunk_rows(scenario)
        source = source_of(scenario)
        first = (seed - FIRST_SEED) * PREDICATES_PER_SEED
        for pred in preds[:max(0, CASES - first)]:
            want = fz.expected_partitions(scenario, pred)
            for optimize in (True, False):
                got = sorted((row for part, template in PARTS
                              for row in part_rows(source, rows, template.format(pred.sql), pred, part, optimize)),
                             key=repr)
                assert got == want, (
                    f"planner fuzz seed={seed} optimized={optimize}: predicate {pred.sql}\n"
                    f"got rows the oracle lacks {sorted(set(got) - set(want), key=repr)}, oracle rows missing "
                    f"{sorted(set(want) - set(got), key=repr)}\nscenario:\n{scenario.describe()}")


def test_the_planner_leg_fails_on_a_lost_row() -> None:
    """The check can fail: a scan that loses one chunk's rows gives a different part."""
    scenario, preds = fz.generate(3, 1)
    rows = chunk_rows(scenario)
    first = next(iter(rows))
    damaged = {**rows, first: rows[first][1:]}
    got = sorted((row for part, template in PARTS
                  for row in part_rows(source_of(scenario), damaged, template.format("true"), preds[0], part, True)), key=repr)
    assert got != fz.expected_partitions(scenario, preds[0])
