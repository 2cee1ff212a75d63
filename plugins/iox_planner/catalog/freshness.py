"""Which materialized intervals are stale: the write log, drop markers, and what each interval's run read.

- **Write events** (`iox_write_event`): every path that adds NEW data (a write, a scenario load, a `register_as`
  registration) logs one row per (table, partition) in its own transaction, with an order taken from the database's
  counter in that transaction. Persist and compaction never log: they move data without changing it, and judging
  from live chunks would flag intervals after a persist (a persisted file takes the highest order of its inputs and
  the union of their time ranges).
- **Reads** (`iox_materialized_read`): per table an interval's run read, the database's committed order counter
  taken in the same snapshot as the plan's chunk list (`CatalogSource` records it). A write that took its order but
  had not committed holds the counter's row lock, and its order is above the committed value the snapshot shows;
  a write committed before the snapshot has an order at or below it and its chunks are in the list. So
  "event order > watermark" is exactly "the run did not see this write".
- An interval is **stale** iff a write event of a table it read has an order above its watermark and a time range
  overlapping the interval, or a database it read was dropped, or a table it read was dropped after its run read
  it (a table drop marker, catalog/drops.py, has an order above its watermark). Retention expiry logs nothing:
  data that ages out makes no interval stale. `stale_reads` finds them for one definition in one
  indexed query.

Imports neither Airflow nor Spark.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.engine import Connection

from iox_planner.catalog.schema import (
    database_drops,
    database_orders,
    materialized_reads,
    query_runs,
    write_events,
    write_hours,
)
from iox_planner.model import MAX_ORDER

SOURCES = frozenset({"write", "load", "register"})
HOUR = 3600 * 10**9  # the write log's summary (iox_write_hour) is kept per UTC hour
Interval = tuple[int, int]


@dataclass(frozen=True)
class WriteEvent:
    """New data in one (table, partition): its inclusive time range (inside the partition's day) and size."""

    table: str
    partition: str
    min_time: int
    max_time: int
    rows: int
    chunks: int = 1


@dataclass(frozen=True)
class TableRead:
    """One table an interval's run read, and the committed order counter of its database in the plan's snapshot."""

    db_id: int
    db: str
    table: str
    watermark: int


@dataclass(frozen=True)
class LateData:
    """Why an interval is stale, for one table it read: what arrived after its run, or that the database went."""

    db: str
    table: str
    chunks: int
    rows: int
    partitions: tuple[str, ...]
    dropped: bool
    table_dropped: bool = False

    def describe(self) -> str:
        if self.dropped:
            return f"database {self.db} was dropped"
        if self.table_dropped and not self.chunks:
            return f"table {self.db}.{self.table} was dropped after it ran"
        if self.table_dropped:
            return (f"table {self.db}.{self.table} was dropped after it ran, and {self.chunks} chunk(s), "
                    f"{self.rows} row(s) arrived in a table of that name (partition {', '.join(self.partitions)})")
        where = ", ".join(self.partitions)
        return (f"{self.chunks} chunk(s), {self.rows} row(s) arrived in {self.db}.{self.table} "
                f"(partition {where}) after it ran")


# --- recording ---------------------------------------------------------------------------------------------------


def record_writes(conn: Connection, db_id: int, events: Iterable[WriteEvent], *, order: int | None = None,
                  orders: Sequence[int] | None = None, source: str) -> None:
    """Log new data, inside the writing transaction. `order` (one for all) or `orders` (one per event) must have
    been taken from the database's counter in this same transaction (`Catalog.next_orders`)."""
    if source not in SOURCES:
        raise ValueError(f"unknown write source {source!r}")
    events = list(events)
    if not events:
        return
    if orders is None:
        if order is None:
            raise ValueError("record_writes needs an order")
        orders = [order] * len(events)
    if len(orders) != len(events):
        raise ValueError("record_writes: one order per event")
    conn.execute(write_events.insert().returning(write_events.c.id), [  # RETURNING: batched (store.ensure_tables)
        dict(database_id=db_id, table_name=e.table, partition_key=e.partition, write_order=o, min_time=e.min_time,
             max_time=e.max_time, chunks=e.chunks, row_count=e.rows, source=source)
        for e, o in zip(events, orders)
    ])
    hours: dict[tuple[str, int], int] = {}
    for e, o in zip(events, orders):
        for hour in range(e.min_time // HOUR, e.max_time // HOUR + 1):  # an event lies in one day: <= 24 hours
            key = (e.table, hour * HOUR)
            hours[key] = max(o, hours.get(key, o))
    # executemany, not one VALUES list: compiled once however many hours (a write over thousands of days).
    upsert = pg.insert(write_hours)
    conn.execute(upsert.on_conflict_do_update(
        index_elements=["database_id", "table_name", "hour_start"],
        set_={"max_order": sa.func.greatest(write_hours.c.max_order, upsert.excluded.max_order)})
        .returning(write_hours.c.hour_start), [
        dict(database_id=db_id, table_name=t, hour_start=h, max_order=o) for (t, h), o in sorted(hours.items())])


def fresh_order(conn: Connection, db_id: int) -> int:
    """An order for write events of a write whose chunks do not take new ones (a scenario load with explicit
    orders, a registration that only retired rows): the counter moves by one, taking the row lock like any write.
    A database at the last order keeps it (its writes fail anyway until it is reloaded)."""
    value = conn.execute(database_orders.update().where(database_orders.c.database_id == db_id)
                         .values(last_order=sa.func.least(database_orders.c.last_order + 1, MAX_ORDER))
                         .returning(database_orders.c.last_order)).scalar_one_or_none()
    if value is None:
        raise ValueError(f"database id {db_id} has no order counter")
    return int(value)


def record_drop(conn: Connection, db_id: int, name: str) -> None:
    """Inside the transaction that drops a database: every interval that read it becomes stale."""
    conn.execute(pg.insert(database_drops).values(database_id=db_id, database_name=name)
                 .on_conflict_do_nothing(index_elements=["database_id"]))


def committed_order(conn: Connection, db_id: int) -> int:
    """The database's order counter as the caller's snapshot sees it (0 for a database without one yet)."""
    value = conn.execute(sa.select(database_orders.c.last_order)
                         .where(database_orders.c.database_id == db_id)).scalar_one_or_none()
    return int(value or 0)


def record_reads(conn: Connection, definition: str, interval: Interval, reads: Sequence[TableRead],
                 query_run: int | None) -> None:
    """Inside the transaction that publishes an interval: what its run read replaces what the previous run read."""
    start, end = interval
    conn.execute(materialized_reads.delete().where(
        materialized_reads.c.definition == definition, materialized_reads.c.interval_start == start,
        materialized_reads.c.interval_end == end))
    merged: dict[tuple[int, str], TableRead] = {}
    for read in reads:  # a table read twice (a self-join) counts with the older of its two snapshots
        key = (read.db_id, read.table)
        if key not in merged or read.watermark < merged[key].watermark:
            merged[key] = read
    if merged:
        conn.execute(materialized_reads.insert(), [
            dict(definition=definition, interval_start=start, interval_end=end, database_id=r.db_id,
                 database_name=r.db, table_name=r.table, watermark=r.watermark, query_run_id=query_run)
            for r in merged.values()
        ])


# --- reading -------------------------------------------------------------------------------------------------------


def _window(query: sa.Select[Any], start: int | None, end: int | None) -> sa.Select[Any]:
    if start is not None:
        query = query.where(materialized_reads.c.interval_end > start)
    if end is not None:
        query = query.where(materialized_reads.c.interval_start < end)
    return query


def materialized_intervals(conn: Connection, definition: str, start: int | None = None,
                           end: int | None = None) -> dict[Interval, list[TableRead]]:
    """Every interval of `definition` with a published output, and what its run read."""
    query = _window(sa.select(materialized_reads).where(materialized_reads.c.definition == definition), start, end)
    out: dict[Interval, list[TableRead]] = defaultdict(list)
    for r in conn.execute(query.order_by(materialized_reads.c.interval_start, materialized_reads.c.table_name)):
        out[(int(r.interval_start), int(r.interval_end))].append(
            TableRead(int(r.database_id), r.database_name, r.table_name, int(r.watermark)))
    return dict(out)


# One statement. First each read of the definition probes the per-hour summary (iox_write_hour's primary key) for
# an hour overlapping its interval whose highest order is above its watermark: a short index range per interval.
# Only the reads it flags (an hour bucket may hold a newer write outside a sub-hour interval) are checked against
# the write log itself and explained: short events (< 1 hour, their partial index) from an hour before the interval,
# long ones (their own, small partial index) from a day before (events lie inside one day). The literals match the
# partial indexes' predicates in catalog_sql, which is what lets Postgres use them.
_STALE = sa.text("""
    WITH flagged AS (
        SELECT r.* FROM iox_materialized_read r
        WHERE r.definition = :definition AND r.interval_end > :lo AND r.interval_start < :hi
          AND (EXISTS (SELECT 1 FROM iox_write_hour w
                       WHERE w.database_id = r.database_id AND w.table_name = r.table_name
                         AND w.hour_start > r.interval_start - :hour AND w.hour_start < r.interval_end
                         AND w.max_order > r.watermark)
               OR EXISTS (SELECT 1 FROM iox_database_drop d WHERE d.database_id = r.database_id)
               OR EXISTS (SELECT 1 FROM iox_table_drop t WHERE t.database_id = r.database_id
                            AND t.table_name = r.table_name AND t.drop_order > r.watermark))
    )
    SELECT r.interval_start, r.interval_end, r.database_name, r.table_name,
           d.database_id IS NOT NULL AS dropped, td.dropped AS table_dropped, late.chunks, late.rows, late.partitions
    FROM flagged r
    LEFT JOIN iox_database_drop d ON d.database_id = r.database_id
    CROSS JOIN LATERAL (
        SELECT EXISTS (SELECT 1 FROM iox_table_drop t WHERE t.database_id = r.database_id
                         AND t.table_name = r.table_name AND t.drop_order > r.watermark) AS dropped
    ) td
    CROSS JOIN LATERAL (
        SELECT count(*) AS events, coalesce(sum(e.chunks), 0) AS chunks, coalesce(sum(e.row_count), 0) AS rows,
               array_agg(DISTINCT e.partition_key) AS partitions
        FROM (
            SELECT s.chunks, s.row_count, s.partition_key FROM iox_write_event s
            WHERE s.database_id = r.database_id AND s.table_name = r.table_name
              AND s.max_time - s.min_time < 3600000000000
              AND s.min_time > r.interval_start - 3600000000000 AND s.min_time < r.interval_end
              AND s.max_time >= r.interval_start AND s.write_order > r.watermark
            UNION ALL
            SELECT l.chunks, l.row_count, l.partition_key FROM iox_write_event l
            WHERE l.database_id = r.database_id AND l.table_name = r.table_name
              AND l.max_time - l.min_time >= 3600000000000
              AND l.min_time > r.interval_start - 86400000000000 AND l.min_time < r.interval_end
              AND l.max_time >= r.interval_start AND l.write_order > r.watermark
        ) e
    ) late
    WHERE late.events > 0 OR d.database_id IS NOT NULL OR td.dropped
    ORDER BY r.interval_start, r.interval_end, r.database_name, r.table_name
""")


def stale_reads(conn: Connection, definition: str, start: int | None = None,
                end: int | None = None) -> dict[Interval, list[LateData]]:
    """The stale intervals of one definition (overlapping `[start, end)` when given) and why, in one query."""
    # Off for this transaction: Postgres's JIT, which the plan's cost estimate would switch on, compiles for about a
    # second (measured: 1.2 s with it, under 0.1 s without) for a query that then runs in milliseconds.
    conn.execute(sa.select(sa.func.set_config("jit", "off", True)))
    rows = conn.execute(_STALE.bindparams(
        definition=definition, hour=HOUR, lo=-(2**63) if start is None else start,
        hi=2**63 - 1 if end is None else end))
    out: dict[Interval, list[LateData]] = defaultdict(list)
    for r in rows:
        out[(int(r.interval_start), int(r.interval_end))].append(LateData(
            r.database_name, r.table_name, int(r.chunks), int(r.rows),
            tuple(p for p in (r.partitions or []) if p is not None), bool(r.dropped), bool(r.table_dropped)))
    return dict(out)


@dataclass(frozen=True)
class LastRun:
    status: str
    error: str | None
    query_run: int
    dag_id: str | None
    run_id: str | None


def last_runs(conn: Connection, definition: str, start: int | None = None,
              end: int | None = None) -> dict[Interval, LastRun]:
    """The most recent query run of each interval of `definition` (a failure there is shown by status)."""
    query = (
        sa.select(query_runs.c.interval_start, query_runs.c.interval_end, query_runs.c.status, query_runs.c.error,
                  query_runs.c.id, query_runs.c.dag_id, query_runs.c.run_id)
        .where(query_runs.c.definition == definition, query_runs.c.interval_start.is_not(None),
               query_runs.c.interval_end.is_not(None))
        .ext(pg.distinct_on(query_runs.c.interval_start, query_runs.c.interval_end))
        .order_by(query_runs.c.interval_start, query_runs.c.interval_end, query_runs.c.started_at.desc(),
                  query_runs.c.id.desc())
    )
    if start is not None:
        query = query.where(query_runs.c.interval_end > start)
    if end is not None:
        query = query.where(query_runs.c.interval_start < end)
    return {(int(r.interval_start), int(r.interval_end)): LastRun(r.status, r.error, int(r.id), r.dag_id, r.run_id)
            for r in conn.execute(query)}
