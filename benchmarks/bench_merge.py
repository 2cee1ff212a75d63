"""Merge-kernel benchmark: the one Arrow IOx dedup (`ingest/dedup.py`) against library candidates, on one core,
on the same TSBS-like inputs as persist, compaction and the query-time merge hand them over (tags
dictionary-encoded as read from Parquet, rows oldest chunk first, each row's packed write order).

Scenarios (`--hosts` sets their size):
  - compaction: a compaction slice: 12 hourly files and a rewrite of each (changed and omitted fields), all
    Parquet, each sorted on the partition's sort key (at 50 hosts: 432,000 rows, the issue's slice);
  - persist:    ingester chunks as written (time-major, so not sorted on the key): 4 hours, a rewrite of one
                hour in its own chunk and a chunk that writes one hour's points twice (duplicates inside it);
  - mixed:      a query's group with unpersisted data: 6 sorted hourly files plus one ingester chunk rewriting
                an hour and a half of them;
  - wide:       the query-time merge of the wide overlap (`deduplicate_parts`): 24 hourly files plus one late
                file of a tenth of the hosts across the day; only that tenth's series are merged.
Variants (each merges the same rows and must give the kernel's result, checked before timing):
  - kernel:   `dedup.deduplicate_table`: key codes folded into one int64, a stable (run-finding) sort, per-column
              last non-null by `maximum.reduceat`;
  - lexsort:  the same kernel with its run-finding sort replaced by a full lexsort (everything sorted again);
  - baseline: a `dedup.py` named with `--baseline FILE` (the sort-everything merge this kernel replaced:
              `git show <commit>:plugins/iox_planner/ingest/dedup.py > FILE`);
  - duckdb:   one GROUP BY over the Arrow table, `arg_max(f, order) FILTER (WHERE f IS NOT NULL)` per field,
              ORDER BY the keys NULLS FIRST, one thread;
  - polars:   `group_by` + `last(ignore_nulls=True)` per field, then sorted on the keys, one thread (only when
              polars imports: it is not a project dependency);
  - arrow:    pyarrow's own hash `group_by` (`last` skips NULLs; in input order with use_threads=False), then
              `sort_by` the keys.
The variants take turns in every round, in reverse order every other round, after a warm-up round; the table
shows each variant's median rows in per second and each variant's time over the kernel's as the median of the
rounds' own ratios. The load average is printed: on a shared machine trust the ratios, not the seconds.

Run: `python benchmarks/bench_merge.py [--hosts 50 --repeat 5 --baseline FILE --scenarios compaction,persist]`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Callable, Sequence

os.environ.setdefault("POLARS_MAX_THREADS", "1")  # before polars is imported: one core, as the others

sys.path.insert(0, os.path.dirname(__file__))
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from turns import interleaved, load_report, median_of, median_ratio  # noqa: E402
from bench_spark import COLUMNS, hour_table, rewrite_of  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from iox_planner.ingest import dedup  # noqa: E402
from iox_planner import storage  # noqa: E402
from iox_planner.ingest import files as chunk_files  # noqa: E402
from iox_planner.ingest.dedup import Part  # noqa: E402
from iox_planner.model import TIME, WRITE_SEQ, pack_order  # noqa: E402
from iox_planner.ingest.tsbs import FIELDS, TAGS  # noqa: E402

ORDER = "__order"
KERNEL = dedup.deduplicate_table  # `Scenario.run` swaps the module's function for the variant's on the wide path
Merge = Callable[[pa.Table, Sequence[str], np.ndarray], tuple[pa.Table, np.ndarray]]


class Scenario:
    """One merge's input: the rows (all chunks concatenated, oldest first), the keys in sort-key order, each
    row's packed write order, and the chunks as `dedup.Part`s (for `deduplicate_parts`)."""

    def __init__(self, name: str, chunks: Sequence[tuple[pa.Table, bool]], keys: Sequence[str],
                 parts_path: bool = False) -> None:
        self.name = name
        self.keys = list(keys)
        self.parts_path = parts_path
        schema = pa.schema([pa.field(t, pa.dictionary(pa.int32(), pa.string())) for t in TAGS]
                           + [pa.field(f, pa.float64()) for f in FIELDS] + [pa.field(TIME, pa.int64())])
        tables, orders, self.parts = [], [], []
        for number, (table, ingester) in enumerate(chunks, start=1):
            seq = (table[WRITE_SEQ].to_numpy() if ingester else np.zeros(table.num_rows)).astype(np.int64)
            orders.append(pack_order(number, 0) + seq)
            tables.append(pa.Table.from_arrays([table[f.name].cast(f.type) for f in schema], schema=schema))
            self.parts.append(Part(table.num_rows, duplicate_free=not ingester))
        self.table = pa.concat_tables(tables).unify_dictionaries().combine_chunks()
        self.order = np.concatenate(orders)

    def run(self, merge: Merge) -> tuple[pa.Table, np.ndarray]:
        if not self.parts_path:
            return merge(self.table, self.keys, self.order)
        plain = dedup.deduplicate_table
        dedup.deduplicate_table = merge  # deduplicate_parts merges its rows through the module's function
        try:
            return dedup.deduplicate_parts(self.table, self.keys, self.order, self.parts, TIME)
        finally:
            dedup.deduplicate_table = plain


def _sorted_file(table: pa.Table, key: Sequence[str], folder: Path, name: str) -> pa.Table:
    """`table` persisted as a Parquet file is (sorted on the key, zstd, dictionaries) and read back as
    compaction and the workers read it (tags dictionary-encoded)."""
    path = folder / f"{name}.parquet"
    storage.write_parquet_atomic(chunk_files.sort_table(table, key), path, store_schema=False)
    return pq.read_table(path, read_dictionary=list(TAGS))


def _ingester(table: pa.Table, seq_from: int = 0) -> pa.Table:
    """Rows as an ingester chunk holds them: in write order (time-major, every host per timestamp), `__seq`."""
    rows = table.take(pc.sort_indices(table, [(TIME, "ascending")]))
    return rows.append_column(WRITE_SEQ, pa.array(np.arange(seq_from, seq_from + rows.num_rows, dtype=np.int64)))


def build(hosts: int, folder: Path, names: Sequence[str]) -> list[Scenario]:
    rng = np.random.default_rng(42)
    walk = rng.uniform(0, 100, (hosts, len(FIELDS)))
    hours = [hour_table(rng, hosts, h, 10, walk) for h in range(24)]
    key = chunk_files.derive_sort_key(hours[0], COLUMNS)
    files = [_sorted_file(t, key, folder, f"h{h}") for h, t in enumerate(hours)]
    out = []
    if "compaction" in names:
        rewrites = [_sorted_file(rewrite_of(rng, hours[h]), key, folder, f"r{h}") for h in range(12)]
        out.append(Scenario("compaction", [(f, False) for f in files[:12]] + [(r, False) for r in rewrites], key))
    if "persist" in names:
        twice = pa.concat_tables([rewrite_of(rng, hours[3]), rewrite_of(rng, hours[3])])
        chunks = [_ingester(t) for t in hours[:4]] + [_ingester(rewrite_of(rng, hours[1])), _ingester(twice)]
        out.append(Scenario("persist", [(c, True) for c in chunks], key))
    if "mixed" in names:
        late = pa.concat_tables([rewrite_of(rng, hours[2]), rewrite_of(rng, hours[3]).slice(0, hours[3].num_rows // 2)])
        out.append(Scenario("mixed", [(f, False) for f in files[:6]] + [(_ingester(late), True)], key))
    if "wide" in names:
        few = pa.array([f"host_{h}" for h in range(max(1, hosts // 10))])
        late = pa.concat_tables([t.filter(pc.is_in(t["hostname"], value_set=few)) for t in hours])
        late_file = _sorted_file(rewrite_of(rng, late), key, folder, "late")
        out.append(Scenario("wide", [(f, False) for f in files] + [(late_file, False)], key, parts_path=True))
    return out


# --- the candidates ------------------------------------------------------------------------------------------


def lexsort_kernel(table: pa.Table, keys: Sequence[str], order: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    plain = dedup._merge_order
    dedup._merge_order = lambda key, o: np.lexsort([o, key])
    try:
        return KERNEL(table, keys, order)
    finally:
        dedup._merge_order = plain


def _with_order(table: pa.Table, order: np.ndarray) -> pa.Table:
    return table.append_column(ORDER, pa.array(order, pa.int64()))


def _split(result: pa.Table, columns: Sequence[str]) -> tuple[pa.Table, np.ndarray]:
    return result.select(list(columns)), result[ORDER].to_numpy()


def duckdb_merge(table: pa.Table, keys: Sequence[str], order: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads = 1")
    con.register("rows_in", _with_order(table, order))
    fields = [c for c in table.column_names if c not in keys]
    select = [f'"{k}"' for k in keys] + [f'arg_max("{f}", {ORDER}) FILTER (WHERE "{f}" IS NOT NULL) AS "{f}"'
                                          for f in fields] + [f"max({ORDER}) AS {ORDER}"]
    # DuckDB reads dictionary-encoded tags as VARCHAR: ordered by value, as the kernel orders them.
    sql = (f"SELECT {', '.join(select)} FROM rows_in GROUP BY {', '.join(f'{chr(34)}{k}{chr(34)}' for k in keys)} "
           f"ORDER BY {', '.join(f'{chr(34)}{k}{chr(34)} ASC NULLS FIRST' for k in keys)}")
    result = con.sql(sql).to_arrow_table()
    con.close()
    return _split(result, table.column_names)


def polars_merge(table: pa.Table, keys: Sequence[str], order: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    import polars as pl

    frame = pl.from_arrow(_with_order(table, order))
    assert isinstance(frame, pl.DataFrame)
    fields = [c for c in table.column_names if c not in keys]
    # Rows are in write order (the scenarios concatenate chunks oldest first): `last` inside a group is the newest.
    tags = [k for k in keys if frame.schema[k] != pl.Int64]
    merged = (frame.with_columns([pl.col(t).cast(pl.String) for t in tags])
              .group_by(keys).agg([pl.col(f).last(ignore_nulls=True) for f in fields] + [pl.col(ORDER).max()])
              .sort(keys, nulls_last=False))
    return _split(merged.to_arrow(), table.column_names)


def arrow_merge(table: pa.Table, keys: Sequence[str], order: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    fields = [c for c in table.column_names if c not in keys]
    grouped = _with_order(table, order).group_by(keys, use_threads=False).aggregate(
        [(f, "last") for f in fields] + [(ORDER, "max")])
    grouped = grouped.rename_columns([c.removesuffix("_last").removesuffix("_max") for c in grouped.column_names])
    # Arrow sorts a table on plain columns only: the grouped tags are cast to strings first.
    grouped = pa.table({c: grouped[c].cast(pa.string()) if pa.types.is_dictionary(grouped[c].type) else grouped[c]
                        for c in grouped.column_names})
    ordered = grouped.sort_by([(k, "ascending", "at_start") for k in keys])
    return _split(ordered, table.column_names)


def load_baseline(path: str) -> Merge:
    spec = importlib.util.spec_from_file_location("baseline_dedup", path)
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    merge: Merge = module.deduplicate_table
    return merge


# --- the run -------------------------------------------------------------------------------------------------


def _canonical(result: tuple[pa.Table, np.ndarray], columns: Sequence[str], keys: Sequence[str],
               ordered: bool) -> pa.Table:
    """A result comparable across variants: tags as plain strings, the order as a column, sorted on the keys
    when the merge does not promise an order (`deduplicate_parts`)."""
    table, order = result
    table = pa.table({c: table[c].cast(pa.string()) if c in TAGS else table[c] for c in columns})
    table = table.append_column(ORDER, pa.array(order, pa.int64()))
    if not ordered:
        table = table.sort_by([(k, "ascending", "at_start") for k in keys])
    return table.combine_chunks()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--scenarios", default="compaction,persist,mixed,wide")
    parser.add_argument("--variants", default="kernel,lexsort,baseline,duckdb,polars,arrow")
    parser.add_argument("--baseline", help="a dedup.py to load as the 'baseline' variant")
    args = parser.parse_args()
    console = Console(width=200)
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)

    candidates: dict[str, Merge] = {"kernel": KERNEL, "lexsort": lexsort_kernel,
                                    "duckdb": duckdb_merge, "arrow": arrow_merge}
    if args.baseline:
        candidates["baseline"] = load_baseline(args.baseline)
    try:
        import polars  # noqa: F401

        candidates["polars"] = polars_merge
    except ImportError:
        console.print("polars is not installed: its variant is skipped")
    chosen = [v for v in args.variants.split(",") if v in candidates]

    load_start = os.getloadavg()
    report = Table(title=f"IOx dedup merge, {args.hosts} hosts, one core; medians of {args.repeat} rounds "
                         "(rows in per second; time over the kernel's)")
    report.add_column("scenario")
    report.add_column("rows in", justify="right")
    report.add_column("rows out", justify="right")
    for name in chosen:
        report.add_column(f"{name} rows/s", justify="right")
        if name != "kernel":
            report.add_column(f"{name}/kernel", justify="right")
    with tempfile.TemporaryDirectory(prefix="iox-bench-merge-") as tmp:
        scenarios = build(args.hosts, Path(tmp), args.scenarios.split(","))
    for scenario in scenarios:
        columns = scenario.table.column_names
        expected = _canonical(scenario.run(KERNEL), columns, scenario.keys, not scenario.parts_path)
        for name in chosen:
            got = _canonical(scenario.run(candidates[name]), columns, scenario.keys, not scenario.parts_path)
            assert got.equals(expected), f"{scenario.name}: {name} differs from the kernel: {got.schema} {expected.schema}"
        rounds, _ = interleaved({name: (lambda m=candidates[name]: scenario.run(m)) for name in chosen}, {},
                                args.repeat)
        rows_in = scenario.table.num_rows
        cells = [scenario.name, f"{rows_in:,}", f"{expected.num_rows:,}"]
        for name in chosen:
            cells.append(f"{rows_in / median_of(rounds, name):,.0f}")
            if name != "kernel":
                cells.append(f"{median_ratio(rounds, name, 'kernel'):.2f}x")
        report.add_row(*cells)
        console.print(f"  {scenario.name}: " + "; ".join(
            f"{n} " + " ".join(f"{r[n]:.3f}" for r in rounds) for n in chosen))
    console.print(report)
    console.print(load_report(load_start))


if __name__ == "__main__":
    main()
