"""Limits on the SQL a user sends, checked before anything expensive runs on it.

The SQL front end (sqlglot) parses by recursive descent, so nesting costs Python stack, and its scope analysis
walks from each column to its ancestors, so a deep expression costs time with the square of its size. Every limit
here fails fast with an error naming it and the variable that raises it.
"""

from __future__ import annotations

from dataclasses import dataclass

from iox_planner import config
from iox_planner.errors import BadInputError, BadQueryError
from iox_planner.userfiles import open_regular


@dataclass(frozen=True)
class SqlLimits:
    max_bytes: int = config.MAX_SQL_BYTES.default
    """The SQL text's size in UTF-8 bytes (`IOX_MAX_SQL_BYTES`)."""
    max_depth: int = config.MAX_SQL_DEPTH.default
    """How deep parentheses, brackets and CASE ... END may nest (`IOX_MAX_SQL_DEPTH`): the parser recurses about
    25 Python frames per level."""
    max_nodes: int = config.MAX_SQL_NODES.default
    """Syntax-tree nodes of the parsed query (`IOX_MAX_SQL_NODES`)."""
    max_list: int = config.MAX_SQL_LIST.default
    """Rows of one VALUES list and values of one IN list (`IOX_MAX_SQL_LIST`): analysis and Spark's planning cost
    grow faster than their length (200,000 VALUES rows took 37 s and 1 GB to plan)."""
    max_alloc: int = config.MAX_SQL_ALLOC.default
    """What one call may build where its size is a constant of the query (`IOX_MAX_SQL_ALLOC`): the count of
    `repeat`, `array_repeat` and `sequence`, the width of `space`, `lpad`, `rpad` and of format specifiers, the
    cells of a sketch (`sizing.py`); and, with a guard, such a size computed from the data."""
    max_partitions: int = config.MAX_HINT_PARTITIONS.default
    """The partitions a hint may ask for (`IOX_MAX_HINT_PARTITIONS`)."""

    @staticmethod
    def from_env() -> SqlLimits:
        return SqlLimits(config.MAX_SQL_BYTES.read(), config.MAX_SQL_DEPTH.read(), config.MAX_SQL_NODES.read(),
                         config.MAX_SQL_LIST.read(), config.MAX_SQL_ALLOC.read(), config.MAX_HINT_PARTITIONS.read())


def check_size(sql: str, limits: SqlLimits) -> None:
    size = len(sql.encode("utf-8"))
    if size > limits.max_bytes:
        raise BadQueryError(f"the SQL is {size:,} bytes, over the limit of {limits.max_bytes:,}; shorten it (an "
                            "IN list or a parameter instead of many ORs) or raise IOX_MAX_SQL_BYTES")


def depth_error(depth: int, limits: SqlLimits) -> BadQueryError:
    return BadQueryError(f"the SQL nests {depth} levels deep (parentheses, brackets, CASE or subqueries), over the "
                         f"limit of {limits.max_depth}; flatten it or raise IOX_MAX_SQL_DEPTH")


def nodes_error(nodes: int, limits: SqlLimits) -> BadQueryError:
    return BadQueryError(f"the SQL has over {nodes:,} syntax nodes, over the limit of {limits.max_nodes:,}; shorten "
                         "it or raise IOX_MAX_SQL_NODES")


def values_error(what: str, length: int, limits: SqlLimits) -> BadQueryError:
    return BadQueryError(f"the SQL has a {what} list of {length:,} values, over the limit of {limits.max_list:,}; "
                         "put the values in a table (iox-batch write) and join it, or raise IOX_MAX_SQL_LIST")


def alloc_error(call: str, size: float, limits: SqlLimits, what: str = "characters or elements") -> BadQueryError:
    return BadQueryError(f"{call} would build {size:,.0f} {what} in one value, over the limit of "
                         f"{limits.max_alloc:,}; use a smaller constant or raise IOX_MAX_SQL_ALLOC")


def partitions_error(hint: str, count: int, limits: SqlLimits) -> BadQueryError:
    return BadQueryError(f"the hint {hint[:40]}({count}) asks for {count:,} partitions, over the limit of "
                         f"{limits.max_partitions:,} (each is a task on the shared Spark server); ask for fewer or "
                         "raise IOX_MAX_HINT_PARTITIONS")


def read_sql_file(path: str, limits: SqlLimits | None = None) -> str:
    """The SQL of `--sql-file PATH|-`: at most the size limit (never more is read), strict UTF-8."""
    import sys

    limits = limits or SqlLimits.from_env()
    name = "standard input" if path == "-" else repr(path)
    try:
        if path == "-":
            data = sys.stdin.buffer.read(limits.max_bytes + 1)
        else:
            with open_regular(path, f"the SQL file {name}", hint="; give a regular file or - for standard input") \
                    as handle:
                data = handle.read(limits.max_bytes + 1)
    except OSError as err:
        raise BadInputError(f"cannot read the SQL file {name}: {err.strerror or err}; give a readable file or - "
                            "for standard input") from err
    if len(data) > limits.max_bytes:
        raise BadQueryError(f"the SQL in {name} is over the limit of {limits.max_bytes:,} bytes; shorten it or "
                            "raise IOX_MAX_SQL_BYTES")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadInputError(f"the SQL in {name} is not valid UTF-8 (byte 0x{data[err.start]:02x} at offset "
                            f"{err.start}); save it as UTF-8") from err
    if text.startswith("\ufeff"):  # a byte-order mark some editors write: not part of the query
        text = text[1:]
    return text
