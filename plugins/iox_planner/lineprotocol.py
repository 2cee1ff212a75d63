"""InfluxDB line protocol, parsed into points with every bad line reported by line and column.

`measurement[,tag=value...] field=value[,field=value...] [timestamp]`, one point a line. The parser never raises
for bad input: it collects a `LineError` per bad line and keeps going, so one run reports every problem.
`ParseResult.raise_for_errors()` turns them into a single `BadInputError` for callers that want all or nothing.

Two paths share one grammar. Most lines (no backslash, no double quote, single spaces) take a split-based fast
path; anything it does not like, including every error, is handed to the character scanner, which is the one
source of error messages and columns. So the fast path only has to be right about what it accepts.

Details where InfluxDB's own documentation leaves room: sections are separated by one or more spaces (tabs are
ordinary characters, except that leading and trailing blanks are ignored); a backslash escapes only the
characters listed for each element and is literal before anything else (so two backslashes in a tag stay
two backslashes); numbers take an optional '-' but never '+'; an unescaped '=' in a tag value is an error.
Columns count characters (code points), from 1, in the line as given.
"""

from __future__ import annotations

import enum
import gc
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

from .errors import BadInputError
from .model import TIME, ColumnType
from .timeutil import INT64_MAX, INT64_MIN

UINT64_MAX = 2**64 - 1


class Precision(str, enum.Enum):
    """Unit of the timestamps in the input; the value is the multiplier to nanoseconds."""

    NS = "ns"
    US = "us"
    MS = "ms"
    S = "s"

    @property
    def multiplier(self) -> int:
        return _MULTIPLIERS[self]

    @property
    def unit(self) -> str:
        return _UNIT_NAMES[self]


_MULTIPLIERS = {Precision.NS: 1, Precision.US: 1_000, Precision.MS: 1_000_000, Precision.S: 1_000_000_000}
_UNIT_NAMES = {
    Precision.NS: "nanoseconds",
    Precision.US: "microseconds",
    Precision.MS: "milliseconds",
    Precision.S: "seconds",
}


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


@dataclass(frozen=True, slots=True)
class LineError:
    """A rejected line: 1-based line and column (of the offending character) and what was expected there."""

    line: int
    column: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}, column {self.column}: {self.message}"


@dataclass(frozen=True, slots=True)
class ParseResult:
    points: tuple[Point, ...]
    errors: tuple[LineError, ...]

    @property
    def ok(self) -> bool:
        return not self.errors

    def raise_for_errors(self, *, limit: int = 10) -> None:
        """Raise one `BadInputError` naming the first `limit` errors (and how many more), if there are any."""
        if not self.errors:
            return
        shown = "; ".join(str(e) for e in self.errors[:limit])
        more = len(self.errors) - limit
        tail = f"; and {more} more bad line{'s' if more != 1 else ''}" if more > 0 else ""
        count = len(self.errors)
        raise BadInputError(
            f"line protocol has {count} bad line{'s' if count != 1 else ''}: {shown}{tail}. "
            "Nothing was written; fix these lines and write again"
        )


# ---------------------------------------------------------------------------------------------------------------
# Shared pieces

_FLOAT = ColumnType.FLOAT
_INTEGER = ColumnType.INTEGER
_UNSIGNED = ColumnType.UNSIGNED
_BOOLEAN = ColumnType.BOOLEAN
_STRING = ColumnType.STRING
_TAG = ColumnType.TAG

_BOOLS: dict[str, bool] = {
    "t": True, "T": True, "true": True, "True": True, "TRUE": True,
    "f": False, "F": False, "false": False, "False": False, "FALSE": False,
}  # fmt: skip

# float() alone is too lenient (underscores, "inf", "nan", surrounding whitespace, non-ASCII digits): a token
# made only of these characters, not starting with '+', that float() accepts is exactly the line protocol float.
_FLOAT_CHARS = "0123456789.eE+-"

_VALUE_HELP = (
    "expected a float (1.5, -2, .5, 1e10), an integer (12i), an unsigned integer (12u), "
    'a boolean (t, f, true, false) or a double-quoted string ("text")'
)

# Caches are per parse() call; bounded so that high-cardinality input cannot grow them without limit.
_HEAD_CACHE_LIMIT = 100_000

# name -> (type, line that introduced it); line 0 means the caller's existing schema.
_Schema = dict[str, dict[str, tuple[ColumnType, int]]]
_Typed = tuple[ColumnType, object]


class _Fail(Exception):
    """A bad line: 0-based position of the offending character and the message."""

    def __init__(self, pos: int, message: str) -> None:
        super().__init__(message)
        self.pos = pos
        self.message = message


def _reserved(kind: str, name: str) -> str | None:
    if name == TIME:
        return f"{kind} key 'time' is reserved for the timestamp; rename the {kind}"
    if name.startswith("__"):
        return f"{kind} key {name!r} starts with '__', which is reserved for internal columns; rename the {kind}"
    return None


def _where(line: int) -> str:
    return "in the existing table" if line == 0 else f"on line {line}"


def _is_digits(s: str) -> bool:
    # isdigit() alone accepts non-ASCII digits that int() would happily convert.
    return s.isdigit() and s.isascii()


def _is_signed_digits(s: str) -> bool:
    return _is_digits(s[1:]) if s[:1] == "-" else _is_digits(s)


def _parse_value(tok: str, key: str, pos: int) -> _Typed:
    """A non-string field value token (never empty)."""
    last = tok[-1]
    if last == "i":
        body = tok[:-1]
        if not _is_signed_digits(body):
            raise _Fail(pos, f"field {key!r} has an invalid integer {tok!r}: expected digits with an optional '-' and "
                        "the suffix i, like 12i or -3i")
        ivalue = int(body)
        if not INT64_MIN <= ivalue <= INT64_MAX:
            raise _Fail(pos, f"field {key!r} integer {tok} is out of range: integers are signed 64-bit "
                        f"({INT64_MIN}..{INT64_MAX}); use an unsigned (u) or float value for larger numbers")
        return (_INTEGER, ivalue)
    if last == "u":
        body = tok[:-1]
        if not _is_digits(body):
            raise _Fail(pos, f"field {key!r} has an invalid unsigned integer {tok!r}: expected digits without a sign "
                        "and the suffix u, like 12u")
        uvalue = int(body)
        if uvalue > UINT64_MAX:
            raise _Fail(pos, f"field {key!r} unsigned integer {tok} is out of range: unsigned integers are 64-bit "
                        f"(0..{UINT64_MAX})")
        return (_UNSIGNED, uvalue)
    flag = _BOOLS.get(tok)
    if flag is not None:
        return (_BOOLEAN, flag)
    if tok[0] == "+" or tok.strip(_FLOAT_CHARS):
        raise _Fail(pos, f"field {key!r} has an invalid value {tok!r}: {_VALUE_HELP}")
    try:
        fvalue = float(tok)
    except ValueError:
        raise _Fail(pos, f"field {key!r} has an invalid number {tok!r}: {_VALUE_HELP}") from None
    if fvalue - fvalue != 0.0:
        raise _Fail(pos, f"field {key!r} float {tok} is out of range: floats are 64-bit and must be finite")
    return (_FLOAT, fvalue)


def _commit(schema: _Schema, measurement: str, tags: Mapping[str, str], fields: Mapping[str, _Typed],
            line: int) -> None:
    """Record the names of an accepted line, so that later lines are checked against it."""
    cols = schema.get(measurement)
    if cols is None:
        cols = schema[measurement] = {}
    for key in tags:
        if key not in cols:
            cols[key] = (_TAG, line)
    for key, (kind, _) in fields.items():
        if key not in cols:
            cols[key] = (kind, line)


# ---------------------------------------------------------------------------------------------------------------
# The scanner: handles every line, knows every column.

_MEASUREMENT_STOPS = ", "
_MEASUREMENT_ESCAPES = ", "
_KEY_STOPS = ",= "
_KEY_ESCAPES = ",= "


def _read_escaped(s: str, i: int, n: int, stops: str, escapes: str) -> tuple[str, int]:
    """Read up to the first unescaped stop character; a backslash before anything but `escapes` is literal."""
    out: list[str] = []
    while i < n:
        c = s[i]
        if c == "\\":
            if i + 1 < n and s[i + 1] in escapes:
                out.append(s[i + 1])
                i += 2
            else:
                out.append(c)
                i += 1
        elif c in stops:
            break
        else:
            out.append(c)
            i += 1
    return "".join(out), i


def _read_string(s: str, i: int, n: int, key: str) -> tuple[str, int]:
    """A double-quoted string starting at s[i]; returns its value and the position after the closing quote."""
    out: list[str] = []
    j = i + 1
    while j < n:
        c = s[j]
        if c == "\\" and j + 1 < n and s[j + 1] in '"\\':
            out.append(s[j + 1])
            j += 2
        elif c == '"':
            return "".join(out), j + 1
        else:
            out.append(c)
            j += 1
    raise _Fail(i, f"string value of field {key!r} is not terminated: expected a closing '\"' on the same line "
                "(write a '\"' inside a string as \\\")")


def _scan(line: str, lineno: int, precision: Precision, schema: _Schema) -> tuple[
        str, Mapping[str, str], dict[str, _Typed], int | None]:
    s = line
    # Trailing blanks only ever matter on a line that is bad anyway; dropping them keeps the checks below simple.
    n = len(s.rstrip(" \t"))
    i = 0
    while i < n and s[i] in " \t":
        i += 1

    measurement, i = _read_escaped(s, i, n, _MEASUREMENT_STOPS, _MEASUREMENT_ESCAPES)
    if not measurement:
        raise _Fail(i, "missing measurement: a line starts with the measurement name, like cpu,host=a usage=1.5")
    known = schema.get(measurement, {})

    tags: dict[str, str] = {}
    tag_pos: dict[str, int] = {}
    while i < n and s[i] == ",":
        i += 1
        kpos = i
        key, i = _read_escaped(s, i, n, _KEY_STOPS, _KEY_ESCAPES)
        if not key:
            raise _Fail(kpos, "empty tag key: expected key=value after ','")
        if key in tag_pos:
            raise _Fail(kpos, f"duplicate tag key {key!r}: it is already set at column {tag_pos[key] + 1}")
        problem = _reserved("tag", key)
        if problem:
            raise _Fail(kpos, problem)
        prior = known.get(key)
        if prior is not None and prior[0] is not _TAG:
            raise _Fail(kpos, f"{key!r} is a {prior[0].value} field of measurement {measurement!r} {_where(prior[1])}; "
                        "a name cannot be both a tag and a field")
        if i >= n or s[i] != "=":
            raise _Fail(i, f"tag {key!r} has no value: expected {key}=value (omit a tag that has no value)")
        i += 1
        vpos = i
        value, i = _read_escaped(s, i, n, _KEY_STOPS, _KEY_ESCAPES)
        if i < n and s[i] == "=":
            raise _Fail(i, f"unescaped '=' in the value of tag {key!r}: write it as \\=")
        if not value:
            raise _Fail(vpos, f"tag {key!r} has no value: expected {key}=value (omit a tag that has no value)")
        tags[key] = value
        tag_pos[key] = kpos

    # Here s[i] is a space or the line has ended: the readers above stop only at ',', '=', ' ' or the end.
    while i < n and s[i] == " ":
        i += 1
    if i >= n:
        raise _Fail(i, "missing fields: expected a space and at least one field (like value=1) after the "
                    "measurement and tags")

    fields: dict[str, _Typed] = {}
    field_pos: dict[str, int] = {}
    while True:
        kpos = i
        key, i = _read_escaped(s, i, n, _KEY_STOPS, _KEY_ESCAPES)
        if not key:
            raise _Fail(kpos, "empty field key: expected key=value")
        if key in field_pos:
            raise _Fail(kpos, f"duplicate field key {key!r}: it is already set at column {field_pos[key] + 1}")
        problem = _reserved("field", key)
        if problem:
            raise _Fail(kpos, problem)
        if key in tags:
            raise _Fail(kpos, f"{key!r} is a tag on this line (column {tag_pos[key] + 1}) and cannot also be a field")
        prior = known.get(key)
        if prior is not None and prior[0] is _TAG:
            raise _Fail(kpos, f"{key!r} is a tag of measurement {measurement!r} {_where(prior[1])}; "
                        "a name cannot be both a tag and a field")
        if i >= n or s[i] != "=":
            raise _Fail(i, f"field {key!r} has no value: expected {key}=value")
        i += 1
        vpos = i
        if i < n and s[i] == '"':
            text, i = _read_string(s, i, n, key)
            typed: _Typed = (_STRING, text)
        else:
            j = i
            while j < n and s[j] != "," and s[j] != " ":
                j += 1
            if j == i:
                raise _Fail(i, f"field {key!r} has no value: expected {key}=value")
            typed = _parse_value(s[i:j], key, vpos)
            i = j
        if prior is not None and prior[0] is not typed[0]:
            raise _Fail(vpos, f"field {key!r} of measurement {measurement!r} is {typed[0].value} here but "
                        f"{prior[0].value} {_where(prior[1])}; a field keeps one type")
        fields[key] = typed
        field_pos[key] = kpos
        if i < n and s[i] == ",":
            i += 1
            continue
        break
    if i < n and s[i] != " ":
        raise _Fail(i, f"unexpected {s[i]!r} after the value of field {key!r}: expected ',' and another field, "
                    "or a space and the timestamp")

    while i < n and s[i] == " ":
        i += 1
    time: int | None = None
    if i < n:
        tpos = i
        while i < n and s[i] != " ":
            i += 1
        tok = s[tpos:i]
        if not _is_signed_digits(tok):
            raise _Fail(tpos, f"invalid timestamp {tok!r}: expected an integer number of {precision.unit} since "
                        "1970-01-01T00:00:00Z, or nothing")
        time = int(tok) * precision.multiplier
        if not INT64_MIN <= time <= INT64_MAX:
            raise _Fail(tpos, f"timestamp {tok} ({precision.unit}) is out of range: it must fit a signed 64-bit "
                        "count of nanoseconds (years 1677 to 2262)")
        while i < n and s[i] == " ":
            i += 1
        if i < n:
            raise _Fail(i, f"unexpected {s[i:n]!r} after the timestamp: expected the end of the line")

    _commit(schema, measurement, tags, fields, lineno)
    return measurement, MappingProxyType(tags), fields, time


# ---------------------------------------------------------------------------------------------------------------
# The fast path: plain lines only; returns None to hand the line to the scanner.

class _Head:
    """A parsed `measurement,tags` prefix, shared by every line of that series, with the field layouts that
    were already accepted after it: (field keys, codes of the values that are not floats)."""

    __slots__ = ("measurement", "tags", "tag_keys", "accepted")

    def __init__(self, measurement: str, tags: dict[str, str]) -> None:
        self.measurement = measurement
        self.tags: Mapping[str, str] = MappingProxyType(tags)
        self.tag_keys = tuple(tags)
        self.accepted: set[tuple[tuple[str, ...], str]] = set()


_BAD_HEAD = _Head("", {})
_FLOAT_ENDS = frozenset("0123456789.")
_CODES = {_FLOAT: "f", _INTEGER: "i", _UNSIGNED: "u", _BOOLEAN: "b", _STRING: "s"}


def _fast_head(head: str) -> _Head:
    parts = head.split(",")
    measurement = parts[0]
    if not measurement:
        return _BAD_HEAD
    tags: dict[str, str] = {}
    for part in parts[1:]:
        key, _, value = part.partition("=")
        if not key or not value or "=" in value:
            return _BAD_HEAD
        tags[key] = value
    if len(tags) != len(parts) - 1:
        return _BAD_HEAD
    return _Head(measurement, tags)


# Points are built without the frozen dataclass __init__ (one object.__setattr__ per field): about 10% of a
# simple line's parse. Only valid for a slots class; test_fast_point_matches_the_dataclass_constructor pins it.
_new = object.__new__
_set_line: Callable[[Point, object], None] = getattr(Point, "line").__set__
_set_measurement: Callable[[Point, object], None] = getattr(Point, "measurement").__set__
_set_tags: Callable[[Point, object], None] = getattr(Point, "tags").__set__
_set_fields: Callable[[Point, object], None] = getattr(Point, "fields").__set__
_set_time: Callable[[Point, object], None] = getattr(Point, "time").__set__


def _point(line: int, measurement: str, tags: Mapping[str, str], fields: Mapping[str, _Typed], time: int) -> Point:
    point: Point = _new(Point)
    _set_line(point, line)
    _set_measurement(point, measurement)
    _set_tags(point, tags)
    _set_fields(point, fields)
    _set_time(point, time)
    return point


def _fast(line: str, lineno: int, multiplier: int, default_time: int, heads: dict[str, _Head],
          intern: Callable[[str, str], str], schema: _Schema) -> Point | None:
    parts = line.split(" ")
    count = len(parts)
    if count == 3:
        head, body, stamp = parts
        if not ((stamp.isdigit() and stamp.isascii()) or _is_signed_digits(stamp)):
            return None
        time = int(stamp) * multiplier
        if time > INT64_MAX or time < INT64_MIN:
            return None
    elif count == 2:
        head, body = parts
        time = default_time
    else:
        return None

    series = heads.get(head)
    if series is None:
        if len(heads) >= _HEAD_CACHE_LIMIT:
            heads.clear()
        series = heads[head] = _fast_head(head)
    if series is _BAD_HEAD:
        return None

    # `kinds` notes the type and position of each value that is not a float, so that the layout check below
    # covers types as well as names; for the usual all-float line it stays empty.
    if "=+" in body:
        return None
    fields: dict[str, _Typed] = {}
    kinds = ""
    try:
        for item in body.split(","):
            key, _, tok = item.partition("=")
            # One copy of each name for the whole input, not one per point.
            key = intern(key, key)
            if tok[-1] in _FLOAT_ENDS:
                # _parse_value's float branch, inlined; "+1" was excluded above.
                if tok.strip(_FLOAT_CHARS):
                    return None
                value = float(tok)
                if value - value != 0.0:
                    return None
                fields[key] = (_FLOAT, value)
            else:
                typed = _parse_value(tok, key, 0)
                fields[key] = typed
                kinds += f"{_CODES[typed[0]]}{len(fields)},"
    except (IndexError, ValueError, _Fail):
        return None
    if len(fields) != body.count(",") + 1:
        return None

    # Names can only fail on a line whose names and types were never accepted before: the schema only grows
    # and never changes a type, so a layout once accepted stays acceptable.
    layout = (tuple(fields), kinds)
    if layout in series.accepted:
        return _point(lineno, series.measurement, series.tags, fields, time)

    known = schema.get(series.measurement, {})
    for key in series.tag_keys:
        prior = known.get(key)
        if _reserved("tag", key) or (prior is not None and prior[0] is not _TAG):
            return None
    for key, (kind, _) in fields.items():
        prior = known.get(key)
        if not key or _reserved("field", key) or key in series.tags or (prior is not None and prior[0] is not kind):
            return None
    _commit(schema, series.measurement, series.tags, fields, lineno)
    series.accepted.add(layout)
    return _point(lineno, series.measurement, series.tags, fields, time)


# ---------------------------------------------------------------------------------------------------------------


def _parse_lines(text: str, precision: Precision, default_time: int, schema: _Schema) -> tuple[
        list[Point], list[LineError]]:
    multiplier = precision.multiplier
    heads: dict[str, _Head] = {}
    names: dict[str, str] = {}
    points: list[Point] = []
    errors: list[LineError] = []
    lineno = 0
    for line in text.split("\n"):
        lineno += 1
        if not line:
            continue
        if line[-1] == "\r":
            line = line[:-1]
            if not line:
                continue
        first = line[0]
        if first == "#":
            continue
        if first == " " or first == "\t":
            stripped = line.lstrip(" \t")
            if not stripped or stripped[0] == "#":
                continue
        elif "\\" not in line and '"' not in line:
            point = _fast(line, lineno, multiplier, default_time, heads, names.setdefault, schema)
            if point is not None:
                points.append(point)
                continue
        try:
            measurement, tags, fields, time = _scan(line, lineno, precision, schema)
        except _Fail as fail:
            errors.append(LineError(lineno, fail.pos + 1, fail.message))
            continue
        points.append(_point(lineno, measurement, tags, fields, default_time if time is None else time))
    return points, errors


def parse(
    text: str,
    *,
    precision: Precision | str = Precision.NS,
    default_time: int,
    existing: Mapping[str, Mapping[str, ColumnType]] | None = None,
) -> ParseResult:
    """Parse line protocol text. Never raises for bad lines: each one becomes a `LineError` and yields no point.

    `default_time` (ns) is the time of lines without a timestamp; pass "now" once so that the whole write agrees.
    `existing` optionally gives the tables' current columns (measurement -> column -> type), so that a line that
    conflicts with them (a tag written as a field, a field with another type) is reported here with its line.
    """
    try:
        prec = Precision(precision)
    except ValueError:
        raise BadInputError(f"precision {precision!r} is not one of ns, us, ms, s") from None
    if not INT64_MIN <= default_time <= INT64_MAX:
        raise BadInputError(f"default time {default_time} does not fit a signed 64-bit count of nanoseconds")

    schema: _Schema = {}
    for table, columns in (existing or {}).items():
        schema[table] = {name: (kind, 0) for name, kind in columns.items() if kind is not ColumnType.TIME}

    # A parse allocates a few container objects per line, none in a cycle, and the generational collections
    # those allocations trigger keep rescanning the growing result: about 40% of a large parse's time. Pausing
    # the cycle collector only defers it; reference counting still frees everything as usual.
    collecting = gc.isenabled()
    if collecting:
        gc.disable()
    try:
        points, errors = _parse_lines(text, prec, default_time, schema)
    finally:
        if collecting:
            gc.enable()
    return ParseResult(tuple(points), tuple(errors))
