"""Bounds on what one line of hostile input may cost (`Limits`, the `IOX_LP_*` variables), and the bounded
excerpt of the input that a message quotes (`quote`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from iox_planner.catalog.names import MAX_NAME_BYTES
from iox_planner.errors import BadInputError


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
                raise BadInputError(f"{var}={quote(text, 32)} is not allowed: it must be a whole number from 1 to "
                                    f"{top}; unset it to use the default ({getattr(cls(), name)})")
            values[name] = int(text)
        return cls(**values)


def quote(text: str, limit: int) -> str:
    """`text` as a quoted excerpt of at most `limit` UTF-8 bytes, so that no message echoes a huge input."""
    if len(text) * 4 > limit:
        raw = text.encode("utf-8", "surrogatepass")
        if len(raw) > limit:
            cut = raw[:limit].decode("utf-8", "ignore")
            return f"{cut!r}... ({len(raw)} bytes)"
    return repr(text)


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))
