"""Line protocol parser: every expected value below is written by hand, never produced by the parser."""

from __future__ import annotations

import pytest

from iox_planner.errors import BadInputError
from iox_planner.ingest.lineprotocol import LineError, ParseResult, Point, Precision, parse
from iox_planner.ingest.lineprotocol.points import new_point
from iox_planner.model import ColumnType

F = ColumnType.FLOAT
I = ColumnType.INTEGER  # noqa: E741
U = ColumnType.UNSIGNED
B = ColumnType.BOOLEAN
S = ColumnType.STRING

NOW = 1_700_000_000_000_000_000


def run(text: str, **kwargs: object) -> ParseResult:
    return parse(text, default_time=NOW, **kwargs)  # type: ignore[arg-type]


def one(line: str, **kwargs: object) -> Point:
    result = run(line, **kwargs)
    assert result.errors == ()
    assert len(result.points) == 1
    return result.points[0]


def fields_of(line: str) -> dict[str, tuple[ColumnType, object]]:
    return dict(one(line).fields)


def error(line: str) -> tuple[int, str]:
    """The column and message of the single error of a one-line input."""
    result = run(line)
    assert result.points == ()
    assert len(result.errors) == 1, result.errors
    assert result.errors[0].line == 1
    return result.errors[0].column, result.errors[0].message


# --- basic shape -------------------------------------------------------------------------------------------------


def test_full_line() -> None:
    point = one("cpu,host=a,region=us usage=1.5,count=3i 1704067200000000000")
    assert point == Point(
        line=1,
        measurement="cpu",
        tags={"host": "a", "region": "us"},
        fields={"usage": (F, 1.5), "count": (I, 3)},
        time=1704067200000000000,
    )


def test_no_tags_and_no_timestamp_uses_default_time() -> None:
    point = one("cpu usage=2")
    assert point.measurement == "cpu"
    assert dict(point.tags) == {}
    assert dict(point.fields) == {"usage": (F, 2.0)}
    assert point.time == NOW


def test_extra_spaces_between_sections_and_at_the_end_are_accepted() -> None:
    assert one("m,t=a  f=1   7   ") == Point(1, "m", {"t": "a"}, {"f": (F, 1.0)}, 7)
    assert one("m f=1 ") == Point(1, "m", {}, {"f": (F, 1.0)}, NOW)


def test_leading_spaces_are_skipped_but_not_a_tab() -> None:
    # The reference skips spaces only: a tab at the start of a line is a character of no name.
    assert one("   m f=1 7") == Point(1, "m", {}, {"f": (F, 1.0)}, 7)
    assert error("  \tm f=1 7") == (3, error("\tm f=1")[1])


def test_tags_are_read_only() -> None:
    point = one("m,t=a f=1")
    with pytest.raises(TypeError):
        point.tags["t"] = "b"  # type: ignore[index]


def test_fast_point_matches_the_dataclass_constructor() -> None:
    built = new_point(3, "m", {"t": "a"}, {"f": (F, 1.0)}, 9)
    assert built == Point(3, "m", {"t": "a"}, {"f": (F, 1.0)}, 9)
    assert repr(built) == repr(Point(3, "m", {"t": "a"}, {"f": (F, 1.0)}, 9))


def test_points_from_the_fast_path_and_the_scanner_agree() -> None:
    # Trailing spaces and a leading space send a line to the character scanner; the plain lines take the fast path.
    result = run("m,t=a f=1,g=2i,h=t,u=3u 5\nm,t=a f=1,g=2i,h=t,u=3u 5  \n m,t=a f=1,g=2i,h=t,u=3u 5")
    assert result.errors == ()
    expected = ({"t": "a"}, {"f": (F, 1.0), "g": (I, 2), "h": (B, True), "u": (U, 3)}, 5)
    assert [(dict(p.tags), dict(p.fields), p.time) for p in result.points] == [expected, expected, expected]


# --- escaping ----------------------------------------------------------------------------------------------------


def test_measurement_escapes_comma_and_space() -> None:
    point = one(r"my\ meas\,x,t=v f=1")
    assert point.measurement == "my meas,x"
    assert dict(point.tags) == {"t": "v"}


def test_measurement_keeps_backslash_before_other_characters() -> None:
    assert one(r"a\=b f=1").measurement == "a\\=b"
    assert one(r"a\xb f=1").measurement == "a\\xb"
    assert one("a=b f=1").measurement == "a=b"


def test_tag_key_and_value_escape_comma_equals_and_space() -> None:
    point = one(r"m,t\ k\,x\=y=v\ a\,b\=c f=1")
    assert dict(point.tags) == {"t k,x=y": "v a,b=c"}


def test_field_key_escapes_comma_equals_and_space() -> None:
    assert fields_of(r"m f\ k\,x\=y=1") == {"f k,x=y": (F, 1.0)}


def test_backslash_before_other_characters_is_literal_in_names() -> None:
    point = one(r"m,t\x=a\b f\n=1")
    assert dict(point.tags) == {"t\\x": "a\\b"}
    assert dict(point.fields) == {"f\\n": (F, 1.0)}
    # Two backslashes are two literal backslashes: the second one is followed by 'b', not by a special character.
    assert dict(one(r"m,t=a\\b f=1").tags) == {"t": "a\\\\b"}


def test_string_escapes_quote_and_backslash() -> None:
    assert fields_of(r'm s="say \"hi\" \\ ok"') == {"s": (S, 'say "hi" \\ ok')}


def test_string_keeps_backslash_before_anything_but_a_quote_or_a_backslash() -> None:
    # As the conformance corpus and InfluxDB 3: \n, \r and \t are a backslash and a letter (a Windows path stays
    # a path), as are \, and \v.
    assert fields_of(r'm s="a\nb\rc\td\,e\v"') == {"s": (S, "a\\nb\\rc\\td\\,e\\v")}
    assert fields_of(r'm p="C:\new\table\\x"') == {"p": (S, "C:\\new\\table\\x")}


def test_string_may_hold_commas_spaces_and_equals_signs() -> None:
    point = one('m s="a, b=c d",n=1i 12')
    assert dict(point.fields) == {"s": (S, "a, b=c d"), "n": (I, 1)}
    assert point.time == 12


def test_string_ending_in_escaped_backslash() -> None:
    assert fields_of(r'm s="x\\",t="y"') == {"s": (S, "x\\"), "t": (S, "y")}


def test_empty_string() -> None:
    assert fields_of('m s=""') == {"s": (S, "")}


def test_non_ascii_names_and_values() -> None:
    point = one('mesure,lieu=Zürich température=21.5,note="été"')
    assert point.measurement == "mesure"
    assert dict(point.tags) == {"lieu": "Zürich"}
    assert dict(point.fields) == {"température": (F, 21.5), "note": (S, "été")}


# --- field types -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", 1.0),
        ("1.0", 1.0),
        ("-1.5e10", -15000000000.0),
        (".5", 0.5),
        ("-.5", -0.5),
        ("1.", 1.0),
        ("1E5", 100000.0),
        ("1e-3", 0.001),
        ("2.5E+2", 250.0),
        ("-0", 0.0),
        ("1e308", 1e308),
        ("1_000.5", 1000.5),
        ("0x1p-2", 0.25),
        ("-0x1.8p1", -3.0),
    ],
)
def test_floats(text: str, value: float) -> None:
    assert fields_of(f"m f={text}") == {"f": (F, value)}


def test_large_floats_whose_sum_overflows_are_still_accepted() -> None:
    assert fields_of("m a=1e308,b=1e308") == {"a": (F, 1e308), "b": (F, 1e308)}


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1e400", "+1", "0x10", "1__0",
                                  "_1", "1_", "1.2.3", "e5", "5e", ".", "-", "12a", "١"])
def test_invalid_floats(text: str) -> None:
    column, message = error(f"m f={text}")
    assert column == 5
    assert "'f'" in message


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("12i", 12),
        ("-12i", -12),
        ("0i", 0),
        ("-0i", 0),
        ("007i", 7),
        ("9223372036854775807i", 9223372036854775807),
        ("-9223372036854775808i", -9223372036854775808),
    ],
)
def test_integers(text: str, value: int) -> None:
    assert fields_of(f"m f={text}") == {"f": (I, value)}


@pytest.mark.parametrize("text", ["9223372036854775808i", "-9223372036854775809i"])
def test_integer_overflow_by_one(text: str) -> None:
    column, message = error(f"m n={text}")
    assert column == 5
    assert "'n'" in message and "out of range" in message


@pytest.mark.parametrize("text", ["1.5i", "i", "-i", "1i2", "+1i", "1_0i", "0x1i"])
def test_invalid_integers(text: str) -> None:
    column, message = error(f"m n={text}")
    assert column == 5
    assert "'n'" in message


@pytest.mark.parametrize(
    ("text", "value"),
    [("0u", 0), ("12u", 12), ("18446744073709551615u", 18446744073709551615)],
)
def test_unsigned(text: str, value: int) -> None:
    assert fields_of(f"m f={text}") == {"f": (U, value)}


def test_unsigned_max_survives_exactly() -> None:
    (kind, value), = fields_of("m u=18446744073709551615u").values()
    assert kind is U
    assert type(value) is int
    assert value == 2**64 - 1


@pytest.mark.parametrize("text", ["18446744073709551616u", "-1u", "-0u", "1.5u", "u", "+1u"])
def test_invalid_unsigned(text: str) -> None:
    column, message = error(f"m u={text}")
    assert column == 5
    assert "'u'" in message


@pytest.mark.parametrize(
    ("text", "value"),
    [("t", True), ("T", True), ("true", True), ("True", True), ("TRUE", True),
     ("f", False), ("F", False), ("false", False), ("False", False), ("FALSE", False)],
)
def test_booleans(text: str, value: bool) -> None:
    assert fields_of(f"m b={text}") == {"b": (B, value)}


@pytest.mark.parametrize("text", ["tru", "TRue", "yes", "1b", "fals"])
def test_invalid_booleans(text: str) -> None:
    column, message = error(f"m b={text}")
    assert column == 5
    assert "'b'" in message


def test_every_type_in_one_line() -> None:
    assert fields_of('m a=1,b=2i,c=3u,d=t,e="x"') == {
        "a": (F, 1.0), "b": (I, 2), "c": (U, 3), "d": (B, True), "e": (S, "x"),
    }


def test_bad_value_names_its_field() -> None:
    column, message = error("m f=1,g=1x")
    assert column == 9
    assert "'g'" in message


# --- timestamps and precision ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("precision", "expected"),
    [(Precision.NS, 5), (Precision.US, 5_000), (Precision.MS, 5_000_000), (Precision.S, 5_000_000_000)],
)
def test_precision_scales_to_nanoseconds(precision: Precision, expected: int) -> None:
    assert one("m f=1 5", precision=precision).time == expected


def test_precision_given_as_text() -> None:
    assert one("m f=1 1704067200", precision="s").time == 1704067200000000000


def test_default_time_is_truncated_to_the_precision() -> None:
    # As the reference: a line without a timestamp gets the write's time truncated to the unit.
    now = 1_700_000_123_456_789_123
    assert parse("m f=1", precision=Precision.S, default_time=now).points[0].time == 1_700_000_123_000_000_000
    assert parse("m f=1", precision=Precision.MS, default_time=now).points[0].time == 1_700_000_123_456_000_000
    assert parse("m f=1", precision=Precision.US, default_time=now).points[0].time == 1_700_000_123_456_789_000
    assert parse("m f=1", precision=Precision.NS, default_time=now).points[0].time == now


def test_unknown_precision_is_rejected() -> None:
    with pytest.raises(BadInputError, match="precision"):
        parse("m f=1", default_time=NOW, precision="m")


def test_default_time_must_be_a_time_data_may_have() -> None:
    with pytest.raises(BadInputError, match="default time"):
        parse("m f=1", default_time=2**63 - 1)


def test_negative_and_extreme_timestamps() -> None:
    assert one("m f=1 -1").time == -1
    assert one("m f=1 9223286399999999999").time == 9223286399999999999
    assert one("m f=1 -9223286400000000000").time == -9223286400000000000
    assert one("m f=1 0000000000000000000").time == 0


@pytest.mark.parametrize(
    ("line", "precision"),
    [
        ("m f=1 9223372036854775808", Precision.NS),
        ("m f=1 -9223372036854775809", Precision.NS),
        ("m f=1 9223372036854776", Precision.US),
        ("m f=1 9223372037", Precision.S),
        ("m f=1 9223286400", Precision.S),  # 2262-04-11: fits int64, but not in a whole day of it
        ("m f=1 -9223286401", Precision.S),
    ],
)
def test_timestamp_out_of_range_after_scaling(line: str, precision: Precision) -> None:
    result = run(line, precision=precision)
    assert result.points == ()
    assert [(e.line, e.column) for e in result.errors] == [(1, 7)]
    assert "out of range" in result.errors[0].message


def test_largest_timestamp_in_seconds() -> None:
    assert one("m f=1 9223286399", precision=Precision.S).time == 9223286399000000000


@pytest.mark.parametrize("stamp", ["abc", "1.5", "12a", "+5", "1e9", "0x10"])
def test_invalid_timestamp(stamp: str) -> None:
    column, message = error(f"m f=1 {stamp}")
    assert column == 7
    assert "timestamp" in message


# --- blank lines, comments, line endings -------------------------------------------------------------------------


def test_comments_blank_lines_and_crlf_keep_line_numbers() -> None:
    text = "# a comment\r\n\r\n   \r\n   # indented comment\r\nm f=1 1\r\n\r\nm f=2 2\r\n"
    result = run(text)
    assert result.errors == ()
    assert [(p.line, dict(p.fields), p.time) for p in result.points] == [
        (5, {"f": (F, 1.0)}, 1),
        (7, {"f": (F, 2.0)}, 2),
    ]


def test_crlf_with_error_reports_the_right_column() -> None:
    result = run("m f=1\r\nm f=x\r\n")
    assert [(e.line, e.column) for e in result.errors] == [(2, 5)]


def test_last_line_without_newline() -> None:
    assert [p.line for p in run("m f=1\nm f=2").points] == [1, 2]


def test_empty_input() -> None:
    assert run("") == ParseResult((), ())
    assert run("\n\n# nothing\n") == ParseResult((), ())


# --- syntax errors: line and column ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "column", "words"),
    [
        (",t=a f=1", 1, "missing measurement"),
        ("  ,t=a f=1", 3, "missing measurement"),
        ("m,t=a", 6, "missing fields"),
        ("m", 2, "missing fields"),
        ("m ", 3, "missing fields"),
        ("m,t f=1", 4, "tag 't' has no value"),
        ("m,t= f=1", 5, "tag 't' has no value"),
        ("m,t=a,u", 8, "tag 'u' has no value"),
        ("m,=a f=1", 3, "empty tag key"),
        ("m,t=a, f=1", 7, "empty tag key"),
        ("m,t=a=b f=1", 6, "unescaped '='"),
        ("m,t=a,t=b f=1", 7, "duplicate tag key 't'"),
        ("m =1", 3, "empty field key"),
        ("m f=1,=2", 7, "empty field key"),
        ("m f=1,", 7, "empty field key"),
        ("m f", 4, "field 'f' has no value"),
        ("m f=", 5, "field 'f' has no value"),
        ("m f=,g=1", 5, "field 'f' has no value"),
        ("m f=1,f=2", 7, "duplicate field key 'f'"),
        ('m s="abc', 5, "not terminated"),
        ('m a=1,s="x\\"', 9, "not terminated"),
        ('m s="a"x', 8, "unexpected 'x'"),
        ('m s="a"b="c"', 8, "unexpected 'b'"),
        ("m f=1 1 2", 9, "after the timestamp"),
        ("m f=1 abc", 7, "invalid timestamp"),
        ("mé f=x", 6, "field 'f'"),
    ],
)
def test_syntax_errors(line: str, column: int, words: str) -> None:
    got_column, message = error(line)
    assert (got_column, words in message) == (column, True), message


def test_line_error_text() -> None:
    assert str(LineError(3, 17, "something is wrong")) == "line 3, column 17: something is wrong"


def test_multiple_errors_are_all_reported_in_order() -> None:
    text = "\n".join([
        "m f=1 1",       # 1 ok
        "m f=abc 2",     # 2 bad value
        "# comment",     # 3
        "m,t f=1 3",     # 4 tag without value
        "m f=2 4",       # 5 ok
        "m f=3 x",       # 6 bad timestamp
        'm s="open 7',   # 7 unterminated: a string runs on to the end of the input
    ])
    result = run(text)
    assert [(p.line, p.time) for p in result.points] == [(1, 1), (5, 4)]
    assert [(e.line, e.column) for e in result.errors] == [(2, 5), (4, 4), (6, 7), (7, 5)]


def test_raise_for_errors() -> None:
    result = run("m f=1\nm f=x\nm g=y")
    with pytest.raises(BadInputError) as info:
        result.raise_for_errors()
    text = str(info.value)
    assert "2 bad lines" in text
    assert "line 2, column 5" in text and "line 3, column 5" in text
    run("m f=1").raise_for_errors()


def test_raise_for_errors_limits_the_list() -> None:
    result = run("\n".join(["m f=x"] * 5))
    with pytest.raises(BadInputError, match="and 3 more bad lines"):
        result.raise_for_errors(limit=2)


# --- naming rules ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "column"),
    [
        ("m,time=a f=1", 3),
        ("m time=1", 3),
        ("m,__x=a f=1", 3),
        ("m f=1,__seq=2i", 7),
        ("m,t=a,__chunk_order=b f=1", 7),
    ],
)
def test_reserved_names(line: str, column: int) -> None:
    got_column, message = error(line)
    assert got_column == column
    assert "reserved" in message


def test_names_close_to_reserved_ones_are_fine() -> None:
    point = one("m,Time=a,_x=b TIME=1,_y=2,x__=3")
    assert dict(point.tags) == {"Time": "a", "_x": "b"}
    assert dict(point.fields) == {"TIME": (F, 1.0), "_y": (F, 2.0), "x__": (F, 3.0)}


def test_tag_then_field_with_the_same_name_is_rejected_on_the_later_line() -> None:
    result = run("m,host=a f=1\nm host=1")
    assert len(result.points) == 1
    assert [(e.line, e.column) for e in result.errors] == [(2, 3)]
    assert "'host' is a tag" in result.errors[0].message and "line 1" in result.errors[0].message


def test_field_then_tag_with_the_same_name_is_rejected_on_the_later_line() -> None:
    result = run("m host=1\nm,host=a f=1")
    assert len(result.points) == 1
    assert [(e.line, e.column) for e in result.errors] == [(2, 3)]
    assert "'host' is a float field" in result.errors[0].message


def test_tag_and_field_with_the_same_name_on_one_line() -> None:
    column, message = error("m,a=1 a=2")
    assert column == 7
    assert "'a' is a tag on this line" in message


def test_same_name_as_tag_and_field_in_different_measurements_is_fine() -> None:
    result = run("m,a=x f=1\nn a=1")
    assert result.errors == ()
    assert len(result.points) == 2


def test_case_sensitive_names() -> None:
    point = one("m,Host=a,host=b F=1,f=2i")
    assert dict(point.tags) == {"Host": "a", "host": "b"}
    assert dict(point.fields) == {"F": (F, 1.0), "f": (I, 2)}
    # A tag `Host` and a field `host` do not clash either.
    assert run("m,Host=a f=1\nm host=1").errors == ()


def test_case_sensitive_measurements() -> None:
    result = run("cpu f=1\nCPU f=1i")
    assert result.errors == ()
    assert [p.measurement for p in result.points] == ["cpu", "CPU"]


# --- type conflicts ----------------------------------------------------------------------------------------------


def test_field_type_conflict_with_an_earlier_line() -> None:
    result = run("m f=1\nm f=1i")
    assert [p.line for p in result.points] == [1]
    assert [(e.line, e.column) for e in result.errors] == [(2, 5)]
    message = result.errors[0].message
    assert "integer" in message and "float" in message and "line 1" in message


def test_field_type_conflict_after_many_accepted_lines() -> None:
    # The first lines set up the fast path's cache of accepted layouts; the conflict must still be caught.
    text = "\n".join([f"m,h=a f=1,g=2 {i}" for i in range(5)] + ["m,h=a f=1,g=t 9"])
    result = run(text)
    assert len(result.points) == 5
    assert [(e.line, e.column) for e in result.errors] == [(6, 13)]


def test_type_is_per_measurement() -> None:
    assert run("m f=1\nn f=1i").errors == ()


def test_a_rejected_line_does_not_set_a_type() -> None:
    result = run("m f=1x\nm f=1i\nm f=1")
    assert [p.line for p in result.points] == [2]
    assert [(e.line, e.column) for e in result.errors] == [(1, 5), (3, 5)]
    assert "line 2" in result.errors[1].message


def test_a_rejected_line_does_not_set_names_either() -> None:
    # Line 1 fails on its timestamp, so `host` is not yet a tag when line 2 uses it as a field.
    result = run("m,host=a f=1 x\nm host=1")
    assert [p.line for p in result.points] == [2]
    assert [e.line for e in result.errors] == [1]


def test_duplicate_field_after_an_accepted_layout() -> None:
    result = run("m f=1,g=2\nm f=1,g=2,f=3")
    assert [(e.line, e.column) for e in result.errors] == [(2, 11)]


def test_existing_schema_is_respected() -> None:
    existing = {"m": {"host": ColumnType.TAG, "f": ColumnType.FLOAT, "time": ColumnType.TIME}}
    result = run("m f=1i\nm host=1\nm,host=a f=2", existing=existing)
    assert [p.line for p in result.points] == [3]
    assert [(e.line, e.column) for e in result.errors] == [(1, 5), (2, 3)]
    assert "existing table" in result.errors[0].message
