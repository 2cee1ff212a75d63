"""The gate's prescan (`planner/sql/parse.py` `prescan`): what a token holder sends the gate straight, refused
before Spark's parser sees it when the planner would refuse it anyway."""

from __future__ import annotations

import pytest

from iox_planner.errors import BadQueryError
from iox_planner.planner.limits import SqlLimits
from iox_planner.planner.sql.parse import GATE_SLACK_LIST, prescan

LIMITS = SqlLimits()


def in_list(n: int) -> str:
    return "SELECT * FROM h2o WHERE city IN (" + ", ".join(f"'{'x' * 8}{i}'" for i in range(n)) + ")"


def test_an_in_list_past_the_planners_list_limit_is_refused_by_the_scan() -> None:
    """200k long literals: within the gate's bytes and tokens, but a list the planner would never send; Spark's
    parser took minutes of a core over two of them."""
    with pytest.raises(BadQueryError, match="list of"):
        prescan(in_list(200_000), LIMITS)
    with pytest.raises(BadQueryError, match="list of"):
        prescan(in_list(LIMITS.max_list + GATE_SLACK_LIST + 1), LIMITS)


@pytest.mark.parametrize("sql", [
    in_list(LIMITS.max_list),
    "SELECT a, b, c FROM t WHERE x IN (1, 2, 3) AND f(g(1, 2), h(3, (4, 5))) = ','",
    "SELECT " + ", ".join(f"c{i}" for i in range(2_000)) + " FROM t",
])
def test_lists_the_planner_accepts_pass(sql: str) -> None:
    prescan(sql, LIMITS)
