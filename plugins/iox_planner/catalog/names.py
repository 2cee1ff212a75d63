"""The allow-lists for names users pass (databases, tables, parameters) and how a bad one is quoted back.

Kept apart from store.py so that code which only checks names (the DAG files at parse time) does not import
SQLAlchemy."""

from __future__ import annotations

import re

from iox_planner.errors import BadInputError

DB_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # always with fullmatch: `$` would let a trailing newline through


def excerpt(value: object, limit: int = 40) -> str:
    """A user's value for an error message: repr'd (control characters visible), cut to `limit` characters."""
    text = repr(value) if isinstance(value, str) else repr(str(value))
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def check_name(name: object, what: str) -> str:
    """Any name a user passes (table, parameter...): a non-empty string without NUL or control characters."""
    if not isinstance(name, str) or not name:
        raise BadInputError(f"{what} must be a non-empty name")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        raise BadInputError(f"{what} {excerpt(name)} holds a control character (a newline, NUL, tab...); names "
                            "are printable text: remove it")
    return name


def check_db_name(name: str) -> str:
    if not isinstance(name, str) or not DB_NAME.fullmatch(name):
        raise BadInputError(
            f"database name {excerpt(name)} is not allowed; use 1 to 64 letters, digits, '_' or '-'"
        )
    return name
