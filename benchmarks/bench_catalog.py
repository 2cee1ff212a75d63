"""Catalog benchmark: "chunks of table T overlapping [t0, t1]" on a catalog of 1,000,000 Parquet files.

Builds the catalog in a database of its own on the project's local Postgres (or IOX_BENCH_CATALOG_URL), then
times the lookup the planner makes (`Catalog.chunk_rows`) and shows Postgres's plan for it. Target: an index scan
taking at most 20 ms. Run: `python benchmarks/bench_catalog.py [--files N]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from iox_planner.catalog import localpg
from iox_planner.catalog.store import Catalog

DAY = 86_400_000_000_000
T0 = 1_704_067_200_000_000_000


def build(catalog: Catalog, files: int, tables: int, days: int) -> None:
    """Tables x days partitions; files spread evenly, each covering a random slice of its day."""
    with catalog.engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO iox_database (name) VALUES ('bench')"))
        conn.execute(sa.text(
            "INSERT INTO iox_table (database_id, name) SELECT 1, 't' || g FROM generate_series(1, :n) g"
        ).bindparams(n=tables))
        conn.execute(sa.text(
            "INSERT INTO iox_partition (table_id, partition_key, sort_key) "
            "SELECT t, to_char(date '2024-01-01' + d, 'YYYY-MM-DD'), ARRAY['host','time'] "
            "FROM generate_series(1, :tables) t, generate_series(0, :days - 1) d ORDER BY t, d"
        ).bindparams(tables=tables, days=days))
        # File g lies in table 1 + g % tables, day (g / tables) % days, at a pseudo-random offset and width.
        conn.execute(sa.text(
            """
            INSERT INTO iox_parquet_file (object_id, table_id, partition_id, store, path, min_time, max_time,
                row_count, file_size, column_names, sort_key, tag_ranges, chunk_order)
            SELECT gen_random_uuid(), t, (t - 1) * :days + d + 1, 'file://', 'x.parquet', lo, lo + span, 1000,
                   100000, ARRAY['host','usage','time'], ARRAY['host','time'], '{}'::jsonb, g
            FROM (
                SELECT g, 1 + g % :tables AS t, (g / :tables) % :days AS d,
                       (g * 7919) % 1000 AS a, (g * 104729) % 997 AS b
                FROM generate_series(1::bigint, :files) g
            ) s
            CROSS JOIN LATERAL (
                SELECT :t0 + d * :day + a * (:day / 1000 * 9 / 10) AS lo, b * (:day / 1000 / 10) AS span
            ) r
            """
        ).bindparams(files=files, tables=tables, days=days, t0=T0, day=DAY))
        conn.execute(sa.text("ANALYZE"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--tables", type=int, default=10)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    console = Console()
    url = os.environ.get("IOX_BENCH_CATALOG_URL")
    if url is None:
        pg = localpg.ensure_running()
        localpg.drop_database(pg, "iox_bench")
        url = localpg.ensure_database(pg, "iox_bench")
    catalog = Catalog(url)
    catalog.migrate()
    started = time.perf_counter()
    console.print(f"building a catalog of {args.files:,} files ({args.tables} tables x {args.days} days)...")
    build(catalog, args.files, args.tables, args.days)
    console.print(f"built in {time.perf_counter() - started:.1f} s")

    cases = [("one hour", 3_600_000_000_000), ("one day", DAY), ("one week", 7 * DAY)]
    result = Table(title=f"chunks of one table overlapping [t0, t1], {args.files:,} files in the catalog")
    for col in ("window", "files found", "median ms", "p95 ms", "target"):
        result.add_column(col, justify="right")
    with catalog.engine.connect() as conn:
        for label, width in cases:
            timings = []
            found = 0
            for i in range(args.repeat):
                t0 = T0 + (i * 7 % 300) * DAY + 12 * 3_600_000_000_000
                started = time.perf_counter()
                rows = catalog.chunk_rows(conn, 1, table="t3", time_min=t0, time_max=t0 + width)
                timings.append((time.perf_counter() - started) * 1000)
                found = len(rows)
            timings.sort()
            p95 = timings[int(len(timings) * 0.95) - 1]
            result.add_row(label, f"{found:,}", f"{statistics.median(timings):.2f}", f"{p95:.2f}", "<= 20 ms")
        plan = conn.execute(sa.text(
            "EXPLAIN (ANALYZE, COSTS OFF) SELECT f.id FROM iox_parquet_file f JOIN iox_table t ON t.id = f.table_id "
            "WHERE t.database_id = 1 AND t.name = 't3' AND f.to_delete IS NULL AND f.min_time <= :hi "
            "AND f.max_time >= :lo AND f.min_time > :lo - :day"
        ).bindparams(lo=T0 + 100 * DAY, hi=T0 + 101 * DAY, day=DAY)).scalars().all()
    console.print(result)
    console.print("Postgres plan (one day):")
    for line in plan:
        console.print("  " + line, markup=False, highlight=False)
    catalog.dispose()


if __name__ == "__main__":
    main()
