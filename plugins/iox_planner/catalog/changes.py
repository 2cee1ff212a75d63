"""Reading what changed since a watermark: the watermark text, the window a changes read covers, and where in time
its keys were written.

A **watermark** is an order of one database's counter (`iox_database_order`), handed to the user as opaque text
`W1-<database id>-<order>-<check>`; the check is a digest over this catalog's identity (migration 0008), the
database id and the order, so text that was not issued by this catalog for this database is refused, whatever it
holds. `beginning` stands for order 0 (every key).

A changes read since `W` takes `M`, the database's committed counter, first: every write with an order at or below
`M` has committed (writes into a database commit in the order of their orders, catalog/locks.py), none above it
has. It returns the current deduplicated row of every key whose NEWEST write has an order in `(W, M]` (the rows'
`__write_order`, model.py), and hands on `M` as the next watermark. So each key comes back once per read in which
its newest write falls, with its value as of that read: never missed (a key written after `W` has its newest write
in this window or a later one), never repeated (a later window holds only newer writes). The write log
(`iox_write_event`, catalog/freshness.py) says where in time the window's writes landed, which prunes the chunks
to read; the rows' write orders make the exact cut.

A watermark is refused when the catalog cannot answer it exactly: one ahead of the database's counter (not issued
by it), one of another database or catalog, one inside a gap (`iox_changes_gap`: orders of files persisted before
per-row write orders existed; a scenario load that gave its chunks orders below the counter), and, for a table the
query reads, one from before the table was dropped (a changes read reports new and rewritten rows, never removed
ones).
"""

from __future__ import annotations

import hashlib
import re

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.engine import Connection

from iox_planner.catalog.freshness import committed_order
from iox_planner.catalog.names import excerpt
from iox_planner.catalog.schema import catalog_identity, changes_gaps, table_drops, write_events
from iox_planner.errors import BadInputError, CatalogError
from iox_planner.model import MAX_ORDER, ChangeWindow, merge_ranges
from iox_planner.timeutil import INT64_MAX, INT64_MIN

BEGINNING = "beginning"
MAX_WATERMARK_CHARS = 64
_WATERMARK = re.compile(r"W1-([1-9][0-9]{0,17})-(0|[1-9][0-9]{0,9})-([0-9a-f]{16})")
MAX_EXACT_EVENTS = 10_000
"""Write events fetched one by one for a read's ranges; beyond this many a table's ranges are its partitions' spans
(a wider prune: the rows' write orders still make the exact cut)."""


def _catalog_id(conn: Connection) -> str:
    return str(conn.execute(sa.select(catalog_identity.c.catalog_id)).scalar_one())


def _check(catalog_id: str, db_id: int, order: int) -> str:
    return hashlib.sha256(f"iox-batch watermark\0{catalog_id}\0{db_id}\0{order}".encode()).hexdigest()[:16]


def watermark(conn: Connection, db_id: int, order: int) -> str:
    """The opaque text of `order` of database `db_id`."""
    return f"W1-{db_id}-{order}-{_check(_catalog_id(conn), db_id, order)}"


_ADVICE = ("pass the watermark a changes read of this database printed, or `beginning` to read every key (a full "
           "read, which prints the watermark to continue from)")


def read_watermark(text: str) -> tuple[int, int, str] | None:
    """The parts of watermark text (database id, order, check), None for `beginning`, taken exactly (no spaces
    around it, no other case), or a one-paragraph error: the shape alone, which a request checks before any
    catalog is open."""
    match = _WATERMARK.fullmatch(text) if isinstance(text, str) and len(text) <= MAX_WATERMARK_CHARS else None
    if match is None:
        if text == BEGINNING:
            return None
        raise BadInputError(f"--changes-since: {excerpt(text)} is not a watermark; {_ADVICE}")
    return int(match[1]), int(match[2]), match[3]


def parse_watermark(conn: Connection, text: str, db_id: int, db: str) -> int:
    """The order a watermark stands for, or a one-paragraph error: `beginning` is 0; anything else must be a
    watermark this catalog issued for this database."""
    advice = _ADVICE
    parts = read_watermark(text)
    if parts is None:
        return 0
    issued_db, order, check = parts
    if check != _check(_catalog_id(conn), issued_db, order):
        raise BadInputError(f"--changes-since: {excerpt(text)} was not issued by this catalog (its check does not "
                            f"match); {advice}")
    if issued_db != db_id:
        raise BadInputError(f"--changes-since: {excerpt(text)} was issued for another database (or for an earlier "
                            f"database {db!r}, since dropped), not for {db!r}; {advice}")
    return order


def change_window(conn: Connection, db_id: int, db: str, since_text: str) -> ChangeWindow:
    """The window of a changes read since `since_text` (validated), up to the database's committed counter now."""
    since = parse_watermark(conn, since_text, db_id, db)
    until = committed_order(conn, db_id)
    if since > until:
        raise BadInputError(f"--changes-since: the watermark stands for order {since}, ahead of database {db!r}'s "
                            f"writes (order {until}); it was not issued for this database as it is now")
    if since > 0:
        gap = conn.execute(sa.select(changes_gaps.c.reason, changes_gaps.c.from_order, changes_gaps.c.to_order)
                           .where(changes_gaps.c.database_id == db_id, changes_gaps.c.from_order <= since,
                                  changes_gaps.c.to_order > since)
                           .order_by(changes_gaps.c.to_order.desc()).limit(1)).first()
        if gap is not None:
            why = ("files persisted before iox-batch kept each row's write order (catalog migration 0008) hold "
                   "writes up to order " + str(gap.to_order) if gap.reason == "upgrade" else
                   f"a scenario load wrote chunks with explicit orders from {gap.from_order}, below this "
                   f"watermark, at order {gap.to_order}")
            raise CatalogError(f"--changes-since: the catalog cannot tell exactly what changed in database {db!r} "
                               f"since this watermark (order {since}): {why}. Read every key once with "
                               "--changes-since beginning and continue from the watermark it prints")
    return ChangeWindow(since, until, watermark(conn, db_id, until))


def check_not_dropped(conn: Connection, db_id: int, db: str, table: str, window: ChangeWindow) -> None:
    """A table dropped inside the window: its rows from before the drop are gone, which a changes read cannot
    report (it returns rows, never removals)."""
    dropped = conn.execute(sa.select(sa.func.max(table_drops.c.drop_order)).where(
        table_drops.c.database_id == db_id, table_drops.c.table_name == table,
        table_drops.c.drop_order > window.since, table_drops.c.drop_order <= window.until)).scalar_one()
    if dropped is not None:
        raise CatalogError(f"table {excerpt(table)} of database {db!r} was dropped after this watermark (at order "
                           f"{dropped}); a changes read returns new and rewritten rows, never removed ones, so "
                           "its earlier rows cannot be reported gone. Read it in full with --changes-since "
                           "beginning and continue from the watermark that prints")


def written_ranges(conn: Connection, db_id: int, table: str, window: ChangeWindow) -> list[tuple[int, int]]:
    """Inclusive time ranges holding every key of `table` written with an order in the window: the write log's
    events there, merged (every path that adds data logs one per table and day it touched). A read since the
    beginning takes everything (data written before the log existed has no events)."""
    if window.since == 0:
        return [(INT64_MIN, INT64_MAX)]
    where = (write_events.c.database_id == db_id, write_events.c.table_name == table,
             write_events.c.write_order > window.since, write_events.c.write_order <= window.until)
    rows = conn.execute(sa.select(write_events.c.min_time, write_events.c.max_time).where(*where)
                        .limit(MAX_EXACT_EVENTS + 1)).all()
    if len(rows) > MAX_EXACT_EVENTS:
        rows = conn.execute(sa.select(sa.func.min(write_events.c.min_time), sa.func.max(write_events.c.max_time))
                            .where(*where).group_by(write_events.c.partition_key)).all()
    return merge_ranges([(int(r[0]), int(r[1])) for r in rows])


def record_gap(conn: Connection, db_id: int, from_order: int, to_order: int, reason: str) -> None:
    """Inside the transaction that made it: watermarks in `[from_order, to_order)` can no longer be answered."""
    if not 0 < from_order < to_order <= MAX_ORDER:
        return
    conn.execute(pg.insert(changes_gaps).values(database_id=db_id, from_order=from_order, to_order=to_order,
                                                reason=reason))
