"""The fast path for regular lines (no backslash, no double quote, single spaces): split-based, each series'
head checked once; it returns None for anything it does not take, errors included, and the scanner decides."""

from __future__ import annotations

from types import MappingProxyType
from typing import Callable, Mapping

from iox_planner.catalog.names import UNPRINTABLE
from iox_planner.ingest.lineprotocol.bad_lines import BadLine
from iox_planner.ingest.lineprotocol.limits import Limits
from iox_planner.ingest.lineprotocol.names import Schema, commit, name_ok
from iox_planner.ingest.lineprotocol.points import Point, Typed, new_point
from iox_planner.ingest.lineprotocol.values import FLOAT_CHARS, is_signed_digits, parse_value
from iox_planner.model import ColumnType
from iox_planner.timeutil import TIME_MAX, TIME_MIN

_FLOAT = ColumnType.FLOAT
_INTEGER = ColumnType.INTEGER
_UNSIGNED = ColumnType.UNSIGNED
_BOOLEAN = ColumnType.BOOLEAN
_STRING = ColumnType.STRING
_TAG = ColumnType.TAG


# Caches are per parse() call; bounded so that high-cardinality input cannot grow them without limit.
HEAD_CACHE_LIMIT = 100_000


class Head:
    """A parsed `measurement,tags` prefix, shared by every line of that series, with the field layouts that
    were already accepted after it: (field keys, codes of the values that are not floats)."""

    __slots__ = ("measurement", "tags", "tag_keys", "accepted", "room")

    def __init__(self, measurement: str, tags: dict[str, str], max_columns: int) -> None:
        self.measurement = measurement
        self.tags: Mapping[str, str] = MappingProxyType(tags)
        self.tag_keys = tuple(tags)
        self.accepted: set[tuple[tuple[str, ...], str]] = set()
        # How many fields a line of this series may have within the limit on tags and fields.
        self.room = max_columns - len(tags)


_BAD_HEAD = Head("", {}, 0)
_FLOAT_ENDS = frozenset("0123456789.")
_CODES = {_FLOAT: "f", _INTEGER: "i", _UNSIGNED: "u", _BOOLEAN: "b", _STRING: "s"}


def _fast_head(head: str, lim: Limits) -> Head:
    # Runs once per distinct head, so the checks on names cost nothing per line.
    if UNPRINTABLE.search(head):
        return _BAD_HEAD
    parts = head.split(",")
    measurement = parts[0]
    if len(parts) > lim.max_columns or not name_ok("measurement", measurement, lim):
        return _BAD_HEAD
    tags: dict[str, str] = {}
    for part in parts[1:]:
        key, _, value = part.partition("=")
        if not value or "=" in value or not name_ok("tag", key, lim):
            return _BAD_HEAD
        tags[key] = value
    if len(tags) != len(parts) - 1:
        return _BAD_HEAD
    return Head(measurement, tags, lim.max_columns)


def fast_line(line: str, lineno: int, multiplier: int, default_time: int, heads: dict[str, Head],
              intern: Callable[[str, str], str], schema: Schema, lim: Limits) -> Point | None:
    """A regular line's point, or None to hand the line to the scanner."""
    parts = line.split(" ")
    count = len(parts)
    if count == 3:
        head, body, stamp = parts
        if not ((stamp.isdigit() and stamp.isascii()) or is_signed_digits(stamp)) or len(stamp) > 20:
            return None
        time = int(stamp) * multiplier
        if time > TIME_MAX or time < TIME_MIN:
            return None  # the scanner words the error
    elif count == 2:
        head, body = parts
        time = default_time
    else:
        return None

    series = heads.get(head)
    if series is None:
        if len(heads) >= HEAD_CACHE_LIMIT:
            heads.clear()
        series = heads[head] = _fast_head(head, lim)
    if series is _BAD_HEAD:
        return None

    # `kinds` notes the type and position of each value that is not a float, so that the layout check below
    # covers types as well as names; for the usual all-float line it stays empty.
    if "=+" in body:
        return None
    commas = body.count(",")
    if commas >= series.room:
        return None
    fields: dict[str, Typed] = {}
    kinds = ""
    try:
        for item in body.split(","):
            key, _, tok = item.partition("=")
            # One copy of each name for the whole input, not one per point.
            key = intern(key, key)
            if tok[-1] in _FLOAT_ENDS:
                # parse_float's plain branch, inlined; "+1" was excluded above.
                if tok.strip(FLOAT_CHARS):
                    return None
                value = float(tok)
                if value - value != 0.0:
                    return None
                fields[key] = (_FLOAT, value)
            else:
                typed = parse_value(tok, key, 0, repr)
                fields[key] = typed
                kinds += f"{_CODES[typed[0]]}{len(fields)},"
    except (IndexError, ValueError, BadLine):
        return None
    if len(fields) != commas + 1:
        return None

    # Names can only fail on a line whose names and types were never accepted before: the schema only grows
    # and never changes a type, so a layout once accepted stays acceptable.
    layout = (tuple(fields), kinds)
    if layout in series.accepted:
        return new_point(lineno, series.measurement, series.tags, fields, time)

    known = schema.get(series.measurement, {})
    for key in series.tag_keys:
        prior = known.get(key)
        if prior is not None and prior[0] is not _TAG:
            return None
    for key, (kind, _) in fields.items():
        prior = known.get(key)
        if (key in series.tags or (prior is not None and prior[0] is not kind)
                or not name_ok("field", key, lim)):
            return None
    commit(schema, series.measurement, series.tags, fields, lineno)
    series.accepted.add(layout)
    return new_point(lineno, series.measurement, series.tags, fields, time)
