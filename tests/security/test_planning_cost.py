"""Issue 22, planning: no query makes the planner run for minutes or take the machine's memory.

Planning happens in this process against a scenario's chunk metadata (as `iox-batch explain --chunks` does). Each
case must plan, or be refused with one paragraph, within a few seconds; the shapes are those that took minutes
before (nested calls named like types were exponential in their depth).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from iox_planner.errors import IoxError
from iox_planner.ingest.scenario import read_scenario, scenario_source
from iox_planner.planner import plan_query

ROOT = Path(__file__).resolve().parents[2]
H2O = ROOT / "examples" / "h2o.yaml"
FAST_S = 5.0


@pytest.fixture(scope="module")
def h2o_source() -> Any:
    return scenario_source(read_scenario(str(H2O)))


def timed_plan(sql: str, source: Any) -> tuple[float, IoxError | None]:
    started = time.monotonic()
    try:
        plan_query(sql, source, now_ns=0)
        error = None
    except IoxError as err:
        error = err
    return time.monotonic() - started, error


def nested(name: str, depth: int, inner: str = "1", after: str = "") -> str:
    return f"SELECT {(name + '(') * depth}{inner}{(')' + after) * depth} AS n FROM h2o"


# Each of these took minutes before (depth 22 of struct: over 100 s; 30 of int: 301 s and 4.5 GB).
@pytest.mark.parametrize("name, depth", [("struct", 40), ("int", 40), ("decimal", 40), ("array", 40),
                                         ("string", 40), ("double", 40)])
def test_calls_named_like_types_nest_in_linear_time(h2o_source: Any, name: str, depth: int) -> None:
    sql = nested(name, depth)
    elapsed, error = timed_plan(sql, h2o_source)
    assert error is None, str(error)
    assert elapsed < FAST_S, f"{name} x{depth}: {elapsed:.1f} s"


def test_a_type_reading_that_would_still_backtrack_is_refused_at_once(h2o_source: Any) -> None:
    # A string after each closing parenthesis makes every level a possible typed literal: sqlglot tries both
    # readings at each level (2^40 steps).
    elapsed, error = timed_plan(nested("struct", 40, after=" 'a'"), h2o_source)
    assert error is not None and "exponential" in str(error), str(error)
    assert elapsed < FAST_S
