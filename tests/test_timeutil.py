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


# The first and last nanosecond a signed 64-bit count holds, and the first and last whole day, written out.
INT64_FIRST, INT64_LAST = "1677-09-21T00:12:43.145224192Z", "2262-04-11T23:47:16.854775807Z"
FIRST_DAY_NS = -9_223_286_400_000_000_000  # 1677-09-22T00:00:00Z: -106,751 days
LAST_NS = 9_223_286_399_999_999_999  # 2262-04-10T23:59:59.999999999Z: 106,751 days less a nanosecond


@pytest.mark.parametrize("text", ["2024-01-01T00:00:00+25:00", "2024-01-01T00:00:00-24:00",
                                  "2024-01-01T00:00:00+23:60", "2024-01-01T00:00:00+2500",
                                  "2024-01-01T00:00:00+99:99"])
def test_an_impossible_utc_offset_is_refused(text: str) -> None:
    """Probe: `+25:00` was read as 25 hours east and published 0 rows."""
    from iox_planner.timeutil import parse_bound

    for read in (lambda: parse_time(text, what="time_start"), lambda: parse_bound(text, what="time_start", end=False)):
        with pytest.raises(BadInputError, match=r"offsets run from -23:59 to \+23:59") as raised:
            read()
        assert str(raised.value).startswith("time_start '") and "\n" not in str(raised.value)


def test_the_widest_offsets_are_read() -> None:
    assert parse_time("2024-01-01T23:59:00+23:59") == 1_704_067_200_000_000_000
    assert parse_time("2024-01-01T00:00:00-23:59") == 1_704_067_200_000_000_000 + 86_340_000_000_000


@pytest.mark.parametrize("text", [" 2024-01-01", "2024-01-01 ", "2024-01-01\n", "\t2024-01-01T00:00:00Z", ""])
def test_a_time_is_taken_exactly(text: str) -> None:
    with pytest.raises(BadInputError, match="is not an RFC 3339 time"):
        parse_time(text, what="--time-start")


def test_a_bound_beyond_the_times_data_may_have_leaves_the_range_open() -> None:
    """Probe: whole days just outside int64 ended a triggered run's plan in psycopg2's "bigint out of range" with no
    run recorded, and the CLI in a Python worker's exception. No row is earlier than the first whole day of int64
    nor later than its last, so a bound past them on its own side bounds nothing."""
    from iox_planner.timeutil import parse_bound, parse_range

    assert parse_range("1677-09-21T00:00:00Z", "2262-04-12T00:00:00Z") == (None, None)
    assert parse_range("0001-01-01", "9999-12-31T23:59:59Z") == (None, None)
    assert parse_range(INT64_FIRST, INT64_LAST) == (None, None)
    assert parse_bound("1677-09-22T00:00:00Z", what="t", end=False) is None  # the first time data may have
    assert parse_bound("1677-09-22T00:00:00.000000001Z", what="t", end=False) == FIRST_DAY_NS + 1
    assert parse_bound("2262-04-10T23:59:59.999999999Z", what="t", end=True) == LAST_NS  # leaves out the last
    assert parse_bound("2262-04-11T00:00:00Z", what="t", end=True) is None  # the day after the last whole one
    assert parse_range("1600-01-01", "2024-01-01") == (None, 1_704_067_200_000_000_000)


@pytest.mark.parametrize("start, end, words", [
    ("2262-04-12T00:00:00Z", None, "is after the last time data may have"),
    ("2262-04-11T00:00:00Z", None, "is after the last time data may have"),
    (None, "1677-09-21T00:00:00Z", "is at or before the first time data may have"),
    (None, "1677-09-22T00:00:00Z", "is at or before the first time data may have"),
])
def test_a_bound_beyond_them_on_the_other_side_is_refused_naming_the_range(start: str | None, end: str | None,
                                                                         words: str) -> None:
    from iox_planner.timeutil import parse_range

    with pytest.raises(BadInputError) as raised:
        parse_range(start, end)
    message = str(raised.value)
    assert words in message and "1677-09-22T00:00:00Z to 2262-04-10T23:59:59.999999999Z" in message


@pytest.mark.parametrize("text", ["1677-09-21T00:00:00Z", "2262-04-11T00:00:00Z", "0001-01-01"])
def test_an_instant_outside_the_times_data_may_have_is_refused(text: str) -> None:
    with pytest.raises(BadInputError, match="is outside the times iox-batch holds, 1677-09-22T00:00:00Z to "):
        parse_time(text, what="start_date")


@pytest.mark.parametrize("text", ["30d ", " 30d", "30D", "30 d", "30d\n", "", "-1d", "1.5d"])
def test_a_duration_is_taken_exactly(text: str) -> None:
    from iox_planner.timeutil import parse_duration

    with pytest.raises(BadInputError, match="is not a duration"):
        parse_duration(text, what="--retention")


@pytest.mark.parametrize("text", ["2024-01-01", "2024-01-01T00:00", "2024-01-01 00:00:00.5z",
                                  "2024-01-01T00:00:00+0200", "2024-01-01T00", "2024-1-01",
                                  "2024-01-01T00:00:00.1234567890Z", "x", "2024-01-01T00:00:00+25:00"])
def test_the_dag_param_pattern_is_the_parser_s_form(text: str) -> None:
    """`iox_query`'s time params are checked against `RFC3339_PATTERN` when a run is created: the same form the
    parser reads (it alone then checks offsets, dates and the range)."""
    import re

    from iox_planner.timeutil import RFC3339_PATTERN

    try:
        parse_time(text)
        parsed = True
    except BadInputError as err:
        parsed = "is not an RFC 3339 time" not in str(err)  # the form was read; a later check refused it
    assert bool(re.search(RFC3339_PATTERN, text)) == parsed
