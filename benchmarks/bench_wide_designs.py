"""Why the wide overlap costs more than 1.3x a plain scan: the designs that could beat it, measured in one run.

The shape is `bench_wide_overlap.py`'s: a day of hourly, sorted Parquet files (one row group each) plus one late
file rewriting a few hosts across the whole day. A query must deduplicate the late rows against the base rows
they meet (1% of them at 10 of 1,000 hosts). Moving rows through Spark's Python workers costs about a plain scan
per row by itself, so a design under 1.3x must let Spark's own scan emit nearly every base row, and find and read
the few that may meet a late row for well under 0.3x. Each variant below is one way of doing a part of that;
each is timed against a plain scan of the same files, taking turns, and its median over the rounds is reported:

  scan                 plain scan of the files as iox-batch writes them (one row group per hourly file)
  scan, G-row groups   the same rows rewritten with row groups of --row-group rows
  NOT IN late hosts    the base rows whose host is not a late one: what Spark would emit natively
  row_index filter     the same, selected by position (`_metadata.row_index`) instead of by value
  series predicate     the same, selected by the late series' full tag tuples (OR of ANDs)
  outer join           every base row joined (broadcast) to the late rows on the full key, keys NULL unless
                       the host is late, fields merged: a native dedup in one pass (late rows that meet no base
                       row are still missing from it)
  split prototype      G-row groups; Spark emits rows of hosts that are not late (NOT IN), Python workers read
                       only the row groups holding a late host and merge them with the late rows
  iox-batch sliced     the product's plan, as `bench_wide_overlap.py` runs it

The split prototype's answer is checked against the product's (count, and every sum to 1e-9 relative).

Run: `python benchmarks/bench_wide_designs.py [--hosts 1000 --late-hosts 10 --row-group 8192 --rounds 5]`
(`--db NAME` reuses a database this benchmark or `bench_wide_overlap.py` built).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.dirname(__file__))
from turns import interleaved, median_of  # noqa: E402
from bench_spark import QUERY  # noqa: E402
from bench_wide_overlap import build  # noqa: E402

from iox_planner.catalog.store import Catalog, CatalogSource  # noqa: E402
from iox_planner.config import warehouse  # noqa: E402
from iox_planner.ingest import tsbs  # noqa: E402
from iox_planner.planner import PlannerSettings, plan_query  # noqa: E402


def split_files(chunks: list[Any], root: Path) -> tuple[list[str], list[str]]:
    """Base: the largest Parquet files whose time ranges share no nanosecond; late: the rest."""
    picked, spans = [], []
    for chunk in sorted(chunks, key=lambda c: -(c.rows or 0)):
        disjoint = all(chunk.time_max < lo or chunk.time_min > hi for lo, hi in spans)
        if chunk.kind.value == "parquet" and disjoint:
            spans.append((chunk.time_min, chunk.time_max))
            picked.append(chunk)
    base = [str(root / c.path) for c in sorted(picked, key=lambda c: c.time_min)]  # tasks take neighbours
    late = [str(root / c.path) for c in chunks if str(root / c.path) not in set(base)]
    return base, late


def rewrite(files: list[str], folder: Path, rows: int) -> list[str]:
    out = []
    for i, path in enumerate(files):
        table = pq.read_table(path)
        tags = [f.name for f in table.schema if pa.types.is_string(f.type)]
        target = folder / f"{i:03d}.parquet"
        pq.write_table(table, target, compression="zstd", use_dictionary=tags, row_group_size=rows,
                       store_schema=False)
        out.append(str(target))
    return out


def merge_worker(spec: str) -> Callable[[Any], Any]:
    """The split prototype's Python side: per task, a few base files' row groups that hold a late host, merged
    with the late rows of their time range."""

    def merge(batches: Any) -> Any:
        import pyarrow.compute as pc

        from iox_planner.ingest.dedup import deduplicate_table

        s = json.loads(spec)
        hosts = pa.array(s["hosts"])
        keys = s["tags"] + ["time"]
        for batch in batches:
            for task in batch.column("id").to_pylist():
                parts, spans = [], []
                for path in s["tasks"][task]:
                    f = pq.ParquetFile(path, read_dictionary=s["tags"])
                    column = f.read(columns=[s["host"]], use_threads=False).column(s["host"])
                    rows, offset = [], 0
                    for chunk in column.chunks:
                        codes = np.flatnonzero(pc.is_in(chunk.dictionary, value_set=hosts)
                                               .to_numpy(zero_copy_only=False))
                        rows.append(offset + np.flatnonzero(np.isin(chunk.indices.to_numpy(), codes)))
                        offset += len(chunk)
                    hit = np.concatenate(rows)
                    meta = f.metadata
                    starts = np.concatenate([[0], np.cumsum([meta.row_group(i).num_rows
                                                             for i in range(meta.num_row_groups)])])
                    groups = np.unique(np.searchsorted(starts, hit, side="right") - 1)
                    table = f.read_row_groups(groups.tolist(), columns=keys + s["fields"], use_threads=False)
                    held = np.concatenate([np.arange(starts[g], starts[g + 1]) for g in groups]) \
                        if len(groups) else np.zeros(0, dtype=np.int64)
                    parts.append(table.take(pa.array(np.searchsorted(held, hit))))
                    at = meta.schema.names.index("time")
                    stats = [meta.row_group(i).column(at).statistics for i in range(meta.num_row_groups)]
                    spans.append([("time", ">=", min(x.min for x in stats)), ("time", "<=", max(x.max for x in stats))])
                base_rows = sum(p.num_rows for p in parts)
                for path in s["late"]:  # the late rows inside this task's files' time ranges (base files are disjoint)
                    parts.append(pq.read_table(path, columns=keys + s["fields"], read_dictionary=s["tags"],
                                               filters=spans, use_threads=False))
                table = pa.concat_tables([p.cast(parts[0].schema) for p in parts]).unify_dictionaries()
                order = np.concatenate([np.zeros(base_rows, np.int64), np.ones(table.num_rows - base_rows,
                                                                                np.int64)])
                merged, _ = deduplicate_table(table.combine_chunks(), keys, order)
                yield from merged.select(s["fields"]).to_batches(max_chunksize=65_536)

    return merge


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--late-hosts", type=int, default=10)
    parser.add_argument("--row-group", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--db", help="reuse this database instead of building one")
    parser.add_argument("--late-tag", default="hostname",
                        help="the tag whose late values decide which base rows may meet a late row (TSBS: the host)")
    parser.add_argument("--master", default=os.environ.get("IOX_SPARK_MASTER", "local[2]"))
    args = parser.parse_args()
    console = Console(width=200)

    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from spark_jobs.execute import execute
    from spark_jobs.session import build_session

    catalog = Catalog()
    catalog.require_schema()
    root = warehouse()
    db = args.db or f"bench_designs_{uuid.uuid4().hex[:6]}"
    if not args.db:
        started = time.perf_counter()
        build(catalog, db, args.hosts, args.late_hosts, 10)
        console.print(f"built {db} in {time.perf_counter() - started:.1f} s")
    source = CatalogSource(catalog, db)
    chunks = source.chunks("cpu", None, None)
    base, late = split_files(chunks, root)
    spark = build_session(args.master, app="iox-batch bench wide designs", conf={"spark.driver.memory": "4g"})
    fields = list(tsbs.FIELDS)
    tags = [n for n in pq.read_schema(base[0]).names if n not in fields and n != "time"]
    late_table = pq.read_table(late, columns=tags) if len(late) == 1 else \
        pa.concat_tables([pq.read_table(p, columns=tags) for p in late])
    host = args.late_tag
    hosts = sorted(v for v in set(late_table[host].to_pylist()) if v is not None)
    series = sorted(set(zip(*[late_table[t].to_pylist() for t in tags])), key=str)
    plan = plan_query(QUERY, source, settings=PlannerSettings(max_dedup_rows_per_slice=1_000_000))

    with tempfile.TemporaryDirectory(prefix="iox-designs-") as tmp:
        small = rewrite(base + late, Path(tmp), args.row_group)
        small_base, small_late = small[:len(base)], small[len(base):]
        per_task = 3
        tasks = [small_base[i:i + per_task] for i in range(0, len(small_base), per_task)]
        spec = json.dumps({"tasks": tasks, "late": small_late, "hosts": hosts, "host": host, "tags": tags,
                           "fields": fields})
        out_schema = T.StructType([T.StructField(f, T.DoubleType()) for f in fields])
        late_hosts = ~F.col(host).isin(hosts)

        def agg(df: Any) -> Any:
            return df.agg(F.count("*"), *[F.sum(f) for f in fields]).collect()[0]

        def series_predicate() -> Any:
            any_series = None
            for values in series:
                term = None
                for tag, value in zip(tags, values):
                    equal = F.col(tag).eqNullSafe(F.lit(value))
                    term = equal if term is None else term & equal
                any_series = term if any_series is None else any_series | term
            return any_series

        def outer_join() -> Any:
            def keyed(df: Any, guard: Any) -> list[Any]:
                out = []
                for k in tags + ["time"]:
                    value = F.col(k) if k == "time" else F.coalesce(F.col(k), F.lit("\u0000"))
                    out.append((F.when(guard, value) if guard is not None else value).alias(f"__k_{k}"))
                return out
            lates = spark.read.parquet(*late)
            right = lates.select(*keyed(lates, None), *[F.col(f).alias(f"__l_{f}") for f in fields])
            left = spark.read.parquet(*base)
            joined = left.select(*keyed(left, ~late_hosts), *fields).join(
                F.broadcast(right), on=[f"__k_{k}" for k in tags + ["time"]], how="left")
            return joined.select(*[F.coalesce(F.col(f"__l_{f}"), F.col(f)).alias(f) for f in fields])

        def split() -> Any:
            passing = spark.read.parquet(*small_base).where(late_hosts).select(*fields)
            merged = spark.range(0, len(tasks), 1, numPartitions=len(tasks)).mapInArrow(merge_worker(spec),
                                                                                          out_schema)
            return passing.unionByName(merged)

        variants: dict[str, Callable[[], Any]] = {
            "scan": lambda: agg(spark.read.parquet(*base, *late)),
            f"scan, {args.row_group}-row groups": lambda: agg(spark.read.parquet(*small)),
            "NOT IN late hosts": lambda: agg(spark.read.parquet(*base).where(late_hosts)),
            "row_index filter": lambda: agg(spark.read.parquet(*base).where(F.col("_metadata.row_index") >= 0)),
            "series predicate": lambda: agg(spark.read.parquet(*base).where(~series_predicate())),
            "outer join": lambda: agg(outer_join()),
            "split prototype": lambda: agg(split()),
            "iox-batch sliced": lambda: execute(spark, plan, root).result.collect()[0],
        }
        rounds, answers = interleaved(variants, {}, args.rounds)  # round 0 warms up and is not kept
        reference, candidate = list(answers["iox-batch sliced"]), list(answers["split prototype"])
        assert reference[0] == candidate[0], (reference, candidate)
        for want, got in zip(reference[1:], candidate[1:]):
            assert abs(want - got) <= 1e-9 * max(1.0, abs(want)), (reference, candidate)

    median = {name: median_of(rounds, name) for name in variants}
    report = Table(title=f"wide overlap designs: {len(base)} base files + {len(late)} late, {len(hosts)} late "
                         f"hosts ('{host}'), {args.master}, medians of {args.rounds} rounds")
    for col in ("variant", "median s", "x scan", "rounds"):
        report.add_column(col, justify="right")
    for name in variants:
        report.add_row(name, f"{median[name]:.2f}", f"{median[name] / median['scan']:.2f}x",
                       " ".join(f"{r[name]:.2f}" for r in rounds))
    console.print(report)
    spark.stop()


if __name__ == "__main__":
    main()
