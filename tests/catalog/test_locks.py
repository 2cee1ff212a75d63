"""The catalog's locks (`catalog/locks.py`) on the real Postgres: one holder per key, the one bigint key form as
`pg_locks` shows it, and keys of different kinds kept apart."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from iox_planner.catalog import locks
from iox_planner.catalog.store import Catalog


def test_the_compaction_lock_is_held_by_one_session_at_a_time(catalog: Catalog) -> None:
    key = locks.compaction_key(987_654_321)
    with catalog.engine.connect() as one, catalog.engine.connect() as two:
        assert locks.try_lock(one, key)
        assert not locks.try_lock(two, key)
        locks.unlock(one, key)
        assert locks.try_lock(two, key)
        locks.unlock(two, key)


def test_a_held_lock_is_seen_in_pg_locks_by_its_own_session_only(catalog: Catalog) -> None:
    key = locks.bulk_load_key(uuid.uuid4().hex)
    with catalog.engine.connect() as holder, catalog.engine.connect() as other:
        session = locks.backend_pid(holder)
        assert not locks.holds(holder, key)
        locks.lock(holder, key)
        # What Postgres itself records, read without the module's decoding: one bigint key, high and low halves.
        seen = holder.execute(sa.text(
            "SELECT classid::bigint * 4294967296 + objid::bigint AS key, objsubid FROM pg_locks "
            "WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()")).all()
        assert [(r.key, r.objsubid) for r in seen] == [(key, 1)]
        assert locks.holds(holder, key) and locks.still_held(holder, session, key)
        assert not locks.holds(other, key) and not locks.still_held(other, session, key)
        assert not locks.still_held(holder, session + 1, key)  # another session (a reconnect) never holds it
        locks.unlock(holder, key)
        assert not locks.holds(holder, key)
        holder.commit()


def test_keys_of_different_kinds_never_meet() -> None:
    lowest_load, highest_load = locks.bulk_load_key("0" * 32), locks.bulk_load_key("f" * 32)
    assert locks.MIGRATION_LOCK < lowest_load < highest_load < locks.compaction_key(0)
    assert highest_load - lowest_load == 2**48 - 1
    assert locks.compaction_key(2**48) < 2**63  # a bigint, with room far beyond any partition id
