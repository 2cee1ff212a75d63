"""Staleness benchmark: the stale intervals of one definition with a year of hourly intervals (8,760), over a
catalog of 100,000 chunks and as many write events, all in the one table the definition reads (the worst case:
events of other tables are not even probed).

Builds the catalog in a database of its own on the project's local Postgres (or IOX_BENCH_CATALOG_URL): events
arrive in time order (one chunk each, ~11 an hour), each interval's run saw everything up to its end, and 1% of
the events are late data landing at random earlier times. Then it times `freshness.stale_reads` (ONE query) and
shows Postgres's plan. Target: at most 100 ms. Run: `python benchmarks/bench_staleness.py [--events N]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from iox_planner.catalog import freshness, localpg
from iox_planner.catalog.store import Catalog

DAY = 86_400_000_000_000
HOUR = 3_600_000_000_000
T0 = 1_704_067_200_000_000_000
DEFINITION = "bench_hourly"


def build(catalog: Catalog, events: int, hours: int, late_share: float) -> int:
    """Returns how many late events were written."""
    late = int(events * late_share)
    regular = events - late
    step = hours * HOUR // regular  # in-order events spread over the year
    with catalog.engine.begin() as conn:
        db_id = conn.execute(sa.text("INSERT INTO iox_database (name) VALUES ('bench') RETURNING id")).scalar_one()
        table_id = conn.execute(sa.text("INSERT INTO iox_table (database_id, name) VALUES (:d, 'cpu') RETURNING id")
                                .bindparams(d=db_id)).scalar_one()
        conn.execute(sa.text(
            "INSERT INTO iox_partition (table_id, partition_key) "
            "SELECT :t, to_char(date '2024-01-01' + d, 'YYYY-MM-DD') FROM generate_series(0, :days) d"
        ).bindparams(t=table_id, days=hours // 24))
        # Event g (order g) at T0 + g * step, 1 s wide; the late ones (orders after every regular one) at a
        # pseudo-random earlier time.
        conn.execute(sa.text(
            """
            INSERT INTO iox_write_event (database_id, table_name, partition_key, write_order, min_time, max_time,
                                         chunks, row_count, source)
            SELECT :db, 'cpu', to_char(to_timestamp(lo / 1e9) AT TIME ZONE 'UTC', 'YYYY-MM-DD'), g, lo,
                   lo + 1000000000, 1, 100, 'write'
            FROM (SELECT g, CASE WHEN g <= :regular THEN :t0 + g * :step
                                 ELSE :t0 + ((g * 7919) % :hours) * :hour + (g % 3600) * 1000000000 END AS lo
                  FROM generate_series(1::bigint, :events) g) s
            """
        ).bindparams(db=db_id, regular=regular, events=events, t0=T0, step=step, hours=hours, hour=HOUR))
        # The per-hour summary the write paths keep beside the log (freshness.record_writes).
        conn.execute(sa.text(
            """
            INSERT INTO iox_write_hour (database_id, table_name, hour_start, max_order)
            SELECT :db, 'cpu', h * :hour, max(write_order)
            FROM iox_write_event, generate_series(min_time / :hour, max_time / :hour) h
            GROUP BY h
            """
        ).bindparams(db=db_id, hour=HOUR))
        # The chunks themselves, as the catalog holds them (the staleness query never reads them).
        conn.execute(sa.text(
            """
            INSERT INTO iox_parquet_file (object_id, table_id, partition_id, store, path, min_time, max_time,
                row_count, file_size, column_names, sort_key, tag_ranges, chunk_order)
            SELECT gen_random_uuid(), :t, p.id, 'file://', 'x.parquet', e.min_time, e.max_time, 100, 10000,
                   ARRAY['host','usage','time'], ARRAY['host','time'], '{}'::jsonb, e.write_order
            FROM iox_write_event e JOIN iox_partition p ON p.table_id = :t AND p.partition_key = e.partition_key
            """
        ).bindparams(t=table_id))
        # Interval h ran once its hour was complete: it saw every regular event before its end.
        conn.execute(sa.text(
            """
            INSERT INTO iox_materialized_read (definition, interval_start, interval_end, database_id, database_name,
                                               table_name, watermark)
            SELECT :definition, :t0 + h * :hour, :t0 + (h + 1) * :hour, :db, 'bench', 'cpu',
                   LEAST(:regular, ((h + 1) * :hour) / :step)
            FROM generate_series(0, :hours - 1) h
            """
        ).bindparams(definition=DEFINITION, t0=T0, hour=HOUR, db=db_id, regular=regular, step=step, hours=hours))
        conn.execute(sa.text("ANALYZE"))
    return late


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=100_000, help="chunks and write events (default 100,000)")
    parser.add_argument("--hours", type=int, default=8_760, help="hourly intervals (default a year: 8,760)")
    parser.add_argument("--late", type=float, default=0.01, help="share of late events (default 0.01)")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    console = Console()
    url = os.environ.get("IOX_BENCH_CATALOG_URL")
    if url is None:
        pg = localpg.ensure_running()
        localpg.drop_database(pg, "iox_bench_staleness")
        url = localpg.ensure_database(pg, "iox_bench_staleness")
    catalog = Catalog(url)
    catalog.migrate()
    started = time.perf_counter()
    console.print(f"building a catalog of {args.events:,} chunks and write events, {args.hours:,} hourly "
                  "intervals...")
    late = build(catalog, args.events, args.hours, args.late)
    console.print(f"built in {time.perf_counter() - started:.1f} s")
    timings = []
    with catalog.engine.connect() as conn:
        counts = {name: conn.execute(sa.text(f"SELECT count(*) FROM {name}")).scalar_one()  # noqa: S608 - fixed names
                  for name in ("iox_parquet_file", "iox_write_event", "iox_materialized_read")}
        found: dict[tuple[int, int], list[freshness.LateData]] = {}
        for _ in range(args.repeat):
            started = time.perf_counter()
            found = freshness.stale_reads(conn, DEFINITION)
            timings.append((time.perf_counter() - started) * 1000)
        plan = conn.execute(sa.text("EXPLAIN (ANALYZE, COSTS OFF) " + freshness._STALE.text).bindparams(
            definition=DEFINITION, hour=HOUR, lo=-(2**63), hi=2**63 - 1)).scalars().all()
    timings.sort()
    result = Table(title=f"stale intervals of one definition ({counts['iox_materialized_read']:,} hourly "
                         f"intervals; {counts['iox_parquet_file']:,} chunks, {counts['iox_write_event']:,} write "
                         f"events of which {late:,} late)")
    for col in ("query", "stale found", "median ms", "p95 ms", "target"):
        result.add_column(col, justify="right")
    p95 = timings[max(0, int(len(timings) * 0.95) - 1)]
    result.add_row("freshness.stale_reads", f"{len(found):,}", f"{statistics.median(timings):.1f}", f"{p95:.1f}",
                   "<= 100 ms")
    console.print(result)
    console.print("Postgres plan:")
    for line in plan:
        console.print("  " + line, markup=False, highlight=False)
    catalog.dispose()


if __name__ == "__main__":
    main()
