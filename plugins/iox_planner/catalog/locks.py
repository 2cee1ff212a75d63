"""Every lock taken on the catalog: the advisory lock ids and their one key form, the row locks, and the
`pg_locks` check that a session still holds its lock. Callers name what they lock (a partition, a load);
the keys and the SQL are here only.

Advisory locks take ONE bigint key each: the kind's base plus the id of what is locked, the bases far enough
apart that no two kinds share a key (ids stay far below 2^48).

| kind       | key                                        | scope       | taken by                                    |
| ---------- | ------------------------------------------ | ----------- | ------------------------------------------- |
| migration  | `MIGRATION_LOCK`                           | transaction | `Catalog.migrate`: one migrator at a time   |
| compaction | `COMPACTION_LOCK + partition id`           | session     | a compaction (plan, Spark job, swap); the   |
|            |                                            |             | sweep of compaction strays                  |
| bulk load  | `BULK_LOAD_LOCK + first 48 bits of its id` | session     | a bulk load's driver; the dead-load sweep   |

A session lock spans several transactions and goes with its session: Postgres drops it when the holder's
connection dies, so a killed holder never leaves it held, and a holder that must know it still holds it (before
a COMMIT that relies on it) asks `still_held`.

Row locks are the rows themselves: a partition's row (`lock_partition`: persists, a compaction's swap, Parquet
writes and registrations of the partition, one at a time; plain writes go on) and a database's order row
(`lock_orders`: every write into the database, from before its first insert to its commit; `try_lock_orders`:
the sweep of unreferenced files, which skips a database with a write in flight).

The run locks of materialized intervals are not locks of this kind: rows with a holder and an expiry, taken over
by the run lifecycle's rules (`catalog/runs.py`). A table drop freezes them for its transaction
(`freeze_run_locks`: none is taken, taken over or released meanwhile) to see every run that registers into the
table.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from iox_planner.catalog.schema import database_orders, partitions

MIGRATION_LOCK = 0x10C5_BA7C
COMPACTION_LOCK = 0x1C0_0000_0000_0000
BULK_LOAD_LOCK = 0x1B0_0000_0000_0000


def compaction_key(partition_id: int) -> int:
    """The compaction lock of one partition."""
    return COMPACTION_LOCK + partition_id


def bulk_load_key(load_id: str) -> int:
    """The lock of one bulk load, by its id (32 hex digits): 48 of its random bits, below the compaction keys."""
    return BULK_LOAD_LOCK + int(load_id[:12], 16)


# --- advisory locks -----------------------------------------------------------------------------------------------


def lock_migrations(conn: Connection) -> None:
    """Wait for the migration lock, held until `conn`'s transaction ends."""
    conn.execute(sa.select(sa.func.pg_advisory_xact_lock(MIGRATION_LOCK)))


def try_lock(conn: Connection, key: int) -> bool:
    """Take the session lock `key` for the session of `conn`, or return False at once if another session holds
    it."""
    return bool(conn.execute(sa.select(sa.func.pg_try_advisory_lock(key))).scalar())


def lock(conn: Connection, key: int) -> None:
    """Wait for the session lock `key`."""
    conn.execute(sa.select(sa.func.pg_advisory_lock(key)))


def unlock(conn: Connection, key: int) -> None:
    conn.execute(sa.select(sa.func.pg_advisory_unlock(key)))


def backend_pid(conn: Connection) -> int:
    """The Postgres backend (session) serving `conn`: a connection that dropped and reconnected has another."""
    return int(conn.execute(sa.select(sa.func.pg_backend_pid())).scalar_one())


def holds(conn: Connection, key: int) -> bool:
    """Whether the session of `conn` holds the session lock `key` now. Postgres shows a bigint key as its high
    half in `classid` and its low half in `objid`, with `objsubid` 1."""
    return conn.execute(sa.text(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
        "AND pid = pg_backend_pid() AND classid::bigint = :hi AND objid::bigint = :lo AND objsubid = 1)"
    ).bindparams(hi=key >> 32, lo=key & 0xFFFF_FFFF)).scalar_one() is True


def still_held(conn: Connection, session: int, key: int) -> bool:
    """Whether `conn` is still served by `session` (the backend that took the lock) and that session still holds
    `key`: a dropped connection that reconnected has another session, without the lock."""
    return backend_pid(conn) == session and holds(conn, key)


# --- row locks ----------------------------------------------------------------------------------------------------


def lock_partition(conn: Connection, partition_id: int) -> tuple[str, ...] | None:
    """Lock a partition row against other persists (writes, which only take KEY SHARE, go on) and return
    its sort key."""
    # key_share=True renders FOR NO KEY UPDATE: it conflicts with another persist's lock, not with the KEY SHARE
    # lock a concurrent write's foreign key check takes.
    row = conn.execute(sa.select(partitions.c.sort_key).where(partitions.c.id == partition_id)
                       .with_for_update(key_share=True)).one()
    return tuple(row.sort_key) if row.sort_key is not None else None


def lock_orders(conn: Connection, db_id: int) -> None:
    """Take the database's order lock now, before a write inserts tables, columns or partitions: a write that
    took it only when it reached `next_orders` could wait for another write's uncommitted row while holding
    it (a deadlock). Writes into one database serialize from here to their commit."""
    conn.execute(sa.select(database_orders.c.last_order)
                 .where(database_orders.c.database_id == db_id).with_for_update())


def try_lock_orders(conn: Connection, db_id: int) -> bool:
    """Take the database's order lock unless a write holds it (then False at once, as for a database with no
    order row): no write into the database is in flight while it is held."""
    return conn.execute(sa.select(database_orders.c.database_id).where(database_orders.c.database_id == db_id)
                        .with_for_update(skip_locked=True)).first() is not None


def freeze_run_locks(conn: Connection) -> None:
    """Until `conn`'s transaction ends, no run lock is taken, taken over or released (a SHARE lock on the run lock
    table: writers of its rows wait, readers and `check_lock`'s FOR UPDATE do not), and every one taken before is
    committed and visible. Held briefly, by a table drop only."""
    conn.execute(sa.text("LOCK TABLE iox_run_lock IN SHARE MODE"))
