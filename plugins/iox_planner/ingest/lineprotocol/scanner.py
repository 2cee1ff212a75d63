"""The character scanner: reads any line, knows every column, and words every error message; the fast path
hands it whatever it does not take (`slow_line`).

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
  or paragraph separator or U+FEFF (`catalog.names.UNPRINTABLE`); the corpus (decoded by v2.1) takes a control
  character in a tag value, which the decoder's later releases refuse, as here;
- a name used as a tag and as a field of one measurement, two fields with one name on a line (a row holds one
  value per column) and invalid UTF-8 anywhere, comments included (`decode_utf8`), are refused.
Columns count characters (code points), from 1, in the line as given (after a skipped byte order mark).
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Mapping

from iox_planner.catalog.names import UNPRINTABLE_CHARS, describe_char
from iox_planner.ingest.lineprotocol.bad_lines import BadLine, LineError
from iox_planner.ingest.lineprotocol.limits import Limits, quote, utf8_len
from iox_planner.ingest.lineprotocol.names import Schema, check_name, commit
from iox_planner.ingest.lineprotocol.points import Point, Typed, new_point
from iox_planner.ingest.lineprotocol.precision import Precision
from iox_planner.ingest.lineprotocol.values import digits_value, is_signed_digits, parse_value
from iox_planner.model import ColumnType
from iox_planner.timeutil import TIME_MAX, TIME_MIN, TIME_RANGE

_STRING = ColumnType.STRING
_TAG = ColumnType.TAG


class NeedMore(Exception):
    """A string value runs past the end of a streamed block: parse the entry again with the next block's lines."""


def _where(line: int) -> str:
    return "in the existing table" if line == 0 else f"on line {line}"


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
            shown = quote(s[start:start + excerpt], excerpt)
            raise BadLine(start, f"{what} {shown} is longer than the limit of {longest} "
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
            raise BadLine(j, f"{describe_char(c)} is not allowed in {what}: names and tag values hold printable "
                          f"characters only{hint}")


def _read_key(s: str, i: int, n: int, kind: str, after: str, columns: int, seen: Mapping[str, int],
              lim: Limits) -> tuple[str, int]:
    """A tag or field key at `i` (`kind`), checked as both kinds are: not empty, within the column limit (`columns`
    already on the line), the name rules, not a repeat of one in `seen` (key -> position), not reserved."""
    kpos = i
    key, i = _read_escaped(s, i, n, _KEY_SPECIAL, _KEY_STOPS, _KEY_ESCAPES, f"a {kind} key", lim.max_name_bytes,
                           lim.excerpt_bytes)
    if not key:
        raise BadLine(kpos, f"empty {kind} key: expected key=value{after}")
    if columns >= lim.max_columns:
        raise BadLine(kpos, f"more than {lim.max_columns} tags and fields on one line (IOX_LP_MAX_COLUMNS): "
                      "split the point or raise the limit")
    check_name(kind, key, kpos, lim)
    if key in seen:
        raise BadLine(kpos, f"duplicate {kind} key {quote(key, lim.excerpt_bytes)}: it is already set at column "
                      f"{seen[key] + 1}")
    return key, i


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
                raise NeedMore()
            if entry.k + 1 >= len(lines):
                raise BadLine(i, f"string value of field {quote(key, lim.excerpt_bytes)} is not terminated: expected a "
                              "closing '\"' (write a '\"' inside a string as \\\")", start_offset, entry.offset)
            entry.k += 1
            s = lines[entry.k]
            entry.budget -= utf8_len(s) + 1
            if entry.budget < 0:
                raise BadLine(i, f"string value of field {quote(key, lim.excerpt_bytes)} is not terminated within "
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


def _scan(entry: _Entry, precision: Precision, schema: Schema, lim: Limits, lineno: int) -> tuple[
        str, Mapping[str, str], dict[str, Typed], int | None]:
    try:
        return _scan_entry(entry, precision, schema, lim, lineno)
    except BadLine as fail:
        if fail.offset == 0 and fail.skip == 0:
            fail.offset = fail.skip = entry.offset
        raise


def _scan_entry(entry: _Entry, precision: Precision, schema: Schema, lim: Limits, lineno: int) -> tuple[
        str, Mapping[str, str], dict[str, Typed], int | None]:
    def q(text: str) -> str:
        return quote(text, lim.excerpt_bytes)

    s = entry.lines[entry.k]
    n = _eol(s)
    i = 0
    while i < n and s[i] == " ":
        i += 1

    mpos = i
    measurement, i = _read_escaped(s, i, n, _MEASUREMENT_SPECIAL, _MEASUREMENT_STOPS, _MEASUREMENT_ESCAPES,
                                    "a measurement name", lim.max_name_bytes, lim.excerpt_bytes)
    if not measurement:
        raise BadLine(i, "missing measurement: a line starts with the measurement name, like cpu,host=a usage=1.5")
    check_name("measurement", measurement, mpos, lim)
    known = schema.get(measurement, {})

    tags: dict[str, str] = {}
    tag_pos: dict[str, int] = {}
    while i < n and s[i] == ",":
        i += 1
        kpos = i
        key, i = _read_key(s, i, n, "tag", " after ','", len(tags), tag_pos, lim)
        prior = known.get(key)
        if prior is not None and prior[0] is not _TAG:
            raise BadLine(kpos, f"{q(key)} is a {prior[0].value} field of measurement {q(measurement)} "
                          f"{_where(prior[1])}; a name cannot be both a tag and a field")
        if i >= n or s[i] != "=":
            raise BadLine(i, f"tag {q(key)} has no value: expected key=value (omit a tag that has no value)")
        i += 1
        vpos = i
        value, i = _read_escaped(s, i, n, _KEY_SPECIAL, _KEY_STOPS, _KEY_ESCAPES, "a tag value",
                                  lim.max_line_bytes, lim.excerpt_bytes)
        if i < n and s[i] == "=":
            raise BadLine(i, f"unescaped '=' in the value of tag {q(key)}: write it as \\=")
        if not value:
            raise BadLine(vpos, f"tag {q(key)} has no value: expected key=value (omit a tag that has no value)")
        tags[key] = value
        tag_pos[key] = kpos

    # Here s[i] is a space or the line has ended: the readers above stop only at ',', '=', ' ' or the end.
    while i < n and s[i] == " ":
        i += 1
    if i >= n:
        raise BadLine(i, "missing fields: expected a space and at least one field (like value=1) after the "
                      "measurement and tags")

    fields: dict[str, Typed] = {}
    field_pos: dict[str, int] = {}
    while True:
        kpos = i
        key, i = _read_key(s, i, n, "field", "", len(tags) + len(fields), field_pos, lim)
        if key in tags:
            raise BadLine(kpos, f"{q(key)} is a tag on this line (column {tag_pos[key] + 1}) and cannot also be a "
                          "field")
        prior = known.get(key)
        if prior is not None and prior[0] is _TAG:
            raise BadLine(kpos, f"{q(key)} is a tag of measurement {q(measurement)} {_where(prior[1])}; "
                          "a name cannot be both a tag and a field")
        if i >= n or s[i] != "=":
            raise BadLine(i, f"field {q(key)} has no value: expected key=value")
        i += 1
        vpos = i
        if i < n and s[i] == '"':
            text, s, i = _read_string(entry, i, key, lim)
            n = _eol(s)
            typed: Typed = (_STRING, text)
        else:
            j = i
            while j < n and s[j] != "," and s[j] != " ":
                j += 1
            if j == i:
                raise BadLine(i, f"field {q(key)} has no value: expected key=value")
            typed = parse_value(s[i:j], key, vpos, q)
            i = j
        if prior is not None and prior[0] is not typed[0]:
            raise BadLine(vpos, f"field {q(key)} of measurement {q(measurement)} is {typed[0].value} here but "
                          f"{prior[0].value} {_where(prior[1])}; a field keeps one type")
        fields[key] = typed
        field_pos[key] = kpos
        if i < n and s[i] == ",":
            i += 1
            continue
        break
    if i < n and s[i] != " ":
        raise BadLine(i, f"unexpected {q(s[i])} after the value of field {q(key)}: expected ',' and another field, "
                      "or a space and the timestamp")

    while i < n and s[i] == " ":
        i += 1
    time: int | None = None
    if i < n:
        tpos = i
        while i < n and s[i] != " ":
            i += 1
        tok = s[tpos:i]
        if not is_signed_digits(tok):
            raise BadLine(tpos, f"invalid timestamp {q(tok)}: expected an integer number of {precision.unit} since "
                          "1970-01-01T00:00:00Z, or nothing")
        time = digits_value(tok) * precision.multiplier
        if not TIME_MIN <= time <= TIME_MAX:
            raise BadLine(tpos, f"timestamp {q(tok)} ({precision.unit}) is out of range: data may have times from "
                          f"{TIME_RANGE}, the whole days a signed 64-bit count of nanoseconds holds")
        while i < n and s[i] == " ":
            i += 1
        if i < n:
            raise BadLine(i, f"unexpected {q(s[i:n])} after the timestamp: expected the end of the line")

    commit(schema, measurement, tags, fields, lineno)
    return measurement, MappingProxyType(tags), fields, time


# U+0000-U+001F and U+007F: the reference refuses them everywhere but inside string values (names and tag values
# refuse more: `catalog.names.UNPRINTABLE`).
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def _line_too_long(line: str, lim: Limits) -> LineError | None:
    size = utf8_len(line)
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


def slow_line(lines: list[str], lineno: int, precision: Precision, default_time: int, schema: Schema,
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
    entry = _Entry(lines, index - 1, lim.max_line_bytes - utf8_len(line), more)
    try:
        measurement, tags, fields, time = _scan(entry, precision, schema, lim, lineno)
    except BadLine as fail:
        return None, LineError(lineno + fail.offset, fail.pos + 1, fail.message), fail.skip
    point = new_point(lineno, measurement, tags, fields, default_time if time is None else time)
    return point, None, entry.offset
