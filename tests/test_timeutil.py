"""Time at the edges: RFC 3339 text is read with ASCII digits only."""

from __future__ import annotations

import pytest

from iox_planner.errors import BadInputError
from iox_planner.timeutil import parse_time


@pytest.mark.parametrize("text", [
    "2024-01-01T\u0661\u0662:00:00Z",        # Arabic-Indic hours: int() reads them as 12
    "2024-01-01T00:00:00.\u0661\u0662Z",     # ... and a fraction
    "2024-01-01T00:00:00+\u0660\u0661:00",   # ... and a zone offset
    "\uff12\uff10\uff12\uff14-01-01",        # fullwidth digits
])
def test_a_time_with_digits_of_another_script_is_refused(text: str) -> None:
    with pytest.raises(BadInputError, match="is not an RFC 3339 time"):
        parse_time(text, what="--time-start")
    ascii = "".join(str(int(ch)) if ch.isdigit() else ch for ch in text)  # the same time in ASCII digits
    assert parse_time(ascii) >= 1_704_060_000_000_000_000
