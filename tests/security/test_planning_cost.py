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


# ---------------------------------------------------------------------------------------------------------------
# The query's budget covers planning


def and_chain(conjuncts: int) -> str:
    return "SELECT 1 AS one FROM h2o WHERE " + " AND ".join(f"city <> 'x{i}'" for i in range(conjuncts))


def test_planning_past_the_deadline_raises_the_budget_error(h2o_source: Any) -> None:
    from iox_planner.errors import QueryTimeoutError
    from iox_planner.planner.deadline import deadline
    from iox_planner.spark.budget import timeout_error

    started = time.monotonic()
    with pytest.raises(QueryTimeoutError) as caught:
        with deadline(0.3, lambda: timeout_error(1)):
            plan_query(and_chain(20_000), h2o_source, now_ns=0)  # takes many seconds to plan
    assert time.monotonic() - started < 3.0
    assert "time budget of 1 s" in str(caught.value)
    # The timer is disarmed on the way out: nothing fires later.
    time.sleep(1.5)


def test_the_cli_ends_planning_at_its_timeout_with_status_124(tmp_path: Path) -> None:
    from common_support import assert_one_paragraph_error, run_cli

    sql_file = tmp_path / "q.sql"
    sql_file.write_text(and_chain(20_000))
    started = time.monotonic()
    result = run_cli("explain", "--chunks", str(H2O), "--timeout", "1", "--sql-file", str(sql_file))
    elapsed = time.monotonic() - started
    assert result.returncode == 124, result.stderr[-500:]
    assert_one_paragraph_error(result, "time budget of 1 s")
    assert elapsed < 15, elapsed  # the interpreter's start and imports, then one second of planning
