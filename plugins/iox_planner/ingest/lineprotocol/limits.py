"""Bounds on what one line of hostile input may cost (`Limits`, the `IOX_LP_*` variables), and the bounded
excerpt of the input that a message quotes (`quote`)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

from iox_planner import config

# Each limit is an environment variable, so an operator with unusual data can raise it without a code change; its
# bounds are the registry's (a name's: the catalog's index bound, catalog/names.py MAX_NAME_BYTES).
_VARIABLES: Mapping[str, config.Whole] = {
    "max_line_bytes": config.LP_MAX_LINE_BYTES,
    "max_columns": config.LP_MAX_COLUMNS,
    "max_name_bytes": config.LP_MAX_NAME_BYTES,
    "max_bad_lines": config.LP_MAX_BAD_LINES,
    "errors_shown": config.LP_ERRORS_SHOWN,
    "excerpt_bytes": config.LP_EXCERPT_BYTES,
}


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds that keep a hostile input from costing more than a bounded amount of time and memory per line.

    `max_line_bytes`: one entry (a line, or the lines a string value spans), in UTF-8 bytes. `max_columns`: tags
    plus fields on one line. `max_name_bytes`: a measurement, tag key or field key. `max_bad_lines`: past this
    many bad lines the input is refused whole without reading further. `errors_shown`: bad lines listed in full
    in an error message (then "and K more"). `excerpt_bytes`: the most of the input one message quotes.
    """

    max_line_bytes: int = config.LP_MAX_LINE_BYTES.default
    max_columns: int = config.LP_MAX_COLUMNS.default
    max_name_bytes: int = config.LP_MAX_NAME_BYTES.default
    max_bad_lines: int = config.LP_MAX_BAD_LINES.default
    errors_shown: int = config.LP_ERRORS_SHOWN.default
    excerpt_bytes: int = config.LP_EXCERPT_BYTES.default

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Limits:
        """The defaults, overridden by the `IOX_LP_*` variables (`_VARIABLES`)."""
        return cls(**{f.name: _VARIABLES[f.name].read(env) for f in fields(cls)})


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
