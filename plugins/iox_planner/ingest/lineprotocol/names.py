"""Names on a line: the rules a measurement, tag key or field key must follow (its length and
`catalog/names.py`'s `name_problem`, so that every name written can be queried), and the schema of the names
seen so far (each a tag or a field of one type), which later lines must agree with."""

from __future__ import annotations

from typing import Mapping

from iox_planner.catalog.names import name_problem
from iox_planner.ingest.lineprotocol.bad_lines import BadLine
from iox_planner.ingest.lineprotocol.limits import Limits, quote, utf8_len
from iox_planner.ingest.lineprotocol.points import Typed
from iox_planner.model import ColumnType

_TAG = ColumnType.TAG


# name -> (type, line that introduced it); line 0 means the caller's existing schema.
Schema = dict[str, dict[str, tuple[ColumnType, int]]]


def _too_long(name: str, limit: int) -> bool:
    # A character is at most 4 bytes: most names are decided without encoding them.
    return len(name) * 4 > limit and (len(name) > limit or utf8_len(name) > limit)


def check_name(kind: str, name: str, pos: int, lim: Limits) -> None:
    """A measurement (`kind` "measurement") or a tag or field key starting at `pos`: within the length limit, and
    a name a query can use (`catalog.names.name_problem`)."""
    if _too_long(name, lim.max_name_bytes):
        what = "measurement" if kind == "measurement" else f"{kind} key"
        raise BadLine(pos, f"{what} {quote(name, lim.excerpt_bytes)} is {utf8_len(name)} bytes long, more than the "
                      f"limit of {lim.max_name_bytes} (IOX_LP_MAX_NAME_BYTES); use a shorter name")
    problem = name_problem(kind, name)
    if problem is not None:
        raise BadLine(pos, problem)


def name_ok(kind: str, name: str, lim: Limits) -> bool:
    """Whether the scanner's `check_name` takes `name`: for the fast paths, which hand anything else to it."""
    return not _too_long(name, lim.max_name_bytes) and name_problem(kind, name) is None


def commit(schema: Schema, measurement: str, tags: Mapping[str, str], fields: Mapping[str, Typed],
           line: int) -> None:
    """Record the names of an accepted line, so that later lines are checked against it."""
    cols = schema.get(measurement)
    if cols is None:
        cols = schema[measurement] = {}
    for key in tags:
        if key not in cols:
            cols[key] = (_TAG, line)
    for key, (kind, _) in fields.items():
        if key not in cols:
            cols[key] = (kind, line)
