"""The allow-lists for names users pass (databases, tables, columns, parameters) and how a bad one is quoted back.

A table or column name is any text a query can name as a backquoted identifier (`` `sys.cpu` ``, a backtick
inside doubled): dots, dashes, spaces, quotes, backticks, SQL keywords, any case and any script. `name_problem`
says what is refused instead: a name no query could type or see as written, and the names iox-batch reserves.

Kept apart from store.py so that code which only checks names (the DAG files at parse time) does not import
SQLAlchemy."""

from __future__ import annotations

import re

from iox_planner.errors import BadInputError
from iox_planner.model import DB_NAME, TIME

UNPRINTABLE_CHARS = "\x00-\x1f\x7f-\x9f\u2028\u2029\ufeff\ud800-\udfff"
"""A regex character class of what no name (nor a tag value) holds: control characters (C0, DEL and C1, the
terminal's escape sequences among them), the line and paragraph separators (a name is one line), U+FEFF (a byte
order mark, skipped at the start of an input and a trap anywhere else: an invisible character that makes `cpu`
another table) and lone surrogates (no UTF-8 encodes them; only a YAML escape or a Python caller can make one)."""
UNPRINTABLE = re.compile(f"[{UNPRINTABLE_CHARS}]")

MAX_NAME_BYTES = 2048
"""The longest table or column name, in UTF-8 bytes: names are keys of the catalog's unique indexes, whose Postgres
entries hold at most 2704 bytes, so a longer name would fail at the commit of a write (line protocol's own limit,
`IOX_LP_MAX_NAME_BYTES`, is 256 by default and may be raised up to this)."""

RESERVED_PREFIX = "__"
"""Names starting so belong to iox-batch: its internal columns (`__time_ns`, `__chunk_order`, `__seq`) and the
views and helpers the planner adds (`__iox_...`), which no query may name."""

_CHAR_NAMES = {"\t": "a tab", "\n": "a newline", "\r": "a carriage return", "\x00": "a NUL byte",
               "\ufeff": "a byte order mark (U+FEFF)", "\u2028": "a line separator (U+2028)",
               "\u2029": "a paragraph separator (U+2029)"}


def excerpt(value: object, limit: int = 40) -> str:
    """A user's value for an error message: repr'd (control characters visible), cut to `limit` characters."""
    text = repr(value) if isinstance(value, str) else repr(str(value))
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def describe_char(c: str) -> str:
    """An unprintable character as a message names it."""
    if c in _CHAR_NAMES:
        return _CHAR_NAMES[c]
    if "\ud800" <= c <= "\udfff":
        return f"a lone surrogate U+{ord(c):04X}"
    return f"the control character U+{ord(c):04X}"


def name_problem(kind: str, name: str) -> str | None:
    """Why `name` cannot be a measurement (`kind` "measurement": a table) or a tag or field key ("tag", "field":
    a column), or None if it can. Refused: empty, longer than `MAX_NAME_BYTES`, an unprintable character
    (`UNPRINTABLE`), a measurement of whitespace only (a query's FROM cannot name it; a column can be: `` ` ` ``),
    `RESERVED_PREFIX`, and a tag or field named `time` (the timestamp's column). Every other name can be queried
    as a backquoted identifier."""
    what = "measurement name" if kind == "measurement" else f"{kind} key"
    if not name:
        return f"empty {what}"
    if len(name) * 4 > MAX_NAME_BYTES and len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"{what} {excerpt(name)} is longer than {MAX_NAME_BYTES} bytes, the most the catalog can hold"
    bad = UNPRINTABLE.search(name)
    if bad is not None:
        return (f"{describe_char(bad.group())} is not allowed in the {what} {excerpt(name)}: names hold printable "
                "characters only")
    if kind == "measurement" and not name.strip():
        return f"{what} {excerpt(name)} is only whitespace, which no query can name as a table; use a visible name"
    if kind != "measurement" and name == TIME:
        return f"{what} 'time' is reserved for the timestamp; rename the {kind}"
    if name.startswith(RESERVED_PREFIX):
        return (f"{what} {excerpt(name)} starts with '{RESERVED_PREFIX}', which is reserved for iox-batch's internal "
                f"columns and views; rename the {'measurement' if kind == 'measurement' else kind}")
    return None


def check_name(name: object, what: str) -> str:
    """Any name a user passes (table, parameter...): a non-empty string without control or other unprintable
    characters (`UNPRINTABLE`)."""
    if not isinstance(name, str) or not name:
        raise BadInputError(f"{what} must be a non-empty name")
    bad = UNPRINTABLE.search(name)
    if bad is not None:
        raise BadInputError(f"{what} {excerpt(name)} holds {describe_char(bad.group())}, a control character or "
                            "another unprintable one; names are printable text: remove it")
    return name


def check_db_name(name: str) -> str:
    if not isinstance(name, str) or not DB_NAME.fullmatch(name):
        raise BadInputError(
            f"database name {excerpt(name)} is not allowed; use 1 to 64 letters, digits, '_' or '-'"
        )
    return name
