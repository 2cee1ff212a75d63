"""Time at the edges: nanosecond integers inside, RFC 3339 UTC text and day partitions outside."""

from __future__ import annotations

import datetime as dt
import re

from iox_planner.errors import BadInputError

NS_PER_SECOND = 1_000_000_000
NS_PER_DAY = 86_400 * NS_PER_SECOND
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
TIME_MIN = -(INT64_MIN // -NS_PER_DAY) * NS_PER_DAY
"""The earliest time data may have: the first nanosecond of the first whole UTC day a signed 64-bit count of
nanoseconds holds (1677-09-22). Data is stored in day partitions whose first and last nanosecond the catalog keeps
as bigint (partition bounds, the write log's hours, register_as's day filters): the partial days at either end of
int64, 1677-09-21 and 2262-04-11, have bounds no bigint holds."""
TIME_MAX = (INT64_MAX + 1) // NS_PER_DAY * NS_PER_DAY - 1
"""The latest time data may have: the last nanosecond of 2262-04-10, the last whole UTC day of int64."""
FIRST_DAY, LAST_DAY = "1677-09-22", "2262-04-10"
"""The day partitions of `TIME_MIN` and `TIME_MAX`."""
TIME_RANGE = f"{FIRST_DAY}T00:00:00Z to {LAST_DAY}T23:59:59.999999999Z"
"""`TIME_MIN` to `TIME_MAX` as error messages show them."""
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)

_RFC3339_FORM = (  # ASCII digits only: `\d` would take any script's digits, which int() then converts
    r"(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})(?:[Tt ](?P<h>[0-9]{2}):(?P<m>[0-9]{2})(?::(?P<s>[0-9]{2})"
    r"(?:\.(?P<frac>[0-9]{1,9}))?)?(?P<tz>[Zz]|[+-][0-9]{2}:?[0-9]{2})?)?"
)
_RFC3339 = re.compile(_RFC3339_FORM)
RFC3339_PATTERN = "^" + re.sub(r"\?P<[a-z]+>", "?:", _RFC3339_FORM) + "$"
"""The same form as a JSON Schema pattern (no named groups), for a DAG's params; `parse_time` has the last word
(offsets, dates that do not exist, the range)."""


def partition_of(time_ns: int) -> str:
    """The UTC day partition key (`YYYY-MM-DD`) of a nanosecond timestamp."""
    day = time_ns // NS_PER_DAY
    return (dt.date(1970, 1, 1) + dt.timedelta(days=day)).isoformat()


def partition_bounds(partition: str) -> tuple[int, int]:
    """Inclusive nanosecond bounds `[start, end]` of a day partition, a day from 1677-09-22 to 2262-04-10 (the
    whole days of `TIME_MIN` to `TIME_MAX`)."""
    try:
        day = dt.date.fromisoformat(partition)
    except ValueError as err:
        raise BadInputError(f"partition {partition!r} is not a day in the form YYYY-MM-DD") from err
    start = (day - dt.date(1970, 1, 1)).days * NS_PER_DAY
    if not TIME_MIN <= start <= TIME_MAX:
        raise BadInputError(f"partition {partition!r} is outside the days data may have: {FIRST_DAY} to {LAST_DAY} "
                            "(the whole days of a signed 64-bit count of nanoseconds)")
    return start, start + NS_PER_DAY - 1


def _parse(text: str, what: str) -> int:
    """RFC 3339 text, taken exactly (no spaces around it), as nanoseconds since the epoch, however far off."""
    match = _RFC3339.fullmatch(text) if isinstance(text, str) else None
    if not match:
        raise BadInputError(
            f"{what} {str(text)[:80]!r} is not an RFC 3339 time; write it like 2024-01-01T00:00:00Z "
            "or 2024-01-01T00:00:00.123456789+02:00 (nothing before or after it)"
        )
    try:
        day = dt.date.fromisoformat(match["date"])
        clock = dt.time(int(match["h"] or 0), int(match["m"] or 0), int(match["s"] or 0))
    except ValueError as err:
        raise BadInputError(f"{what} {text!r} is not a valid date and time: {err}") from err
    offset_s = 0
    tz = match["tz"]
    if tz and tz not in ("Z", "z"):
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        hours, minutes = int(digits[:2]), int(digits[2:])
        if hours > 23 or minutes > 59:
            raise BadInputError(f"{what} {text!r} has the UTC offset {tz}, which no place has: RFC 3339 offsets run "
                                "from -23:59 to +23:59 (minutes 00 to 59); write the time in UTC with Z, or fix the "
                                "offset")
        offset_s = sign * (hours * 3600 + minutes * 60)
    seconds = (day - dt.date(1970, 1, 1)).days * 86_400 + clock.hour * 3600 + clock.minute * 60 + clock.second
    frac = (match["frac"] or "").ljust(9, "0")
    return (seconds - offset_s) * NS_PER_SECOND + int(frac or 0)


def parse_time(text: str, *, what: str = "time") -> int:
    """Parse RFC 3339 (a date alone means its midnight UTC; no zone means UTC) to nanoseconds since the epoch: an
    instant, one of the times data may have (`TIME_RANGE`). A range's bounds are `parse_bound`'s."""
    return check_time(_parse(text, what), what, text)


def check_time(ns: int, what: str, shown: object) -> int:
    """`ns` if it is one of the times data may have (`TIME_RANGE`), else the one paragraph about `what` (given as
    `shown`)."""
    if not TIME_MIN <= ns <= TIME_MAX:
        raise BadInputError(f"{what} {str(shown)[:80]!r} is outside the times iox-batch holds, {TIME_RANGE} (the "
                            "whole days of a signed 64-bit count of nanoseconds); give a time within them")
    return ns


def parse_bound(text: str, *, what: str, end: bool) -> int | None:
    """One bound of a half-open time range `[start, end)` in RFC 3339 (as `parse_time` reads it). A bound beyond
    the times data may have on its own side leaves the range open there (None): no row is earlier than a start at
    or before `TIME_MIN`, nor as late as an end after `TIME_MAX`. A bound beyond them on the other side would
    leave nothing to return, and is refused."""
    ns = _parse(text, what)
    if (ns <= TIME_MIN) if not end else (ns > TIME_MAX):
        return None
    if (ns > TIME_MAX) if not end else (ns <= TIME_MIN):
        side = "after the last" if not end else "at or before the first"
        raise BadInputError(f"{what} {text!r} is {side} time data may have ({TIME_RANGE}, the whole days of a "
                            "signed 64-bit count of nanoseconds), so the range holds nothing; give a time within "
                            "them, or leave it out for an open range")
    return ns


def parse_range(start: str | None, end: str | None, *, start_what: str = "--time-start",
                end_what: str = "--time-end") -> tuple[int | None, int | None]:
    """The half-open range `[start, end)` from RFC 3339 bounds (None: open on that side; `parse_bound`); `start`
    must be before `end`. The one reading of every time range: the CLI's `--time-start/--time-end`, a run's
    `time_start/time_end`, `materialized run|refresh --from/--to`."""
    lo = parse_bound(start, what=start_what, end=False) if start is not None else None
    hi = parse_bound(end, what=end_what, end=True) if end is not None else None
    check_range(lo, hi)
    return lo, hi


def format_time(time_ns: int) -> str:
    """RFC 3339 UTC with `Z` and as many fractional digits as needed, up to 9."""
    seconds, nanos = divmod(time_ns, NS_PER_SECOND)
    stamp = (_EPOCH + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S")
    if nanos:
        stamp += "." + f"{nanos:09d}".rstrip("0")
    return stamp + "Z"


def now_ns() -> int:
    """The current time in nanoseconds (wall clock, UTC)."""
    import time

    return time.time_ns()


def check_range(start: int | None, end: int | None) -> None:
    """A half-open `[start, end)` range must have `start < end`."""
    if start is not None and end is not None and start >= end:
        raise BadInputError(
            f"time range start {format_time(start)} is not before its end {format_time(end)}; "
            "time ranges are half-open [start, end), so start must be earlier than end"
        )


DURATION_UNITS = {"s": NS_PER_SECOND, "m": 60 * NS_PER_SECOND, "h": 3600 * NS_PER_SECOND, "d": NS_PER_DAY,
                  "w": 7 * NS_PER_DAY}
_DURATION = re.compile(r"([1-9][0-9]{0,9})([smhdw])")


def parse_duration(text: str, *, what: str = "duration") -> int:
    """A whole number and one unit (`90s`, `15m`, `12h`, `30d`, `4w`), taken exactly, as nanoseconds."""
    match = _DURATION.fullmatch(text) if isinstance(text, str) else None
    if not match:
        raise BadInputError(f"{what} {text[:40]!r} is not a duration; write a whole number and one unit: s, m, h, d "
                            "or w (as in 36h or 30d)")
    return int(match[1]) * DURATION_UNITS[match[2]]


def format_duration(ns: int) -> str:
    """Nanoseconds as the largest unit that divides them whole (`30d`, `36h`), the way `parse_duration` reads."""
    for unit in ("w", "d", "h", "m", "s"):
        if ns % DURATION_UNITS[unit] == 0:
            return f"{ns // DURATION_UNITS[unit]}{unit}"
    return f"{ns}ns"
