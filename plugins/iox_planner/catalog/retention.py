"""A database's retention period: reading it from the catalog, setting it, and which partitions it has expired.

Retention follows IOx: with a period `r`, a query planned at `now` returns only rows with `time > now - r`
(`cutoff`), so a row exactly at the cutoff is gone and one a nanosecond later is not. A partition (a UTC day) whose
last nanosecond is at or before the cutoff holds no row a query may return: maintenance retires its chunks
(`maintenance/sweeps.py` `expire_partitions`), and their files go after the grace period like any retired file.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.engine import Connection

from iox_planner.catalog.names import check_db_name
from iox_planner.catalog.schema import database_orders, databases, partitions, tables
from iox_planner.errors import BadInputError, CatalogError
from iox_planner.timeutil import DURATION_UNITS, NS_PER_DAY, format_duration, parse_duration, partition_of

MIN_RETENTION_NS = DURATION_UNITS["h"]
"""The shortest retention: an hour, as InfluxDB's own lower bound (a shorter one would retire data as it lands)."""
MAX_RETENTION_NS = 36_500 * NS_PER_DAY
"""The longest: a hundred years (nanoseconds since the epoch stay within an int64 for 292 years)."""
NONE = "none"


def parse_retention(text: str) -> int | None:
    """`none` (keep everything) or a duration from an hour to a hundred years, as nanoseconds; taken exactly
    (`None`, ` 30d` and an empty value are refused, not read as something near them)."""
    if text == NONE:
        return None
    if not isinstance(text, str) or not text:
        raise BadInputError(f"--retention {text!r} is empty; give a duration from 1h to 36500d (s, m, h, d, w, as "
                            "in 30d), or none to keep data forever")
    value = parse_duration(text, what="--retention")
    if not MIN_RETENTION_NS <= value <= MAX_RETENTION_NS:
        raise BadInputError(f"--retention {text!r} is out of range; give from 1h to 36500d, or none to keep "
                            "data forever")
    return value


def describe_retention(retention_ns: int | None) -> str:
    return NONE if retention_ns is None else format_duration(retention_ns)


def cutoff(retention_ns: int | None, now_ns: int) -> int | None:
    """The last excluded nanosecond: rows with `time <= cutoff` are past the retention (None: nothing is)."""
    return None if retention_ns is None else now_ns - retention_ns


def retention_of(conn: Connection, db_id: int) -> int | None:
    value = conn.execute(sa.select(databases.c.retention_ns).where(databases.c.id == db_id)).scalar_one_or_none()
    return None if value is None else int(value)


@dataclass(frozen=True)
class RetentionChange:
    db: str
    created: bool
    before: int | None
    after: int | None


def create_database(conn: Connection, name: str, retention_ns: int | None) -> RetentionChange:
    """`iox-batch database create`: a new, empty database; an existing name is an error (use `update`)."""
    check_db_name(name)
    db_id = conn.execute(pg.insert(databases).values(name=name, retention_ns=retention_ns)
                         .on_conflict_do_nothing(index_elements=["name"]).returning(databases.c.id)).scalar_one_or_none()
    if db_id is None:
        raise CatalogError(f"database {name!r} already exists; change its retention with `iox-batch database update "
                           f"{name} --retention ...`")
    conn.execute(pg.insert(database_orders).values(database_id=db_id, last_order=0)
                 .on_conflict_do_nothing(index_elements=["database_id"]))
    return RetentionChange(name, True, None, retention_ns)


def set_retention(conn: Connection, db_id: int, name: str, retention_ns: int | None) -> RetentionChange:
    """`iox-batch database update`: a new retention for an existing database (one a write created included).
    Shortening it hides older rows from the next query on; lengthening it brings back rows maintenance has not
    retired yet (a retired partition's rows are gone for good once the grace period ends)."""
    before = conn.execute(sa.select(databases.c.retention_ns).where(databases.c.id == db_id)
                          .with_for_update()).scalar_one()
    conn.execute(databases.update().where(databases.c.id == db_id).values(retention_ns=retention_ns))
    return RetentionChange(name, False, None if before is None else int(before), retention_ns)


@dataclass(frozen=True)
class ExpiredPartition:
    partition_id: int
    table: str
    partition: str


def expired_partitions(conn: Connection, db_id: int, cut: int) -> list[ExpiredPartition]:
    """The partitions of live tables whose whole day lies at or before `cut` (and so holds no row a query may
    return), in id order. Day keys are zero-padded ISO dates (the catalog checks them), so they compare as text."""
    last_expired_day = partition_of(cut - NS_PER_DAY + 1)  # the latest day whose last nanosecond is <= cut
    rows = conn.execute(
        sa.select(partitions.c.id, tables.c.name, partitions.c.partition_key)
        .join_from(partitions, tables, partitions.c.table_id == tables.c.id)
        .where(tables.c.database_id == db_id, tables.c.dropped_at.is_(None),
               partitions.c.partition_key <= last_expired_day)
        .order_by(partitions.c.id))
    return [ExpiredPartition(int(r.id), r.name, r.partition_key) for r in rows]
