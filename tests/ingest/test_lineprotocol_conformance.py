"""Line protocol as InfluxData's reference reads it (its published conformance corpus, github.com/influxdata/
line-protocol-corpus, and where that is silent the decoder it was made with, github.com/influxdata/line-protocol
v2, `lineprotocol/decoder.go`), plus the limits that keep hostile input cheap.

Each case is `(input bytes, expected)`: the points the reference decodes, written out by hand, or `Err(line,
column, words)` where the reference refuses the input. Where we deliberately differ (PRODUCT.md's naming rules,
names a query can use, one value per field, a byte order mark) the group says so. Our own cases, written from
reading the reference: none of its corpus is copied here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest

from iox_planner.errors import BadInputError
from iox_planner.ingest.lineprotocol import Limits, ParseResult, Precision, describe_errors, parse, parse_bytes
from iox_planner.model import ColumnType

F = ColumnType.FLOAT
I = ColumnType.INTEGER  # noqa: E741
U = ColumnType.UNSIGNED
B = ColumnType.BOOLEAN
S = ColumnType.STRING

NOW = 1_700_000_123_456_789_123  # not a round second, so that truncation to the precision shows


@dataclass(frozen=True)
class Err:
    """The first bad line's line and column, and words its message must hold."""

    line: int
    column: int
    words: str = ""


def P(measurement: str, tags: dict[str, str], fields: dict[str, tuple[ColumnType, Any]],
      time: int = NOW) -> tuple[str, dict[str, str], dict[str, tuple[ColumnType, Any]], int]:
    return (measurement, tags, fields, time)


Case = tuple[str, bytes, Any]

# --- control characters: the reference refuses U+0000-U+001F and U+007F (tab included) everywhere but inside a
# string value; a line may start with spaces only; a comment holds printable characters only.
CONTROL: list[Case] = [
    ("tab in measurement", b"m\tx f=1", Err(1, 2, "a tab")),
    ("NUL in measurement", b"m\x00x f=1", Err(1, 2, "NUL")),
    ("DEL in measurement", b"m\x7f f=1", Err(1, 2, "U+007F")),
    ("vertical tab after measurement", b"m\x0b2=\",\" f=1", Err(1, 2, "U+000B")),
    ("control in tag key", b"m,foo\x03=bar x=1", Err(1, 6, "U+0003")),
    # Deliberately stricter than the corpus (decoded by v2.1), as the decoder's later releases: a tag value is
    # part of the series key, printed wherever the key is.
    ("control in tag value", b"m,foo=bar\x02 x=1", Err(1, 10, "U+0002")),
    ("NUL in tag value", b"m,t=a\x00b f=1", Err(1, 6, "NUL")),
    ("control in field key", b"m foo\x01=bar", Err(1, 6, "U+0001")),
    ("control at start of field key", b"m f=1,\x01=1", Err(1, 7, "U+0001")),
    ("tab as a separator", b"m\tf=1", Err(1, 2, "a tab")),
    ("line starting with a tab", b"\tm v=1", Err(1, 1, "a tab")),
    ("line of spaces then a tab", b"  \tm v=1", Err(1, 3, "a tab")),
    ("line holding only a tab", b"m v=1\n\t\n", Err(2, 1, "a tab")),
    ("control at start of second line", b"m r=f\n\x02 r=f\n", Err(2, 1, "U+0002")),
    ("tab after a value", b"m f=1\t", Err(1, 5, "invalid value")),
    ("tab after the timestamp", b"m f=1 5\t", Err(1, 7, "timestamp")),
    ("tab in a comment", b"# a\tb\nm f=1", Err(1, 4, "comment")),
    ("control in a comment", b"#\x15x\nm f=1", Err(1, 2, "comment")),
    ("CR inside a comment", b"# foo\rxxx\nm x=1\r\n", Err(1, 6, "comment")),
    ("controls inside a string are kept", b'm s="a\tb\x00c\x7f"', [P("m", {}, {"s": (S, "a\tb\x00c\x7f")})]),
]

# --- line endings: LF, CRLF, or a CR at the very end of the input; a CR anywhere else is refused.
LINE_ENDINGS: list[Case] = [
    ("CRLF lines and blank CRLF lines", b"# foo\r\nm x=1\r\n\r\n  \r\nm x=2 7\r\n",
     [P("m", {}, {"x": (F, 1.0)}), P("m", {}, {"x": (F, 2.0)}, 7)]),
    ("CR at end of input", b"m x=1\r", [P("m", {}, {"x": (F, 1.0)})]),
    ("CR alone between points", b"m x=1\rm x=2\n", Err(1, 5, "")),
    ("CR CR LF", b"m x=1\r\r\n", Err(1, 5, "")),
    ("CR alone on a line", b"m x=1\n\r\r\n", Err(2, 1, "carriage return")),
    ("CR before a space", b"m x=1\r 5\n", Err(1, 5, "")),
    ("line numbers count LF only", b"m x=1\r\n\r\nm x=y\r\n", Err(3, 5, "invalid value")),
]

# --- string values: the reference takes any character but an unescaped quote, newlines included, and keeps
# counting lines inside them; \" and \\ are escapes, a backslash before anything else stays (\n, \r and \t too, as
# in the corpus and InfluxDB 3; the decoder's releases from v2.2.0 differ there).
STRINGS: list[Case] = [
    ("newline inside a string", b'cpu value="4\n2"', [P("cpu", {}, {"value": (S, "4\n2")})]),
    ("string ending in a newline", b'u r="o\n"', [P("u", {}, {"r": (S, "o\n")})]),
    ("newline string then timestamp", b'cpu,host=a v=1.0,str="foo\nbar" 1000000000',
     [P("cpu", {"host": "a"}, {"v": (F, 1.0), "str": (S, "foo\nbar")}, 1000000000)]),
    ("CRLF inside a string is kept", b'm s="a\r\nb"\r\n', [P("m", {}, {"s": (S, "a\r\nb")})]),
    ("CR inside a string is kept", b'm s="a\rb" 1', [P("m", {}, {"s": (S, "a\rb")}, 1)]),
    ("lines after a multi-line string keep their numbers", b'm s="a\nb\nc" 1\nm f=x\n', Err(4, 5, "invalid value")),
    ("error after the newline of a string", b'm f="hello\ngoodbye\nx",g=invalid', Err(3, 6, "'g'")),
    ("bad timestamp after a multi-line string", b'm s="a\nb" zz', Err(2, 4, "timestamp")),
    ("unterminated string runs to the end", b'm f="a\nb",g="c\nd', Err(2, 6, "not terminated")),
    ("unterminated string swallows later lines", b'm s="open\nm f=1\nm f=2', Err(1, 5, "not terminated")),
    ("escapes in a string", b'm s="q\\" b\\\\ n\\n r\\r t\\t"', [P("m", {}, {"s": (S, 'q" b\\ n\\n r\\r t\\t')})]),
    ("backslash n stays", b'm v="\\n"', [P("m", {}, {"v": (S, "\\n")})]),
    ("backslash r stays", b'm v="\\r"', [P("m", {}, {"v": (S, "\\r")})]),
    ("backslash t stays", b'm v="\\t"', [P("m", {}, {"v": (S, "\\t")})]),
    ("other escapes stay", b'm s="\\v\\,\\a"', [P("m", {}, {"s": (S, "\\v\\,\\a")})]),
    ("backslash before a newline stays", b'm s="a\\\nb"', [P("m", {}, {"s": (S, "a\\\nb")})]),
    ("escaped quote at the end", b'm s="x\\\\",t="y"', [P("m", {}, {"s": (S, "x\\"), "t": (S, "y")})]),
    ("empty string", b'm s=""', [P("m", {}, {"s": (S, "")})]),
    ("text after a string", b'm s="a"x', Err(1, 8, "unexpected")),
    ("quote is plain in a tag value", b'm,t="a f=1', [P("m", {"t": '"a'}, {"f": (F, 1.0)})]),
]

# --- escapes in names: measurement escapes ',' and ' '; tag keys, tag values and field keys escape ',', '='
# and ' '; a backslash before anything else (another backslash included) is literal.
ESCAPES: list[Case] = [
    ("measurement escapes", b"my\\ m\\,x\\=y,t=v f=1", [P("my m,x\\=y", {"t": "v"}, {"f": (F, 1.0)})]),
    ("tag escapes", b"m,t\\ k\\,x\\=y=v\\ a\\,b\\=c f=1", [P("m", {"t k,x=y": "v a,b=c"}, {"f": (F, 1.0)})]),
    ("field key escapes", b"m f\\ k\\,x\\=y=1", [P("m", {}, {"f k,x=y": (F, 1.0)})]),
    ("not escapable keeps the backslash", b"cpu va\\lue=42 5", [P("cpu", {}, {"va\\lue": (F, 42.0)}, 5)]),
    ("triple backslash space", b"cpu,host=two\\\\\\ words value=42 5",
     [P("cpu", {"host": "two\\\\ words"}, {"value": (F, 42.0)}, 5)]),
    ("unescaped = in tag value", b"m,t=a=b f=1", Err(1, 6, "unescaped '='")),
    ("escaped space swallows the separator", b"m,t=a\\ f=1", Err(1, 9, "unescaped '='")),
    ("backslash before a tab is literal, the tab is not", b"m\\\tx f=1", Err(1, 3, "a tab")),
    ("backslash at the end of the input", b"m f=1,x\\", Err(1, 9, "no value")),
]

# --- field values: numbers start with a digit, '-' or '.'; floats are Go's ParseFloat (underscores between
# digits, hex with a p exponent), finite; integers and unsigned are plain decimal in 64 bits.
VALUES: list[Case] = [
    *[(f"float {t}", f"m f={t}".encode(), [P("m", {}, {"f": (F, v)})]) for t, v in [
        ("1e3", 1000.0), ("-0", -0.0), ("1.", 1.0), (".5", 0.5), ("-.5", -0.5), ("1E+2", 100.0), ("5.e3", 5000.0),
        ("1_000", 1000.0), ("1_23.50_0e+1_2", 1.235e14), ("0x1p4", 16.0), ("-0x1.8p1", -3.0), ("0x_1p0", 1.0),
        ("0X.8P1", 1.0), ("1e-400", 0.0), ("007", 7.0)]],
    *[(f"bad float {t}", f"m f={t}".encode(), Err(1, 5, "'f'")) for t in [
        "+1", "inf", "-inf", "NaN", "nan", "Infinity", "1e400", "-1e400", "0x10", "0x1p", "1__0", "1_", "_1",
        "1_.5", "1._5", ".", "-", "1.2.3", "0b1", "e5", "0x1p2000", "1e", "1ee1", "١"]],
    *[(f"integer {t}", f"m n={t}".encode(), [P("m", {}, {"n": (I, v)})]) for t, v in [
        ("9223372036854775807i", 2**63 - 1), ("-9223372036854775808i", -(2**63)), ("-0i", 0), ("007i", 7)]],
    *[(f"bad integer {t}", f"m n={t}".encode(), Err(1, 5, "'n'")) for t in [
        "9223372036854775808i", "-9223372036854775809i", "+1i", "1_0i", "0x10i", "1.5i", "i", "-i"]],
    *[(f"unsigned {t}", f"m u={t}".encode(), [P("m", {}, {"u": (U, v)})]) for t, v in [
        ("18446744073709551615u", 2**64 - 1), ("0u", 0), ("00u", 0)]],
    *[(f"bad unsigned {t}", f"m u={t}".encode(), Err(1, 5, "'u'")) for t in [
        "18446744073709551616u", "-0u", "-1u", "+1u", "1_0u", "u"]],
    *[(f"boolean {t}", f"m b={t}".encode(), [P("m", {}, {"b": (B, v)})]) for t, v in [
        ("t", True), ("T", True), ("true", True), ("True", True), ("TRUE", True),
        ("f", False), ("F", False), ("false", False), ("False", False), ("FALSE", False)]],
    *[(f"bad boolean {t}", f"m b={t}".encode(), Err(1, 5, "'b'")) for t in ["tRUE", "yes", "trueX", "fals"]],
    # Python refuses to convert more than 4300 digits: such a number must be out of range, not a crash.
    ("integer of 5000 digits", b"m n=" + b"9" * 5000 + b"i", Err(1, 5, "out of range")),
    ("unsigned of 5000 digits", b"m n=" + b"9" * 5000 + b"u", Err(1, 5, "out of range")),
    ("integer with 5000 leading zeros", b"m n=-" + b"0" * 5000 + b"7i", [P("m", {}, {"n": (I, -7)})]),
    ("float of 5000 digits", b"m f=" + b"1" * 5000, Err(1, 5, "out of range")),
    ("value of no type", b"TestBucket FieldOne=Happy,FieldTwo=sad", Err(1, 21, "invalid value")),
    ("missing value", b"m f=,g=1", Err(1, 5, "no value")),
]

# --- tags and fields: empty tag values, duplicate tag keys and a comma with no tag are refused. Duplicate field
# keys: the reference's decoder returns both values; we refuse them (deliberately stricter: a row holds one
# value per column, and dropping either silently would lose data).
SHAPE: list[Case] = [
    ("empty tag value", b"m,t= f=1", Err(1, 5, "no value")),
    ("tag without =", b"cpu,host=serverA,region value=1i", Err(1, 24, "no value")),
    ("comma then space", b"m, f=1", Err(1, 3, "empty tag key")),
    ("duplicate tag key", b"m,t=a,t=b f=1", Err(1, 7, "duplicate tag key")),
    ("duplicate field key (stricter)", b"m f=1,f=2", Err(1, 7, "duplicate field key")),
    ("tags in any order", b"m,b=2,a=1 f=1", [P("m", {"a": "1", "b": "2"}, {"f": (F, 1.0)})]),
    ("no fields", b"m,t=a", Err(1, 6, "missing fields")),
    ("only a measurement and a space", b"m ", Err(1, 3, "missing fields")),
    ("several spaces between sections, trailing spaces", b"  m,t=a   f=1   7   ",
     [P("m", {"t": "a"}, {"f": (F, 1.0)}, 7)]),
    ("space value and no timestamp", b"9 f=-7 ", [P("9", {}, {"f": (F, -7.0)})]),
    # Deliberately different: the reference makes a byte order mark part of the first name (a table `\ufeffm` no
    # one can tell from `m`); at the very start of the input it is skipped, anywhere else refused.
    ("byte order mark at the start is skipped", b"\xef\xbb\xbfm f=1 1", [P("m", {}, {"f": (F, 1.0)}, 1)]),
    ("columns count after a skipped byte order mark", b"\xef\xbb\xbfm f=x", Err(1, 5, "'f'")),
    ("only the first byte order mark is skipped", b"\xef\xbb\xbf\xef\xbb\xbfm f=1", Err(1, 1, "byte order mark")),
    ("byte order mark on a later line", b"m f=1\n\xef\xbb\xbfm f=1", Err(2, 1, "byte order mark")),
    ("byte order mark in a tag value", b"m,t=a\xef\xbb\xbf f=1", Err(1, 6, "byte order mark")),
    ("non-ASCII names", "mesure,lieu=Zürich température=21.5".encode(),
     [P("mesure", {"lieu": "Zürich"}, {"température": (F, 21.5)})]),
]

# --- naming rules of PRODUCT.md and names a query can use (catalog/names.py), deliberately stricter than the
# reference (which takes any of these).
NAMING: list[Case] = [
    ("tag named time", b"cpu,tag0=v0,time=v0 value=1", Err(1, 13, "reserved")),
    ("field named time", b"m time=1", Err(1, 3, "reserved")),
    ("tag starting with __", b"m,__x=a f=1", Err(1, 3, "reserved")),
    ("field starting with __", b"m f=1,__seq=1", Err(1, 7, "reserved")),
    ("measurement an internal view", b"__iox_scan_0 f=1", Err(1, 1, "reserved")),
    ("measurement an internal column in another case", b"  __TIME_NS f=1", Err(1, 3, "reserved")),
    ("measurement of an escaped space", b"\\  f=1", Err(1, 1, "only whitespace")),
    ("measurement of no-break spaces", "\u00a0\u00a0,t=v f=1".encode(), Err(1, 1, "only whitespace")),
    # A column of spaces can be queried (`` ` ` ``), as the corpus takes it: only a table is refused.
    ("tag key of one space", b"m,\\ =v f=1", [P("m", {" ": "v"}, {"f": (F, 1.0)})]),
    ("field key of an ideographic space", "m \u3000=1".encode(), [P("m", {}, {"\u3000": (F, 1.0)})]),
    ("C1 control in a measurement", "m\u0085 f=1".encode(), Err(1, 2, "U+0085")),
    ("C1 control in a tag value", "m,t=\u009b31m f=1".encode(), Err(1, 5, "U+009B")),
    ("line separator in a field key", "m a\u2028b=1".encode(), Err(1, 4, "line separator")),
    ("measurement named time", b"time f=1", [P("time", {}, {"f": (F, 1.0)})]),
    ("names a query backquotes", "sys.cpu,host-name=a,'q'=\"d\" `tick`=1,select=2,ünï\\ cödé=3".encode(),
     [P("sys.cpu", {"host-name": "a", "'q'": '"d"'},
        {"`tick`": (F, 1.0), "select": (F, 2.0), "ünï cödé": (F, 3.0)})]),
    ("a name as tag and as field", b"m,a=1 a=2", Err(1, 7, "tag on this line")),
    ("case matters", b"m,Host=a host=1", [P("m", {"Host": "a"}, {"host": (F, 1.0)})]),
]

# --- timestamps: an optional '-' and decimal digits, in nanoseconds after scaling, within the whole UTC days int64
# holds (the reference takes all of int64; the catalog stores each day partition's bounds as bigint).
TIMESTAMPS: list[Case] = [
    ("negative zero", b"m f=1 -0", [P("m", {}, {"f": (F, 1.0)}, 0)]),
    ("int64 minimum", b"m f=1 -9223372036854775808", Err(1, 7, "out of range")),
    ("int64 maximum", b"m f=1 9223372036854775807", Err(1, 7, "out of range")),
    ("first nanosecond of 1677-09-22", b"m f=1 -9223286400000000000",
     [P("m", {}, {"f": (F, 1.0)}, -9223286400000000000)]),
    ("last nanosecond of 1677-09-21", b"m f=1 -9223286400000000001", Err(1, 7, "out of range")),
    ("last nanosecond of 2262-04-10", b"m f=1 9223286399999999999",
     [P("m", {}, {"f": (F, 1.0)}, 9223286399999999999)]),
    ("first nanosecond of 2262-04-11", b"m f=1 9223286400000000000", Err(1, 7, "out of range")),
    ("one past int64", b"m f=1 9223372036854775808", Err(1, 7, "out of range")),
    ("one before int64", b"m f=1 -9223372036854775809", Err(1, 7, "out of range")),
    ("leading +", b"m f=1 +5", Err(1, 7, "timestamp")),
    ("fraction", b"m f=1 1.5", Err(1, 7, "timestamp")),
    ("underscore", b"m f=1 1_0", Err(1, 7, "timestamp")),
    ("timestamp of 5000 digits", b"m f=1 -" + b"9" * 5000, Err(1, 7, "out of range")),
    ("timestamp with 5000 leading zeros", b"m f=1 " + b"0" * 5000 + b"5", [P("m", {}, {"f": (F, 1.0)}, 5)]),
    ("text after the timestamp", b"m f=1 1 2", Err(1, 9, "after the timestamp")),
]

CASES = CONTROL + LINE_ENDINGS + STRINGS + ESCAPES + VALUES + SHAPE + NAMING + TIMESTAMPS


def decoded(result: ParseResult) -> list[tuple[str, dict[str, str], dict[str, tuple[ColumnType, Any]], int]]:
    return [(p.measurement, dict(p.tags), dict(p.fields), p.time) for p in result.points]


@pytest.mark.parametrize(("data", "expected"), [pytest.param(d, e, id=name) for name, d, e in CASES])
def test_conformance(data: bytes, expected: Any) -> None:
    result = parse_bytes(data, default_time=NOW)
    if isinstance(expected, Err):
        assert result.errors, decoded(result)
        first = result.errors[0]
        assert (first.line, first.column) == (expected.line, expected.column), str(first)
        assert expected.words in first.message, str(first)
    else:
        assert result.errors == (), [str(e) for e in result.errors]
        got = decoded(result)
        assert got == expected
        # -0.0 == 0.0: compare signs of floats too, since the reference keeps the sign of a negative zero.
        signs = [[str(v) for _, v in fields.values()] for _, _, fields, _ in got]
        assert signs == [[str(v) for _, v in fields.values()] for _, _, fields, _ in expected]


def test_cases_have_unique_names() -> None:
    names = [name for name, _, _ in CASES]
    assert len(names) == len(set(names))


# --- precision: a line without a timestamp gets the write's time truncated to the unit, as the reference does.


@pytest.mark.parametrize(
    ("precision", "expected"),
    [(Precision.NS, NOW), (Precision.US, 1_700_000_123_456_789_000), (Precision.MS, 1_700_000_123_456_000_000),
     (Precision.S, 1_700_000_123_000_000_000)],
)
def test_missing_timestamp_is_now_truncated_to_the_precision(precision: Precision, expected: int) -> None:
    result = parse_bytes(b"m f=1\nm f=2 5\n", default_time=NOW, precision=precision)
    assert [p.time for p in result.points] == [expected, 5 * precision.multiplier]


# --- UTF-8: the reference refuses invalid UTF-8 in names and values; we refuse the input whole, naming the line
# and column of the first bad byte (deliberately stricter in a comment line, which the reference does not check).


@pytest.mark.parametrize(
    ("data", "where"),
    [(b"m,t=\xff f=1", "line 1, column 5"), (b"m f=1\nm s=\"ab\xc3\" 1", "line 2, column 8"),
     (b"m f=1\n# \xfe\n", "line 2, column 3"), (b"\xe2\x82", "line 1, column 1")],
)
def test_invalid_utf8_is_refused_with_its_position(data: bytes, where: str) -> None:
    with pytest.raises(BadInputError, match="not UTF-8") as info:
        parse_bytes(data, default_time=NOW, source="input.lp")
    assert where in str(info.value) and "input.lp" in str(info.value)


# --- limits: a hostile line costs a bounded amount of time, and no message echoes more than an excerpt.


def timed(text: str, **kwargs: Any) -> tuple[float, ParseResult]:
    start = time.perf_counter()
    result = parse(text, default_time=NOW, **kwargs)
    return time.perf_counter() - start, result


def test_a_million_tags_fail_fast_on_the_line_limit() -> None:
    line = "m" + "".join(f",t{i}=v" for i in range(1_000_000)) + " f=1"
    seconds, result = timed(line)
    assert seconds < 3, seconds
    assert result.points == ()
    [error] = result.errors
    assert (error.line, error.column) == (1, 1_048_577)
    assert "IOX_LP_MAX_LINE_BYTES" in error.message and len(error.message) < 300


def test_a_million_tags_fail_fast_on_the_column_limit_when_lines_may_be_long() -> None:
    line = "m" + "".join(f",t{i}=v" for i in range(1_000_000)) + " f=1"
    seconds, result = timed(line, limits=Limits(max_line_bytes=100_000_000))
    assert seconds < 3, seconds
    [error] = result.errors
    # Tag 1001 starts after "m" and 1000 tags ",tI=v" of lengths 5 (10 of them), 6 (90) and 7 (900).
    assert error.column == 2 + 10 * 5 + 90 * 6 + 900 * 7 + 1
    assert "more than 1000 tags and fields" in error.message and "IOX_LP_MAX_COLUMNS" in error.message


def test_the_column_limit_counts_fields_too_and_can_be_raised() -> None:
    line = "m,a=1,b=2 " + ",".join(f"f{i}=1" for i in range(8))
    assert parse(line, default_time=NOW, limits=Limits(max_columns=10)).errors == ()
    too_many = parse(line + ",g=1", default_time=NOW, limits=Limits(max_columns=10))
    assert [(e.line, e.column) for e in too_many.errors] == [(1, len(line) + 2)]


@pytest.mark.parametrize("limits", [None, Limits(max_line_bytes=100_000_000)])
def test_a_ten_megabyte_name_fails_fast(limits: Limits | None) -> None:
    seconds, result = timed("m" * 10_000_000 + " f=1", limits=limits)
    assert seconds < 2, seconds
    [error] = result.errors
    assert error.line == 1 and len(error.message) < 400
    assert "limit" in error.message


def test_names_are_limited_in_bytes() -> None:
    ok = "é" * 128  # 256 bytes
    assert parse(f"{ok},{ok}=v {ok.upper()}=1", default_time=NOW).errors == ()
    result = parse(f"m {ok}x=1", default_time=NOW)
    assert [(e.line, e.column) for e in result.errors] == [(1, 3)]
    assert "257 bytes" in result.errors[0].message and "IOX_LP_MAX_NAME_BYTES" in result.errors[0].message


def test_nul_in_a_name_is_refused_on_both_paths() -> None:
    # Plain lines take the fast path, lines with a quote the scanner: both must refuse.
    result = parse('m\x00 f=1\nm,t=\x00 f=1\nm f\x00=1\nm s="x",f\x00=1', default_time=NOW)
    assert [(e.line, e.column) for e in result.errors] == [(1, 2), (2, 5), (3, 4), (4, 10)]
    assert all("NUL" in e.message for e in result.errors)


def test_a_huge_bad_value_is_quoted_as_an_excerpt() -> None:
    result = parse("m f=" + "x" * 500_000, default_time=NOW)
    [error] = result.errors
    assert len(error.message) < 400 and "500000 bytes" in error.message


def test_too_many_bad_lines_stop_reading() -> None:
    with pytest.raises(BadInputError) as info:
        parse("bad\n" * 100_000, default_time=NOW, limits=Limits(max_bad_lines=50, errors_shown=3))
    text = str(info.value)
    assert "more than 50 bad lines" in text and "IOX_LP_MAX_BAD_LINES" in text and "line 51" in text
    assert text.count("missing fields") == 3 and len(text) < 1000


def test_error_lists_are_bounded() -> None:
    result = parse("\n".join(["m f=x"] * 25), default_time=NOW)
    text = describe_errors(result.errors, shown=4)
    assert text.startswith("25 bad lines: line 1, column 5") and text.endswith("and 21 more bad lines")
    assert [f"line {n}," in text for n in range(1, 7)] == [True] * 4 + [False] * 2


def test_limits_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOX_LP_MAX_COLUMNS", "2")
    monkeypatch.setenv("IOX_LP_MAX_NAME_BYTES", "3")
    assert Limits.from_env() == Limits(max_columns=2, max_name_bytes=3)
    result = parse("m,a=1 b=1,c=1\nlong f=1", default_time=NOW)
    assert [(e.line, e.column) for e in result.errors] == [(1, 11), (2, 1)]


@pytest.mark.parametrize("value", ["0", "-1", "ten", "1e3", "99999999999", "9" * 5000])
def test_a_bad_limit_variable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("IOX_LP_MAX_LINE_BYTES", value)
    with pytest.raises(BadInputError, match=r"IOX_LP_MAX_LINE_BYTES.*the default, 1,048,576"):
        parse("m f=1", default_time=NOW)


def test_names_cannot_be_allowed_longer_than_the_catalog_can_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name is a key of the catalog's unique indexes (Postgres: 2704 bytes an entry at most); a longer one
    would fail the write at its commit, so the limit stops below that."""
    monkeypatch.setenv("IOX_LP_MAX_NAME_BYTES", "2048")
    assert parse(f"{'m' * 2048} f=1", default_time=NOW).errors == ()
    monkeypatch.setenv("IOX_LP_MAX_NAME_BYTES", "2049")
    with pytest.raises(BadInputError, match=r"IOX_LP_MAX_NAME_BYTES=.* from 1 to 2,048 .*the default, 256"):
        parse("m f=1", default_time=NOW)


@pytest.mark.parametrize("size", [20_000, 80_000])
def test_pathological_lines_parse_in_linear_time(size: int) -> None:
    # Escapes, multi-line strings and many fields all go through the scanner; each must stay linear.
    lim = Limits(max_line_bytes=100_000_000, max_columns=10 * size)
    escaped = "m,t=" + "\\ " * size + " f=1"
    multiline = 'm s="' + "x\n" * size + '"'
    wide = "m " + ",".join(f"f{i}=1" for i in range(size // 10)) + ',s="x"'
    seconds, result = timed("\n".join([escaped, multiline, wide]), limits=lim)
    assert result.errors == () and len(result.points) == 3
    assert seconds < size / 20_000, seconds
