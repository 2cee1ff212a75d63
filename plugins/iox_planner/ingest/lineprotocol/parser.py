"""InfluxDB line protocol, parsed into points with every bad line reported by line and column.

`measurement[,tag=value...] field=value[,field=value...] [timestamp]`, one point a line. The parser never raises
for a bad line: it collects a `LineError` per bad line and keeps going, so one run reports every problem (up to
`Limits.max_bad_lines`, past which the input is refused whole). `ParseResult.raise_for_errors()` turns them into a
single `BadInputError` for callers that want all or nothing.

Two paths share one grammar. Most lines (no backslash, no double quote, single spaces) take a split-based fast
path; anything it does not like, including every error, is handed to the character scanner, which is the one
source of error messages and columns. So the fast path only has to be right about what it accepts.

The grammar is InfluxData's: the published conformance corpus (github.com/influxdata/line-protocol-corpus) and,
where it is silent, the decoder it was made with (line-protocol v2, `lineprotocol.Decoder`). A point the corpus
decodes comes out the same here and an input it refuses is refused here:
- sections are separated by one or more spaces; only spaces: a tab or any other control character (U+0000 to
  U+001F, U+007F) is refused in a measurement, tag key, tag value or field key, at the start of a line and in a
  comment line; leading and trailing spaces are ignored; a line ends at LF or CRLF (a CR alone is refused);
- a backslash escapes `,` and space in a measurement and `,`, `=` and space in tag keys, tag values and field keys;
  before anything else (a second backslash included) it is a literal backslash;
- a string field value may span lines (it holds the newlines) and unescapes `\\"` and `\\\\` only: `\\n`, `\\r`
  and `\\t` stay a backslash and a letter, as in the corpus, InfluxDB 3's own parser and InfluxDB 1 and 2 (only
  the decoder's later releases, from v2.2.0, read them as control characters);
- floats are Go's: `1`, `-1.5e10`, `.5`, `1.`, `1_000.5` (underscores between digits), hex `0x1p-2`; never `+1`,
  `inf` or `NaN`; integers `-12i` and unsigned `12u` are decimal digits only, each in its 64-bit range;
- a line without a timestamp takes the write's time truncated to the precision, as the reference does.
Deliberately different:
- a byte order mark (U+FEFF) at the very start of the input is skipped (`skip_bom`), as text readers commonly
  do; the reference makes it part of the first measurement name, a table no one can tell from `cpu`;
- names follow `catalog.names.name_problem`, so that every name written can be queried: as PRODUCT.md's data
  model says, a tag or field named `time` or starting with `__` is refused, and so is a measurement starting with
  `__` or of whitespace only, and a name or tag value holding a C1 control character (U+0080 to U+009F), a line
  or paragraph separator or U+FEFF (`names.UNPRINTABLE`); the corpus (decoded by v2.1) takes a control character
  in a tag value, which the decoder's later releases refuse, as here;
- a name used as a tag and as a field of one measurement, two fields with one name on a line (a row holds one
  value per column) and invalid UTF-8 anywhere, comments included (`decode_utf8`), are refused.
Columns count characters (code points), from 1, in the line as given (after a skipped byte order mark).
"""

from __future__ import annotations

import enum
import gc
import os
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

from iox_planner.catalog.names import MAX_NAME_BYTES, UNPRINTABLE, UNPRINTABLE_CHARS, describe_char, name_problem
from iox_planner.errors import BadInputError
from iox_planner.model import ColumnType
from iox_planner.timeutil import INT64_MAX, INT64_MIN

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


# Each limit is an environment variable, so an operator with unusual data can raise it without a code change.
_LIMIT_VARS = {
    "max_line_bytes": "IOX_LP_MAX_LINE_BYTES",
    "max_columns": "IOX_LP_MAX_COLUMNS",
    "max_name_bytes": "IOX_LP_MAX_NAME_BYTES",
    "max_bad_lines": "IOX_LP_MAX_BAD_LINES",
    "errors_shown": "IOX_LP_ERRORS_SHOWN",
    "excerpt_bytes": "IOX_LP_EXCERPT_BYTES",
}
# The most a limit may be raised to, where less than 2^31: a longer name than the catalog can index would fail the
# write at its commit, as a catalog error.
_LIMIT_MAX = {"max_name_bytes": MAX_NAME_BYTES}


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds that keep a hostile input from costing more than a bounded amount of time and memory per line.

    `max_line_bytes`: one entry (a line, or the lines a string value spans), in UTF-8 bytes. `max_columns`: tags
    plus fields on one line. `max_name_bytes`: a measurement, tag key or field key. `max_bad_lines`: past this
    many bad lines the input is refused whole without reading further. `errors_shown`: bad lines listed in full
    in an error message (then "and K more"). `excerpt_bytes`: the most of the input one message quotes.
    """

    max_line_bytes: int = 1_048_576
    max_columns: int = 1_000
    max_name_bytes: int = 256
    max_bad_lines: int = 1_000
    errors_shown: int = 5
    excerpt_bytes: int = 64

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Limits:
        """The defaults, overridden by `IOX_LP_MAX_LINE_BYTES`, `IOX_LP_MAX_COLUMNS`, `IOX_LP_MAX_NAME_BYTES`,
        `IOX_LP_MAX_BAD_LINES`, `IOX_LP_ERRORS_SHOWN` and `IOX_LP_EXCERPT_BYTES`."""
        source = os.environ if env is None else env
        values: dict[str, int] = {}
        for name, var in _LIMIT_VARS.items():
            text = source.get(var)
            if text is None or text == "":
                continue
            top = _LIMIT_MAX.get(name, 2**31)
            if not (text.isascii() and text.isdigit() and len(text) <= 10) or not 1 <= int(text) <= top:
                raise BadInputError(f"{var}={_quote(text, 32)} is not allowed: it must be a whole number from 1 to "
                                    f"{top}; unset it to use the default ({getattr(cls(), name)})")
            values[name] = int(text)
        return cls(**values)


def _quote(text: str, limit: int) -> str:
    """`text` as a quoted excerpt of at most `limit` UTF-8 bytes, so that no message echoes a huge input."""
    if len(text) * 4 > limit:
        raw = text.encode("utf-8", "surrogatepass")
        if len(raw) > limit:
            cut = raw[:limit].decode("utf-8", "ignore")
            return f"{cut!r}... ({len(raw)} bytes)"
    return repr(text)


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


def describe_errors(errors: Sequence[LineError], *, shown: int | None = None) -> str:
    """"N bad lines: <the first `shown`>; and K more bad lines": a bounded list for one error paragraph."""
    limit = Limits.from_env().errors_shown if shown is None else shown
    count = len(errors)
    listed = "; ".join(str(e) for e in errors[:limit])
    more = count - limit
    tail = f"; and {more} more bad line{'s' if more != 1 else ''}" if more > 0 else ""
    return f"{count} bad line{'s' if count != 1 else ''}: {listed}{tail}"


@dataclass(frozen=True, slots=True)
class ParseResult:
    points: tuple[Point, ...]
    errors: tuple[LineError, ...]

    @property
    def ok(self) -> bool:
        return not self.errors

    def raise_for_errors(self, *, limit: int | None = None) -> None:
        """Raise one `BadInputError` naming the first `limit` errors (and how many more), if there are any."""
        if not self.errors:
            return
        raise BadInputError(f"line protocol has {describe_errors(self.errors, shown=limit)}. "
                            "Nothing was written; fix these lines and write again")


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

# float() alone is too lenient (surrounding whitespace, "inf", "nan", a leading '+', non-ASCII digits): a token
# made only of these characters, not starting with '+', that float() accepts is exactly Go's decimal float
# without underscores. Anything else is checked against the whole of Go's float grammar below.
_FLOAT_CHARS = "0123456789.eE+-"
_DIGITS = r"[0-9](?:_?[0-9])*"
_HEX = r"[0-9a-fA-F]"
_GO_DECIMAL = re.compile(rf"-?(?:{_DIGITS}(?:\.(?:{_DIGITS})?)?|\.{_DIGITS})(?:[eE][+-]?{_DIGITS})?")
# After the 0x prefix an underscore may come first: Go counts the prefix as a digit. A hex float needs its p.
_GO_HEX = re.compile(rf"-?0[xX](?:(?:_?{_HEX})+(?:\.(?:{_HEX}(?:_?{_HEX})*)?)?|\.{_HEX}(?:_?{_HEX})*)"
                     rf"[pP][+-]?{_DIGITS}")

# U+0000-U+001F and U+007F: the reference refuses them everywhere but inside string values (names and tag values
# refuse more: `names.UNPRINTABLE`).
_CONTROL = re.compile("[\x00-\x1f\x7f]")

_VALUE_HELP = (
    "expected a float (1.5, -2, .5, 1e10), an integer (12i), an unsigned integer (12u), "
    'a boolean (t, f, true, false) or a double-quoted string ("text")'
)

# Caches are per parse() call; bounded so that high-cardinality input cannot grow them without limit.
_HEAD_CACHE_LIMIT = 100_000

# name -> (type, line that introduced it); line 0 means the caller's existing schema.
_Schema = dict[str, dict[str, tuple[ColumnType, int]]]
_Typed = tuple[ColumnType, object]
_Quote = Callable[[str], str]


class _NeedMore(Exception):
    """A string value runs past the end of a streamed block: parse the entry again with the next block's lines."""


class _Fail(Exception):
    """A bad line: 0-based position of the offending character and the message; `offset` is how many lines
    after the entry's first the position is (a string value may span lines), `skip` how many lines the bad entry
    took beyond its first."""

    def __init__(self, pos: int, message: str, offset: int = 0, skip: int | None = None) -> None:
        super().__init__(message)
        self.pos = pos
        self.message = message
        self.offset = offset
        self.skip = offset if skip is None else skip


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _too_long(name: str, limit: int) -> bool:
    # A character is at most 4 bytes: most names are decided without encoding them.
    return len(name) * 4 > limit and (len(name) > limit or _utf8_len(name) > limit)


def _where(line: int) -> str:
    return "in the existing table" if line == 0 else f"on line {line}"


def _is_digits(s: str) -> bool:
    # isdigit() alone accepts non-ASCII digits that int() would happily convert.
    return s.isdigit() and s.isascii()


def _is_signed_digits(s: str) -> bool:
    return _is_digits(s[1:]) if s[:1] == "-" else _is_digits(s)


def _int(digits: str) -> int:
    """The value of optionally signed ASCII digits, already checked. Past 20 significant digits any value is out of
    every 64-bit range, so a huge one is not converted (Python refuses more than 4300 digits, and slowly)."""
    body = digits.lstrip("-").lstrip("0")
    if len(body) > 20:
        return UINT64_MAX + 1 if digits[:1] != "-" else INT64_MIN - 1
    return -int(body or "0") if digits[:1] == "-" else int(body or "0")


def _parse_float(tok: str) -> float | None:
    """Go's strconv.ParseFloat over a token that starts like a number; None if it is not one."""
    if not tok.strip(_FLOAT_CHARS):
        if tok[0] == "+":
            return None
        try:
            return float(tok)
        except ValueError:
            return None
    if _GO_DECIMAL.fullmatch(tok):
        return float(tok.replace("_", ""))
    if _GO_HEX.fullmatch(tok):
        try:
            return float.fromhex(tok.replace("_", ""))
        except OverflowError:
            return float("inf")
    return None


def _parse_value(tok: str, key: str, pos: int, q: _Quote) -> _Typed:
    """A non-string field value token (never empty)."""
    last = tok[-1]
    if last == "i":
        body = tok[:-1]
        if not _is_signed_digits(body):
            raise _Fail(pos, f"field {q(key)} has an invalid integer {q(tok)}: expected digits with an optional '-' "
                        "and the suffix i, like 12i or -3i")
        ivalue = _int(body)
        if not INT64_MIN <= ivalue <= INT64_MAX:
            raise _Fail(pos, f"field {q(key)} integer {q(tok)} is out of range: integers are signed 64-bit "
                        f"({INT64_MIN}..{INT64_MAX}); use an unsigned (u) or float value for larger numbers")
        return (_INTEGER, ivalue)
    if last == "u":
        body = tok[:-1]
        if not _is_digits(body):
            raise _Fail(pos, f"field {q(key)} has an invalid unsigned integer {q(tok)}: expected digits without a "
                        "sign and the suffix u, like 12u")
        uvalue = _int(body)
        if uvalue > UINT64_MAX:
            raise _Fail(pos, f"field {q(key)} unsigned integer {q(tok)} is out of range: unsigned integers are "
                        f"64-bit (0..{UINT64_MAX})")
        return (_UNSIGNED, uvalue)
    flag = _BOOLS.get(tok)
    if flag is not None:
        return (_BOOLEAN, flag)
    # As the reference: a number starts with a digit, '-' or '.'; anything else is no known type.
    fvalue = _parse_float(tok) if tok[0] in "-.0123456789" else None
    if fvalue is None:
        raise _Fail(pos, f"field {q(key)} has an invalid value {q(tok)}: {_VALUE_HELP}")
    if fvalue - fvalue != 0.0:
        raise _Fail(pos, f"field {q(key)} float {q(tok)} is out of range: floats are 64-bit and must be finite")
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
# In a string value; everything else after a backslash (`n`, `r`, `t` and a newline included) keeps the backslash.
_STRING_ESCAPES = {'"': '"', "\\": "\\"}
_STRING_SPECIAL = re.compile(r'["\\]')


def _eol(line: str) -> int:
    """Where a physical line's content ends: before a final CR (CRLF is a line ending)."""
    return len(line) - 1 if line.endswith("\r") else len(line)


_MEASUREMENT_SPECIAL = re.compile(f"[, \\\\{UNPRINTABLE_CHARS}]")
_KEY_SPECIAL = re.compile(f"[,= \\\\{UNPRINTABLE_CHARS}]")


def _read_escaped(s: str, i: int, n: int, special: re.Pattern[str], stops: str, escapes: str, what: str,
                  longest: int, excerpt: int) -> tuple[str, int]:
    """Read up to the first unescaped stop character; a backslash before anything but `escapes` is literal.
    A control character is refused here, with its position, and so is a token longer than `longest` characters
    (read no further than that: a 10 MB name costs no more than a short one)."""
    out: list[str] = []
    start = i
    while True:
        m = special.search(s, i, n)
        j = n if m is None else m.start()
        if j - start > longest:
            shown = _quote(s[start:start + excerpt], excerpt)
            raise _Fail(start, f"{what} {shown} is longer than the limit of {longest} "
                        "bytes (IOX_LP_MAX_NAME_BYTES for names, IOX_LP_MAX_LINE_BYTES for values); shorten it")
        out.append(s[i:j])
        if m is None:
            return "".join(out), n
        c = s[j]
        if c == "\\":
            if j + 1 < n and s[j + 1] in escapes:
                out.append(s[j + 1])
                i = j + 2
            else:
                out.append(c)
                i = j + 1
        elif c in stops:
            return "".join(out), j
        else:
            hint = (" (a byte order mark counts only at the very start of the input: was a file that begins with one "
                    "appended to another?)" if c == "\ufeff" else " (separate sections with spaces)")
            raise _Fail(j, f"{describe_char(c)} is not allowed in {what}: names and tag values hold printable "
                        f"characters only{hint}")


def _read_key(s: str, i: int, n: int, kind: str, after: str, columns: int, seen: Mapping[str, int],
              lim: Limits) -> tuple[str, int]:
    """A tag or field key at `i` (`kind`), checked as both kinds are: not empty, within the column limit (`columns`
    already on the line), the name rules, not a repeat of one in `seen` (key -> position), not reserved."""
    kpos = i
    key, i = _read_escaped(s, i, n, _KEY_SPECIAL, _KEY_STOPS, _KEY_ESCAPES, f"a {kind} key", lim.max_name_bytes,
                           lim.excerpt_bytes)
    if not key:
        raise _Fail(kpos, f"empty {kind} key: expected key=value{after}")
    if columns >= lim.max_columns:
        raise _Fail(kpos, f"more than {lim.max_columns} tags and fields on one line (IOX_LP_MAX_COLUMNS): "
                    "split the point or raise the limit")
    _check_name(kind, key, kpos, lim)
    if key in seen:
        raise _Fail(kpos, f"duplicate {kind} key {_quote(key, lim.excerpt_bytes)}: it is already set at column "
                    f"{seen[key] + 1}")
    return key, i


def _check_name(kind: str, name: str, pos: int, lim: Limits) -> None:
    """A measurement (`kind` "measurement") or a tag or field key starting at `pos`: within the length limit, and
    a name a query can use (`names.name_problem`)."""
    if _too_long(name, lim.max_name_bytes):
        what = "measurement" if kind == "measurement" else f"{kind} key"
        raise _Fail(pos, f"{what} {_quote(name, lim.excerpt_bytes)} is {_utf8_len(name)} bytes long, more than the "
                    f"limit of {lim.max_name_bytes} (IOX_LP_MAX_NAME_BYTES); use a shorter name")
    problem = name_problem(kind, name)
    if problem is not None:
        raise _Fail(pos, problem)


class _Entry:
    """The physical lines of the input and where the entry being scanned has got to: a string value may carry
    it onto later lines."""

    __slots__ = ("lines", "k", "first", "budget", "more")

    def __init__(self, lines: list[str], k: int, budget: int, more: bool = False) -> None:
        self.lines = lines
        self.k = k
        self.first = k
        self.budget = budget
        self.more = more
        """Whether the input goes on past `lines` (a streamed block that is not the last)."""

    @property
    def offset(self) -> int:
        return self.k - self.first


def _read_string(entry: _Entry, i: int, key: str, lim: Limits) -> tuple[str, str, int]:
    """A double-quoted string starting at `entry`'s current line, position i. Returns its value, the line the
    closing quote is on and the position after it (the entry moves on to that line)."""
    lines = entry.lines
    s = lines[entry.k]
    start_offset = entry.offset
    out: list[str] = []
    j = i + 1
    while True:
        m = _STRING_SPECIAL.search(s, j)
        if m is None:
            out.append(s[j:])
            if entry.k + 1 >= len(lines) and entry.more:
                raise _NeedMore()
            if entry.k + 1 >= len(lines):
                raise _Fail(i, f"string value of field {_quote(key, lim.excerpt_bytes)} is not terminated: expected a "
                            "closing '\"' (write a '\"' inside a string as \\\")", start_offset, entry.offset)
            entry.k += 1
            s = lines[entry.k]
            entry.budget -= _utf8_len(s) + 1
            if entry.budget < 0:
                raise _Fail(i, f"string value of field {_quote(key, lim.excerpt_bytes)} is not terminated within "
                            f"{lim.max_line_bytes} bytes (IOX_LP_MAX_LINE_BYTES): expected a closing '\"'",
                            start_offset, entry.offset)
            out.append("\n")
            j = 0
            continue
        pos = m.start()
        if s[pos] == '"':
            out.append(s[j:pos])
            return "".join(out), s, pos + 1
        escaped = _STRING_ESCAPES.get(s[pos + 1]) if pos + 1 < len(s) else None
        if escaped is None:
            out.append(s[j:pos + 1])
            j = pos + 1
        else:
            out.append(s[j:pos])
            out.append(escaped)
            j = pos + 2


def _scan(entry: _Entry, precision: Precision, schema: _Schema, lim: Limits, lineno: int) -> tuple[
        str, Mapping[str, str], dict[str, _Typed], int | None]:
    try:
        return _scan_entry(entry, precision, schema, lim, lineno)
    except _Fail as fail:
        if fail.offset == 0 and fail.skip == 0:
            fail.offset = fail.skip = entry.offset
        raise


def _scan_entry(entry: _Entry, precision: Precision, schema: _Schema, lim: Limits, lineno: int) -> tuple[
        str, Mapping[str, str], dict[str, _Typed], int | None]:
    def q(text: str) -> str:
        return _quote(text, lim.excerpt_bytes)

    s = entry.lines[entry.k]
    n = _eol(s)
    i = 0
    while i < n and s[i] == " ":
        i += 1

    mpos = i
    measurement, i = _read_escaped(s, i, n, _MEASUREMENT_SPECIAL, _MEASUREMENT_STOPS, _MEASUREMENT_ESCAPES,
                                    "a measurement name", lim.max_name_bytes, lim.excerpt_bytes)
    if not measurement:
        raise _Fail(i, "missing measurement: a line starts with the measurement name, like cpu,host=a usage=1.5")
    _check_name("measurement", measurement, mpos, lim)
    known = schema.get(measurement, {})

    tags: dict[str, str] = {}
    tag_pos: dict[str, int] = {}
    while i < n and s[i] == ",":
        i += 1
        kpos = i
        key, i = _read_key(s, i, n, "tag", " after ','", len(tags), tag_pos, lim)
        prior = known.get(key)
        if prior is not None and prior[0] is not _TAG:
            raise _Fail(kpos, f"{q(key)} is a {prior[0].value} field of measurement {q(measurement)} "
                        f"{_where(prior[1])}; a name cannot be both a tag and a field")
        if i >= n or s[i] != "=":
            raise _Fail(i, f"tag {q(key)} has no value: expected key=value (omit a tag that has no value)")
        i += 1
        vpos = i
        value, i = _read_escaped(s, i, n, _KEY_SPECIAL, _KEY_STOPS, _KEY_ESCAPES, "a tag value",
                                  lim.max_line_bytes, lim.excerpt_bytes)
        if i < n and s[i] == "=":
            raise _Fail(i, f"unescaped '=' in the value of tag {q(key)}: write it as \\=")
        if not value:
            raise _Fail(vpos, f"tag {q(key)} has no value: expected key=value (omit a tag that has no value)")
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
        key, i = _read_key(s, i, n, "field", "", len(tags) + len(fields), field_pos, lim)
        if key in tags:
            raise _Fail(kpos, f"{q(key)} is a tag on this line (column {tag_pos[key] + 1}) and cannot also be a field")
        prior = known.get(key)
        if prior is not None and prior[0] is _TAG:
            raise _Fail(kpos, f"{q(key)} is a tag of measurement {q(measurement)} {_where(prior[1])}; "
                        "a name cannot be both a tag and a field")
        if i >= n or s[i] != "=":
            raise _Fail(i, f"field {q(key)} has no value: expected key=value")
        i += 1
        vpos = i
        if i < n and s[i] == '"':
            text, s, i = _read_string(entry, i, key, lim)
            n = _eol(s)
            typed: _Typed = (_STRING, text)
        else:
            j = i
            while j < n and s[j] != "," and s[j] != " ":
                j += 1
            if j == i:
                raise _Fail(i, f"field {q(key)} has no value: expected key=value")
            typed = _parse_value(s[i:j], key, vpos, q)
            i = j
        if prior is not None and prior[0] is not typed[0]:
            raise _Fail(vpos, f"field {q(key)} of measurement {q(measurement)} is {typed[0].value} here but "
                        f"{prior[0].value} {_where(prior[1])}; a field keeps one type")
        fields[key] = typed
        field_pos[key] = kpos
        if i < n and s[i] == ",":
            i += 1
            continue
        break
    if i < n and s[i] != " ":
        raise _Fail(i, f"unexpected {q(s[i])} after the value of field {q(key)}: expected ',' and another field, "
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
            raise _Fail(tpos, f"invalid timestamp {q(tok)}: expected an integer number of {precision.unit} since "
                        "1970-01-01T00:00:00Z, or nothing")
        time = _int(tok) * precision.multiplier
        if not INT64_MIN <= time <= INT64_MAX:
            raise _Fail(tpos, f"timestamp {q(tok)} ({precision.unit}) is out of range: it must fit a signed 64-bit "
                        "count of nanoseconds (years 1677 to 2262)")
        while i < n and s[i] == " ":
            i += 1
        if i < n:
            raise _Fail(i, f"unexpected {q(s[i:n])} after the timestamp: expected the end of the line")

    _commit(schema, measurement, tags, fields, lineno)
    return measurement, MappingProxyType(tags), fields, time


# ---------------------------------------------------------------------------------------------------------------
# The fast path: plain lines only; returns None to hand the line to the scanner.

class _Head:
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


_BAD_HEAD = _Head("", {}, 0)
_FLOAT_ENDS = frozenset("0123456789.")
_CODES = {_FLOAT: "f", _INTEGER: "i", _UNSIGNED: "u", _BOOLEAN: "b", _STRING: "s"}


def name_ok(kind: str, name: str, lim: Limits) -> bool:
    """Whether the scanner's `_check_name` takes `name`: for the fast paths, which hand anything else to it."""
    return not _too_long(name, lim.max_name_bytes) and name_problem(kind, name) is None


def _fast_head(head: str, lim: Limits) -> _Head:
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
    return _Head(measurement, tags, lim.max_columns)


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
          intern: Callable[[str, str], str], schema: _Schema, lim: Limits) -> Point | None:
    parts = line.split(" ")
    count = len(parts)
    if count == 3:
        head, body, stamp = parts
        if not ((stamp.isdigit() and stamp.isascii()) or _is_signed_digits(stamp)) or len(stamp) > 20:
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
    fields: dict[str, _Typed] = {}
    kinds = ""
    try:
        for item in body.split(","):
            key, _, tok = item.partition("=")
            # One copy of each name for the whole input, not one per point.
            key = intern(key, key)
            if tok[-1] in _FLOAT_ENDS:
                # _parse_float's plain branch, inlined; "+1" was excluded above.
                if tok.strip(_FLOAT_CHARS):
                    return None
                value = float(tok)
                if value - value != 0.0:
                    return None
                fields[key] = (_FLOAT, value)
            else:
                typed = _parse_value(tok, key, 0, repr)
                fields[key] = typed
                kinds += f"{_CODES[typed[0]]}{len(fields)},"
    except (IndexError, ValueError, _Fail):
        return None
    if len(fields) != commas + 1:
        return None

    # Names can only fail on a line whose names and types were never accepted before: the schema only grows
    # and never changes a type, so a layout once accepted stays acceptable.
    layout = (tuple(fields), kinds)
    if layout in series.accepted:
        return _point(lineno, series.measurement, series.tags, fields, time)

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
    _commit(schema, series.measurement, series.tags, fields, lineno)
    series.accepted.add(layout)
    return _point(lineno, series.measurement, series.tags, fields, time)


# ---------------------------------------------------------------------------------------------------------------


class _TooManyBadLines(Exception):
    pass


def _line_too_long(line: str, lim: Limits) -> LineError | None:
    size = _utf8_len(line)
    if size <= lim.max_line_bytes:
        return None
    column = len(line.encode("utf-8", "surrogatepass")[:lim.max_line_bytes].decode("utf-8", "ignore")) + 1
    return LineError(0, column, f"the line is {size} bytes long, more than the limit of {lim.max_line_bytes} "
                     "(IOX_LP_MAX_LINE_BYTES); split it or raise the limit")


def _comment_error(line: str) -> LineError | None:
    bad = _CONTROL.search(line, 0, _eol(line))
    if bad is None:
        return None
    return LineError(0, bad.start() + 1, f"{describe_char(bad.group())} is not allowed in a comment line: "
                     "comments hold printable characters only")


def _slow_line(lines: list[str], lineno: int, precision: Precision, default_time: int, schema: _Schema,
               lim: Limits, base: int = 0, more: bool = False) -> tuple[Point | None, LineError | None, int]:
    """Everything the fast path does not take: blank and comment lines, long lines, and the scanner. Returns the
    point or the error (neither for a line that holds no point) and how many further lines the entry took.
    `lineno` counts from 1 in `lines`; points and errors are numbered `base` further on (a streamed block)."""
    line = lines[lineno - 1]
    index = lineno
    lineno += base
    if len(line) > lim.max_line_bytes // 4:
        problem = _line_too_long(line, lim)
        if problem is not None:
            return None, LineError(lineno, problem.column, problem.message), 0
    stripped = line.lstrip(" ")
    if not stripped or stripped == "\r":
        return None, None, 0
    if stripped[0] == "#":
        problem = _comment_error(stripped)
        if problem is None:
            return None, None, 0
        return None, LineError(lineno, problem.column + len(line) - len(stripped), problem.message), 0
    entry = _Entry(lines, index - 1, lim.max_line_bytes - _utf8_len(line), more)
    try:
        measurement, tags, fields, time = _scan(entry, precision, schema, lim, lineno)
    except _Fail as fail:
        return None, LineError(lineno + fail.offset, fail.pos + 1, fail.message), fail.skip
    point = _point(lineno, measurement, tags, fields, default_time if time is None else time)
    return point, None, entry.offset


class StreamParser:
    """Line protocol fed in blocks of whole lines, in order, with one schema and one error list across them: the
    same points and errors as `parse` over the whole text, in memory bounded by a block (plus a string value
    that spans blocks, at most `max_line_bytes`).

    `feed(lines, final)` returns the points of the block's complete entries; an entry whose string value runs
    past the block is kept back and parsed with the next block's lines in front (`final` marks the last block).
    More than `limits.max_bad_lines` bad lines raise `BadInputError`, as `parse` does.
    """

    def __init__(self, *, precision: Precision | str = Precision.NS, default_time: int,
                 existing: Mapping[str, Mapping[str, ColumnType]] | None = None,
                 limits: Limits | None = None) -> None:
        try:
            self.precision = Precision(precision)
        except ValueError:
            raise BadInputError(f"precision {precision!r} is not one of ns, us, ms, s") from None
        if not INT64_MIN <= default_time <= INT64_MAX:
            raise BadInputError(f"default time {default_time} does not fit a signed 64-bit count of nanoseconds")
        self.limits = Limits.from_env() if limits is None else limits
        self.default_time = default_time - default_time % self.precision.multiplier
        self.schema: _Schema = {}
        for table, columns in (existing or {}).items():
            self.schema[table] = {name: (kind, 0) for name, kind in columns.items() if kind is not ColumnType.TIME}
        self.heads: dict[str, _Head] = {}
        self.names: dict[str, str] = {}
        self.errors: list[LineError] = []
        self.vector_heads: dict[str, tuple[str, dict[str, str]]] = {}
        """Heads the vectorized path (`lp_vector.py`) already checked, by text."""
        self.lines_read = 0
        """Physical lines consumed so far (the next block's first line is this plus one)."""
        self._carry: list[str] = []

    def feed(self, lines: list[str], final: bool = False) -> list[Point]:
        """The points of `lines` (the input's next physical lines, without their LF; the list is consumed)."""
        if self._carry:
            lines = self._carry + lines
            self._carry = []
        # A parse allocates a few container objects per line, none in a cycle, and the generational collections
        # those allocations trigger keep rescanning the growing result: about 40% of a large parse's time.
        # Pausing the cycle collector only defers it; reference counting still frees everything as usual.
        collecting = gc.isenabled()
        if collecting:
            gc.disable()
        try:
            points, used = _parse_lines(lines, self.lines_read, not final, self)
        finally:
            if collecting:
                gc.enable()
        if used < len(lines):
            self._carry = lines[used:]
        self.lines_read += used
        return points


def _parse_lines(lines: list[str], base: int, more: bool, parser: StreamParser) -> tuple[list[Point], int]:
    """The points of `lines`, numbered from `base + 1`, and how many lines were used (fewer than all when an entry
    runs past the end and `more` input follows). Errors go to `parser.errors`."""
    precision, default_time, schema, lim = parser.precision, parser.default_time, parser.schema, parser.limits
    multiplier = precision.multiplier
    heads = parser.heads
    if len(heads) >= _HEAD_CACHE_LIMIT:
        heads.clear()
    names = parser.names
    if len(names) >= _HEAD_CACHE_LIMIT:
        names.clear()
    intern = names.setdefault
    points: list[Point] = []
    errors = parser.errors
    # Lines up to this many characters cannot exceed the byte limit (4 bytes a character at most).
    short = lim.max_line_bytes // 4
    lineno = 0
    for line in lines:
        lineno += 1
        if not line:
            continue
        if len(line) <= short and "\\" not in line and '"' not in line:
            first = line[0]
            if first != "#" and first != " " and first != "\r":
                point = _fast(line[:-1] if line[-1] == "\r" else line, base + lineno, multiplier, default_time,
                              heads, intern, schema, lim)
                if point is not None:
                    points.append(point)
                    continue
        try:
            point, problem, skip = _slow_line(lines, lineno, precision, default_time, schema, lim, base, more)
        except _NeedMore:
            return points, lineno - 1
        # A string value spanning lines makes one entry of several lines: blank the ones it took (the list is
        # ours), so that the loop skips them at no cost to every other line.
        for taken in range(lineno, lineno + skip):
            lines[taken] = ""
        if point is not None:
            points.append(point)
        elif problem is not None:
            errors.append(problem)
            if len(errors) > lim.max_bad_lines:
                raise BadInputError(
                    f"line protocol has more than {lim.max_bad_lines} bad lines (IOX_LP_MAX_BAD_LINES), so reading "
                    f"stopped at line {problem.line}: {describe_errors(errors, shown=lim.errors_shown)}. Nothing "
                    "was written; fix the input (is it line protocol?) and write again")
    return points, len(lines)


def parse(
    text: str,
    *,
    precision: Precision | str = Precision.NS,
    default_time: int,
    existing: Mapping[str, Mapping[str, ColumnType]] | None = None,
    limits: Limits | None = None,
    source: str = "input",
) -> ParseResult:
    """Parse line protocol text (the whole input: a byte order mark at its start is skipped). Never raises for a
    bad line: each one becomes a `LineError` and yields no point; more than `limits.max_bad_lines` of them raise
    `BadInputError`, and so does a lone surrogate (`check_text`, naming `source`).

    `default_time` (ns) is the time of lines without a timestamp, truncated to the precision as the reference
    does; pass "now" once so that the whole write agrees. `existing` optionally gives the tables' current columns
    (measurement -> column -> type), so that a line that conflicts with them (a tag written as a field, a field
    with another type) is reported here with its line. `limits` default to `Limits.from_env()`.
    """
    check_text(text, source)
    return _parse_text(text.removeprefix("\ufeff"), precision, default_time, existing, limits)


def _parse_text(text: str, precision: Precision | str, default_time: int,
                existing: Mapping[str, Mapping[str, ColumnType]] | None, limits: Limits | None) -> ParseResult:
    parser = StreamParser(precision=precision, default_time=default_time, existing=existing, limits=limits)
    points = parser.feed(text.split("\n"), final=True)
    return ParseResult(tuple(points), tuple(parser.errors))


BOM = b"\xef\xbb\xbf"
"""U+FEFF in UTF-8. At the very start of an input (a file, standard input, a text) it is a byte order mark, which
Windows tools write, and is skipped; the reference would make it part of the first measurement name. Anywhere else
it is refused in names and tag values (`names.UNPRINTABLE`), so that concatenated files cannot hide it either."""


def skip_bom(data: bytes) -> bytes:
    """`data`, the start of an input, without its byte order mark."""
    return data[len(BOM):] if data.startswith(BOM) else data


def check_text(text: str, source: str) -> None:
    """Refuse a text holding a lone surrogate (a YAML escape or a Python caller can make one; no UTF-8 encodes
    it), naming its line and column, as `decode_utf8` names a bad byte."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        start = text.rfind("\n", 0, err.start) + 1
        line = text.count("\n", 0, err.start) + 1
        raise BadInputError(
            f"cannot read {source}: it is not Unicode text: line {line}, column {err.start - start + 1}: "
            f"{describe_char(text[err.start])}, which no UTF-8 encodes. Line protocol is UTF-8; fix the input (a "
            "YAML \\u escape?) and try again"
        ) from None


def decode_utf8(data: bytes, source: str, lines_before: int = 0) -> str:
    """The text of `data`, strictly UTF-8: the first byte that is not is reported by line and column (in
    characters) and nothing is read. A byte order mark stays: the reader of an input skips one at its very start
    (`skip_bom`), the parser refuses one anywhere else. CR bytes stay as they are: the parser decides what a CR
    means. `lines_before`: lines of the input before `data` (a block of a streamed input), so the line number
    counts in the whole input."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        start = data.rfind(b"\n", 0, err.start) + 1
        line = lines_before + data.count(b"\n", 0, err.start) + 1
        column = len(data[start:err.start].decode("utf-8", "replace")) + 1
        bad = data[err.start:err.end].hex(" ")
        raise BadInputError(
            f"cannot read {source}: it is not UTF-8 text: line {line}, column {column}: byte(s) {bad} {err.reason}. "
            "Line protocol is UTF-8; convert the input (for example with iconv -t UTF-8) and write again"
        ) from None


def parse_bytes(
    data: bytes,
    *,
    precision: Precision | str = Precision.NS,
    default_time: int,
    existing: Mapping[str, Mapping[str, ColumnType]] | None = None,
    limits: Limits | None = None,
    source: str = "input",
) -> ParseResult:
    """`parse` over raw bytes, as `iox-batch write` reads them: strict UTF-8 first (see `decode_utf8`), a byte
    order mark at the start skipped."""
    return _parse_text(decode_utf8(skip_bom(data), source), precision, default_time, existing, limits)
