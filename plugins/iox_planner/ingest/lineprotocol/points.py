"""A parsed line (`Point`), and the constructor the parser builds its points with, past the frozen
dataclass `__init__`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from iox_planner.model import ColumnType

Typed = tuple[ColumnType, object]
"""A field's value with its type, as `Point.fields` holds it."""


@dataclass(frozen=True, slots=True)
class Point:
    """One parsed line. `tags` may be shared between points of the same series: treat it as read-only.

    `fields` maps each field to `(type, value)`: (FLOAT, float), (INTEGER, int), (UNSIGNED, int), (BOOLEAN, bool)
    or (STRING, str). `time` is in nanoseconds, already scaled; a line without one gets the parse's default time.
    """

    line: int
    measurement: str
    tags: Mapping[str, str]
    fields: Mapping[str, tuple[ColumnType, object]]
    time: int


# Points are built without the frozen dataclass __init__ (one object.__setattr__ per field): about 10% of a
# simple line's parse. Only valid for a slots class; test_fast_point_matches_the_dataclass_constructor pins it.
_new = object.__new__
_set_line: Callable[[Point, object], None] = getattr(Point, "line").__set__
_set_measurement: Callable[[Point, object], None] = getattr(Point, "measurement").__set__
_set_tags: Callable[[Point, object], None] = getattr(Point, "tags").__set__
_set_fields: Callable[[Point, object], None] = getattr(Point, "fields").__set__
_set_time: Callable[[Point, object], None] = getattr(Point, "time").__set__


def new_point(line: int, measurement: str, tags: Mapping[str, str], fields: Mapping[str, Typed], time: int) -> Point:
    point: Point = _new(Point)
    _set_line(point, line)
    _set_measurement(point, measurement)
    _set_tags(point, tags)
    _set_fields(point, fields)
    _set_time(point, time)
    return point
