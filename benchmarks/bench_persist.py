"""Persist benchmark: ingester chunks of TSBS-style cpu rows become one sorted, deduplicated Parquet file.

Each round builds a fresh database (untimed) of one day partition: one ingester chunk per hour in write order
(every host per timestamp, so not sorted on the key), a late chunk rewriting a fraction of an hour's points
(changed and omitted fields) and a chunk that writes one hour's points twice (duplicates inside one chunk); then
it times `persist` end to end (catalog lock, reads, the sort key, the merge sorting on it, the zstd Parquet
write, the registration). Then, on the same chunks, untimed by persist, each step alone as persist makes it (tags
read dictionary-encoded; medians over the rounds), to show where the time goes. Rows per second are rows read (all chunks' rows) over persist's wall time; persist
runs on one core.

Before/after comparisons of code versions: run this script from each checkout in turn, alternating, e.g. with
`PYTHONPATH=<other checkout>/plugins:<other checkout>` for the other version.

Run: `python benchmarks/bench_persist.py [--hosts 1000 --hours 2 --repeat 5]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from turns import load_report  # noqa: E402
from bench_spark import COLUMNS, hour_table, rewrite_of  # noqa: E402
from rich.console import Console  # noqa: E402

from iox_planner.catalog.drops import drop_database  # noqa: E402
from iox_planner.catalog.store import Catalog  # noqa: E402
from iox_planner.config import warehouse  # noqa: E402
from iox_planner import storage  # noqa: E402
from iox_planner.ingest import files as chunk_files  # noqa: E402
from iox_planner.maintenance.persist import persist  # noqa: E402
from iox_planner.ingest.tsbs import FIELDS, TAGS  # noqa: E402
from iox_planner.ingest.write import write_table  # noqa: E402
from iox_planner.model import TIME, WRITE_SEQ, ChunkKind  # noqa: E402


def _ingester(table: pa.Table) -> pa.Table:
    """Rows as written: time-major (every host per timestamp), with their write positions."""
    rows = table.take(pc.sort_indices(table, [(TIME, "ascending")]))
    return rows.append_column(WRITE_SEQ, pa.array(np.arange(rows.num_rows, dtype=np.int64)))


def chunks(hosts: int, hours: int) -> list[pa.Table]:
    rng = np.random.default_rng(11)
    walk = rng.uniform(0, 100, (hosts, len(FIELDS)))
    tables = [hour_table(rng, hosts, h, 10, walk) for h in range(hours)]
    late = rewrite_of(rng, tables[0]).slice(0, tables[0].num_rows // 2)
    twice = pa.concat_tables([rewrite_of(rng, tables[-1]), rewrite_of(rng, tables[-1])])
    return [_ingester(t) for t in [*tables, late, twice]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--hours", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    console = Console(width=200)
    catalog = Catalog()
    catalog.require_schema()
    root = warehouse()
    data = chunks(args.hosts, args.hours)
    rows_in = sum(t.num_rows for t in data)
    load_start = os.getloadavg()
    totals: list[float] = []
    steps: dict[str, list[float]] = {}
    rows_out = 0
    for round_ in range(args.repeat + 1):
        db = f"bench_persist_{uuid.uuid4().hex[:8]}"
        for table in data:
            write_table(catalog, db, "cpu", table, COLUMNS, kind=ChunkKind.INGESTER)
        with catalog.engine.connect() as conn:
            paths = [root / c.path for c in catalog.chunk_rows(conn, catalog.database_id(conn, db)) if c.path]
        started = time.perf_counter()
        persist(catalog, db)
        elapsed = time.perf_counter() - started
        if round_:
            totals.append(elapsed)
        # The steps alone, on the same chunk files (persist retired them; they stay for the grace period).
        marks = [time.perf_counter()]
        parts = [(i + 1, chunk_files.read_chunk(p, p.stem, TAGS)) for i, p in enumerate(paths)]
        marks.append(time.perf_counter())
        key = chunk_files.partition_sort_key(None, COLUMNS, pa.concat_tables([t.select(list(TAGS)) for _, t in parts]))
        marks.append(time.perf_counter())
        ordered = chunk_files.deduplicate(parts, COLUMNS, sort_key=key, keep_dictionary=True, write_orders=True)
        marks.append(time.perf_counter())
        out = root / f"bench-persist-{uuid.uuid4().hex}.parquet"
        storage.write_parquet_atomic(ordered, out, metadata={"iox.kind": "parquet"}, store_schema=False)
        marks.append(time.perf_counter())
        out.unlink()
        rows_out = ordered.num_rows
        timings = {name: b - a for name, a, b in zip(("read", "sort key", "merge and sort", "write"), marks,
                                                      marks[1:])}
        if round_:
            for name, seconds in timings.items():
                steps.setdefault(name, []).append(seconds)
        drop_database(catalog, db, root)
        console.print(f"  round {round_}{' (warm-up)' if not round_ else ''}: persist {elapsed:.3f} s; "
                      + ", ".join(f"{n} {s:.3f} s" for n, s in timings.items()))
    median = statistics.median(totals)
    console.print(f"persist of {len(data)} ingester chunks, {rows_in:,} rows in, {rows_out:,} rows out: median "
                  f"{median:.3f} s over {args.repeat} rounds, {rows_in / median:,.0f} rows in per second; steps "
                  "alone (medians): " + ", ".join(f"{n} {statistics.median(s):.3f} s" for n, s in steps.items()))
    console.print(load_report(load_start))


if __name__ == "__main__":
    main()
