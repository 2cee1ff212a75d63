"""catalog/freshness.py against a real Postgres: the write log, what a plan read, and which intervals are stale.
No Spark: the reads are recorded straight from a real plan's CatalogSource, as the commit step records them."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from common_support import live_chunks

from iox_planner import storage
from iox_planner.catalog import freshness
from iox_planner.catalog.drops import drop_database
from iox_planner.catalog.store import Catalog, CatalogSource
from iox_planner.ingest import register
from iox_planner.ingest import write as ingest
from iox_planner.ingest.scenario import load_scenario, parse_scenario
from iox_planner.maintenance import persist
from iox_planner.planner import plan_query

H = 3600 * 10**9
T0 = 1704067200 * 10**9  # 2024-01-01T00:00:00Z
HOURS = [(T0 + k * H, T0 + (k + 1) * H) for k in range(3)]
SQL = "SELECT host, count(*) AS n FROM cpu GROUP BY host"


def lines(hour: int, n: int, value: float = 1.0) -> str:
    return "\n".join(f"cpu,host=h{i % 2} usage={value + i} {T0 + hour * H + i * 10**9}" for i in range(n))


def materialize(catalog: Catalog, db: str, definition: str, interval: tuple[int, int], sql: str = SQL) -> None:
    """What a materialize run records: plan over the interval, then (at commit) what the plan read."""
    source = CatalogSource(catalog, db)
    plan_query(sql, source, time_start=interval[0], time_end=interval[1])
    with catalog.engine.begin() as conn:
        freshness.record_reads(conn, definition, interval, source.reads(), None)


def stale(catalog: Catalog, definition: str) -> dict[tuple[int, int], list[freshness.LateData]]:
    with catalog.engine.connect() as conn:
        return freshness.stale_reads(conn, definition)


def test_late_data_makes_exactly_its_interval_stale_and_persist_does_not(catalog: Catalog, db: str) -> None:
    name = f"d_{db}".lower()
    for hour in range(3):
        ingest.write_line_protocol(catalog, db, lines(hour, 4))
    for interval in HOURS:
        materialize(catalog, db, name, interval)
    assert stale(catalog, name) == {}
    # Late data into the second hour: 3 rows, one chunk.
    ingest.write_line_protocol(catalog, db, lines(1, 3, value=50.0))
    assert stale(catalog, name) == {HOURS[1]: [freshness.LateData(db, "cpu", 1, 3, ("2024-01-01",), False)]}
    # Persist merges all four chunks into one file that takes the late write's order and spans all three hours:
    # judged by live chunks every hour would look stale now; by the write log nothing changes.
    persist.persist(catalog, db)
    chunks = live_chunks(catalog, db)
    assert len(chunks) == 1 and chunks[0]["min_time"] < HOURS[0][1] and chunks[0]["max_time"] >= HOURS[2][0]
    assert list(stale(catalog, name)) == [HOURS[1]]
    # --- compaction goes here once it lands: compact the partition, and still only HOURS[1] is stale ---
    # Rerunning the interval records what that run read: fresh again.
    materialize(catalog, db, name, HOURS[1])
    assert stale(catalog, name) == {}
    # Data after the last interval, or in another table, makes nothing stale.
    ingest.write_line_protocol(catalog, db, lines(5, 2) + f"\nmem,host=h0 used=1 {T0 + H + 5}")
    assert stale(catalog, name) == {}


def test_a_scenario_load_with_low_explicit_orders_is_still_new_data(catalog: Catalog, db: str) -> None:
    name = f"d_{db}".lower()
    ingest.write_line_protocol(catalog, db, f"mem,host=h0 used=1 {T0}")  # orders 1 and 2 go to another table
    ingest.write_line_protocol(catalog, db, f"mem,host=h0 used=2 {T0}")
    ingest.write_line_protocol(catalog, db, lines(0, 2))
    materialize(catalog, db, name, HOURS[0])
    # Order 1 is below what the run saw, yet the rows are new: the load logs them with a fresh order.
    load_scenario(catalog, parse_scenario({"chunks": [
        {"id": "OLD", "kind": "parquet", "order": 1, "lines": f"cpu,host=zz usage=1 {T0 + 7}"}]}), db=db)
    [late] = stale(catalog, name)[HOURS[0]]
    assert (late.chunks, late.rows) == (1, 1)


def test_a_registered_table_makes_its_readers_stale_even_when_the_result_shrinks(
        catalog: Catalog, db: str, warehouse: Path) -> None:
    import pyarrow as pa

    name = f"r_{db}".lower()

    def result(n: int, at: int = HOURS[1][0]) -> pa.Table:
        return pa.table({"host": pa.array([f"h{i}" for i in range(n)], pa.string()),
                         "time": pa.array([at // 1000] * n, pa.timestamp("us", tz="UTC")),
                         "n": pa.array(list(range(n)), pa.int64())})

    register.register_interval(catalog, db, "rollup", result(2), tags=["host"], interval=HOURS[1])
    register.register_interval(catalog, db, "rollup", result(1, HOURS[2][0]), tags=["host"], interval=HOURS[2])
    daily = (T0, T0 + 24 * H)
    materialize(catalog, db, name, daily, "SELECT host, sum(n) AS n FROM rollup GROUP BY host")
    assert stale(catalog, name) == {}
    # The hourly interval is registered again with no rows at all: still a change its readers must see.
    register.register_interval(catalog, db, "rollup", result(0), tags=["host"], interval=HOURS[1])
    [late] = stale(catalog, name)[daily]
    assert (late.table, late.chunks, late.rows, late.partitions) == ("rollup", 0, 0, ("2024-01-01",))


def test_dropping_a_database_makes_what_read_it_stale(catalog: Catalog, db: str, warehouse: Path) -> None:
    name = f"d_{db}".lower()
    ingest.write_line_protocol(catalog, db, lines(0, 2))
    materialize(catalog, db, name, HOURS[0])
    drop_database(catalog, db, warehouse)
    [late] = stale(catalog, name)[HOURS[0]]
    assert late.dropped and "was dropped" in late.describe()
    # The same name again is a new database: its data is not what the interval read, and it stays stale.
    ingest.write_line_protocol(catalog, db, lines(0, 2))
    assert list(stale(catalog, name)) == [HOURS[0]]


def test_the_watermark_is_exact_against_a_write_in_flight(catalog: Catalog, db: str, warehouse: Path) -> None:
    """A write that has taken its order but not committed holds the counter's row lock: a plan in that moment sees
    neither its chunk nor its order in the counter, and the write's event lands above the plan's watermark. A write
    committed before the plan is in the chunk list and at or below the watermark."""
    name = f"d_{db}".lower()
    ingest.write_line_protocol(catalog, db, lines(0, 2))  # committed before: seen
    staged = storage.Staged(storage.warehouse_of(warehouse))
    from iox_planner.ingest.lineprotocol import parse

    with catalog.engine.connect() as writer:
        tx = writer.begin()
        points = parse(lines(0, 3, value=70.0), default_time=T0).points
        result = ingest.write_points(catalog, db, points, conn=writer, staged=staged)
        [in_flight] = result.chunks
        # The plan runs while the write holds its order (the reader never waits for the writer's lock).
        source = CatalogSource(catalog, db)
        plan = plan_query(SQL, source, time_start=HOURS[0][0], time_end=HOURS[0][1])
        [read] = source.reads()
        tx.commit()
    assert in_flight.order > read.watermark
    assert {c.order for c in plan.chunks().values()} == {in_flight.order - 1}
    assert max(c.order for c in plan.chunks().values()) <= read.watermark
    with catalog.engine.begin() as conn:
        freshness.record_reads(conn, name, HOURS[0], source.reads(), None)
    [late] = stale(catalog, name)[HOURS[0]]
    assert (late.chunks, late.rows) == (1, 3)
    # A plan after the commit sees it, and is fresh.
    materialize(catalog, db, name, HOURS[0])
    assert stale(catalog, name) == {}


def test_the_stale_query_uses_the_write_log_index(catalog: Catalog, db: str) -> None:
    """Over a write log shaped like a real one (many tables, a month of hourly writes, a few day-long events),
    analyzed: the planner's choice depends on the statistics, so they are a real log's, not whatever rows other
    tests left. All in one transaction, rolled back."""
    with catalog.engine.connect() as conn, conn.begin() as tx:
        conn.execute(sa.text("""
            INSERT INTO iox_write_event (database_id, table_name, partition_key, write_order, min_time, max_time,
                                         chunks, row_count, source)
            SELECT 1000000 + n % 3, 't' || (n % 40), '2024-01-01', n,
                   :t0 + (n / 40) * 3600000000000, :t0 + (n / 40) * 3600000000000 + (CASE WHEN n % 97 = 0
                       THEN 86399999999999 ELSE 3599999999999 END), 1, 100, 'write'
            FROM generate_series(1, 30000) AS n"""), {"t0": T0})
        conn.execute(sa.text("ANALYZE iox_write_event"))
        conn.execute(sa.text("SET LOCAL enable_seqscan = off"))
        plan = "\n".join(conn.execute(sa.text("EXPLAIN " + freshness._STALE.text).bindparams(
            definition="x", hour=1, lo=0, hi=1)).scalars())
        tx.rollback()
    assert {"iox_write_hour_pkey", "iox_write_event_short", "iox_write_event_long"} <= set(plan.split()), plan


@pytest.mark.parametrize("bad", [{"source": "persist"}, {"order": None}])
def test_record_writes_refuses_what_is_not_a_write(catalog: Catalog, bad: dict[str, object]) -> None:
    args: dict[str, object] = {"order": 1, "source": "write", **bad}
    with catalog.engine.begin() as conn, pytest.raises(ValueError):
        event = freshness.WriteEvent("t", "2024-01-01", T0, T0, 1)
        freshness.record_writes(conn, 1, [event], **args)  # type: ignore[arg-type]
