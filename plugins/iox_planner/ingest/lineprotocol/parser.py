"""InfluxDB line protocol, parsed into points with every bad line reported by line and column.

`measurement[,tag=value...] field=value[,field=value...] [timestamp]`, one point a line. The parser never raises
for a bad line: it collects a `LineError` per bad line and keeps going, so one run reports every problem (up to
`Limits.max_bad_lines`, past which the input is refused whole). `ParseResult.raise_for_errors()` turns them into a
single `BadInputError` for callers that want all or nothing.

Two paths share one grammar. Most lines (no backslash, no double quote, single spaces) take a split-based fast
path (`fast_path.py`); anything it does not like, including every error, is handed to the character scanner
(`scanner.py`, which states the grammar), the one source of error messages and columns. So the fast path only has
to be right about what it accepts.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Mapping

from iox_planner.errors import BadInputError
from iox_planner.ingest.lineprotocol.bad_lines import LineError, describe_errors
from iox_planner.ingest.lineprotocol.decoding import check_text, decode_utf8, skip_bom
from iox_planner.ingest.lineprotocol.fast_path import HEAD_CACHE_LIMIT, Head, fast_line
from iox_planner.ingest.lineprotocol.limits import Limits
from iox_planner.ingest.lineprotocol.names import Schema
from iox_planner.ingest.lineprotocol.points import Point
from iox_planner.ingest.lineprotocol.precision import Precision
from iox_planner.ingest.lineprotocol.scanner import NeedMore, slow_line
from iox_planner.model import ColumnType
from iox_planner.timeutil import TIME_MAX, TIME_MIN, TIME_RANGE


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
            raise BadInputError(f"precision {precision!r} is not one of {', '.join(Precision.choices())}") from None
        if not TIME_MIN <= default_time <= TIME_MAX:
            raise BadInputError(f"default time {default_time} is outside the times data may have ({TIME_RANGE})")
        self.limits = Limits.from_env() if limits is None else limits
        self.default_time = default_time - default_time % self.precision.multiplier
        self.schema: Schema = {}
        for table, columns in (existing or {}).items():
            self.schema[table] = {name: (kind, 0) for name, kind in columns.items() if kind is not ColumnType.TIME}
        self.heads: dict[str, Head] = {}
        self.names: dict[str, str] = {}
        self.errors: list[LineError] = []
        self.vector_heads: dict[str, tuple[str, dict[str, str]]] = {}
        """Heads the vectorized path (`vectorized.py`) already checked, by text."""
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

    @property
    def pending(self) -> bool:
        """Whether an entry that ran past the last block is kept back, to be parsed with the next block."""
        return bool(self._carry)


def _parse_lines(lines: list[str], base: int, more: bool, parser: StreamParser) -> tuple[list[Point], int]:
    """The points of `lines`, numbered from `base + 1`, and how many lines were used (fewer than all when an entry
    runs past the end and `more` input follows). Errors go to `parser.errors`."""
    precision, default_time, schema, lim = parser.precision, parser.default_time, parser.schema, parser.limits
    multiplier = precision.multiplier
    heads = parser.heads
    if len(heads) >= HEAD_CACHE_LIMIT:
        heads.clear()
    names = parser.names
    if len(names) >= HEAD_CACHE_LIMIT:
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
                point = fast_line(line[:-1] if line[-1] == "\r" else line, base + lineno, multiplier, default_time,
                                  heads, intern, schema, lim)
                if point is not None:
                    points.append(point)
                    continue
        try:
            point, problem, skip = slow_line(lines, lineno, precision, default_time, schema, lim, base, more)
        except NeedMore:
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
