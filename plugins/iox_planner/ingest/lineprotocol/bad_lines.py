"""Bad lines: `BadLine`, raised where a line goes wrong with its position, and `LineError`, the bad line
reported by line and column, listed within bounds by `describe_errors`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from iox_planner.ingest.lineprotocol.limits import Limits


class BadLine(Exception):
    """A bad line: 0-based position of the offending character and the message; `offset` is how many lines
    after the entry's first the position is (a string value may span lines), `skip` how many lines the bad entry
    took beyond its first."""

    def __init__(self, pos: int, message: str, offset: int = 0, skip: int | None = None) -> None:
        super().__init__(message)
        self.pos = pos
        self.message = message
        self.offset = offset
        self.skip = offset if skip is None else skip


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
