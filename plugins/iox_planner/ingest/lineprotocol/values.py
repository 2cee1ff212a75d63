"""Field values and timestamps as the reference reads them: Go's floats, 64-bit integers and unsigned
integers, the boolean words; `parse_value` types a value token or raises `BadLine` saying what was expected."""

from __future__ import annotations

import re
from typing import Callable

from iox_planner.ingest.lineprotocol.bad_lines import BadLine
from iox_planner.ingest.lineprotocol.points import Typed
from iox_planner.model import ColumnType
from iox_planner.timeutil import INT64_MAX, INT64_MIN

UINT64_MAX = 2**64 - 1

_FLOAT = ColumnType.FLOAT
_INTEGER = ColumnType.INTEGER
_UNSIGNED = ColumnType.UNSIGNED
_BOOLEAN = ColumnType.BOOLEAN


BOOLS: dict[str, bool] = {
    "t": True, "T": True, "true": True, "True": True, "TRUE": True,
    "f": False, "F": False, "false": False, "False": False, "FALSE": False,
}  # fmt: skip

# float() alone is too lenient (surrounding whitespace, "inf", "nan", a leading '+', non-ASCII digits): a token
# made only of these characters, not starting with '+', that float() accepts is exactly Go's decimal float
# without underscores. Anything else is checked against the whole of Go's float grammar below.
FLOAT_CHARS = "0123456789.eE+-"
_DIGITS = r"[0-9](?:_?[0-9])*"
_HEX = r"[0-9a-fA-F]"
_GO_DECIMAL = re.compile(rf"-?(?:{_DIGITS}(?:\.(?:{_DIGITS})?)?|\.{_DIGITS})(?:[eE][+-]?{_DIGITS})?")
# After the 0x prefix an underscore may come first: Go counts the prefix as a digit. A hex float needs its p.
_GO_HEX = re.compile(rf"-?0[xX](?:(?:_?{_HEX})+(?:\.(?:{_HEX}(?:_?{_HEX})*)?)?|\.{_HEX}(?:_?{_HEX})*)"
                     rf"[pP][+-]?{_DIGITS}")


_VALUE_HELP = (
    "expected a float (1.5, -2, .5, 1e10), an integer (12i), an unsigned integer (12u), "
    'a boolean (t, f, true, false) or a double-quoted string ("text")'
)


_Quote = Callable[[str], str]


def _is_digits(s: str) -> bool:
    # isdigit() alone accepts non-ASCII digits that int() would happily convert.
    return s.isdigit() and s.isascii()


def is_signed_digits(s: str) -> bool:
    return _is_digits(s[1:]) if s[:1] == "-" else _is_digits(s)


def digits_value(digits: str) -> int:
    """The value of optionally signed ASCII digits, already checked. Past 20 significant digits any value is out of
    every 64-bit range, so a huge one is not converted (Python refuses more than 4300 digits, and slowly)."""
    body = digits.lstrip("-").lstrip("0")
    if len(body) > 20:
        return UINT64_MAX + 1 if digits[:1] != "-" else INT64_MIN - 1
    return -int(body or "0") if digits[:1] == "-" else int(body or "0")


def parse_float(tok: str) -> float | None:
    """Go's strconv.ParseFloat over a token that starts like a number; None if it is not one."""
    if not tok.strip(FLOAT_CHARS):
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


def parse_value(tok: str, key: str, pos: int, q: _Quote) -> Typed:
    """A non-string field value token (never empty)."""
    last = tok[-1]
    if last == "i":
        body = tok[:-1]
        if not is_signed_digits(body):
            raise BadLine(pos, f"field {q(key)} has an invalid integer {q(tok)}: expected digits with an optional '-' "
                          "and the suffix i, like 12i or -3i")
        ivalue = digits_value(body)
        if not INT64_MIN <= ivalue <= INT64_MAX:
            raise BadLine(pos, f"field {q(key)} integer {q(tok)} is out of range: integers are signed 64-bit "
                          f"({INT64_MIN}..{INT64_MAX}); use an unsigned (u) or float value for larger numbers")
        return (_INTEGER, ivalue)
    if last == "u":
        body = tok[:-1]
        if not _is_digits(body):
            raise BadLine(pos, f"field {q(key)} has an invalid unsigned integer {q(tok)}: expected digits without a "
                          "sign and the suffix u, like 12u")
        uvalue = digits_value(body)
        if uvalue > UINT64_MAX:
            raise BadLine(pos, f"field {q(key)} unsigned integer {q(tok)} is out of range: unsigned integers are "
                          f"64-bit (0..{UINT64_MAX})")
        return (_UNSIGNED, uvalue)
    flag = BOOLS.get(tok)
    if flag is not None:
        return (_BOOLEAN, flag)
    # As the reference: a number starts with a digit, '-' or '.'; anything else is no known type.
    fvalue = parse_float(tok) if tok[0] in "-.0123456789" else None
    if fvalue is None:
        raise BadLine(pos, f"field {q(key)} has an invalid value {q(tok)}: {_VALUE_HELP}")
    if fvalue - fvalue != 0.0:
        raise BadLine(pos, f"field {q(key)} float {q(tok)} is out of range: floats are 64-bit and must be finite")
    return (_FLOAT, fvalue)
