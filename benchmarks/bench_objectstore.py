"""The executor's object-store read path (`spark_jobs/store_read.py`): three comparisons in one run, each pair of
variants taking turns (`turns.py`), each ratio the median of the rounds' own ratios.

  (a) scan:   Parquet files on local disk (`--rows`, default 8 M rows, 4 columns: host, time, usage, value) read
              by the object-store read path (pyarrow in Python workers, `mapInArrow`) against Spark's own Parquet
              reader, both aggregating every column per host. Target: at most 1.3x.
  (b) query:  the same `iox-batch` query (a late batch overlapping every day, so dedups run, and an aggregate)
              over an s3:// warehouse on a local S3 API server (moto's, `tests/s3_support.py`) against the same
              files in a local warehouse. Target: at most 1.5x. The S3 server's own CPU seconds are reported
              beside it: on a real store they are the store's, not the query's.
  (c) local:  the same query over the local warehouse with the executor of `--before` (default: the commit before
              the object-store reader came in) against this one. Target: not slower.

Every variant's result is checked equal to its partner's. Needs the catalog (IOX_CATALOG_URL or the project's
local Postgres) and `moto_server` (requirements.lock). Run: `python benchmarks/bench_objectstore.py [--rows N
--query-rows N --repeat 3]` (`make bench-objectstore`; `--rows 400000 --query-rows 200000 --repeat 1` is a smoke
test).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from turns import interleaved, load_report, median_of, median_ratio  # noqa: E402

from iox_planner.catalog.store import Catalog, CatalogSource  # noqa: E402
from iox_planner.ingest.write import write_table  # noqa: E402
from iox_planner.model import Chunk, ChunkKind, ColumnType  # noqa: E402
from iox_planner.objectstore import local_root, parse_root  # noqa: E402
from iox_planner.planner import plan_query  # noqa: E402

COLUMNS = {"host": ColumnType.TAG, "time": ColumnType.TIME, "usage": ColumnType.FLOAT, "value": ColumnType.INTEGER}
T0 = 1_704_067_200_000_000_000
DAY = 86_400_000_000_000
HOSTS = 1000
QUERY = ("SELECT host, count(*) AS n, sum(usage) AS usage, max(value) AS value, min(time) AS first FROM cpu "
         "GROUP BY host")


def rows_of(count: int, days: int, seed: int) -> pa.Table:
    """`count` rows of HOSTS hosts spread evenly over `days` days (distinct times per host)."""
    rng = np.random.default_rng(seed)
    per_host = max(1, count // HOSTS)
    step = days * DAY // per_host
    hosts = np.repeat(np.arange(HOSTS), per_host)
    times = T0 + np.tile(np.arange(per_host, dtype=np.int64) * step, HOSTS)
    return pa.table({"host": pa.array([f"host_{h:04d}" for h in range(HOSTS)]).take(pa.array(hosts)),
                     "time": pa.array(times, pa.int64()),
                     "usage": pa.array(rng.uniform(0, 100, len(hosts))),
                     "value": pa.array(rng.integers(0, 1000, len(hosts)), pa.int64())})


def scan_files(folder: Path, rows: int, files: int) -> list[Chunk]:
    """(a)'s files, written as a persist writes them (sorted by host and time), as the chunks naming them."""
    table = rows_of(rows, files, seed=1).sort_by([("time", "ascending")])
    per_file = -(-table.num_rows // files)
    chunks = []
    for i in range(files):
        part = table.slice(i * per_file, per_file).sort_by([("host", "ascending"), ("time", "ascending")])
        rel = f"scan/{i}.parquet"
        (folder / "scan").mkdir(parents=True, exist_ok=True)
        pq.write_table(part, folder / rel, row_group_size=128 * 1024)
        chunks.append(Chunk(id=f"S{i}", kind=ChunkKind.PARQUET, table="cpu", partition="p", order=i + 1,
                            time_min=None, time_max=None, columns=COLUMNS, rows=part.num_rows, path=rel,
                            file_size=(folder / rel).stat().st_size))
    return chunks


def before_package(ref: str, into: Path) -> str:
    """The executor (`spark_jobs/`) as it was at `ref`, importable as `iox_before` (its own imports renamed), for
    (c). The planner and the rest stay this checkout's: the executor is what changed."""
    repo = HERE.parent
    package = into / "iox_before"
    package.mkdir(parents=True)
    names = subprocess.run(["git", "-C", str(repo), "ls-tree", "--name-only", f"{ref}:spark_jobs"],
                           capture_output=True, text=True, check=True).stdout.split()
    for name in names:
        if name.endswith(".py"):
            text = subprocess.run(["git", "-C", str(repo), "show", f"{ref}:spark_jobs/{name}"], capture_output=True,
                                  text=True, check=True).stdout
            (package / name).write_text(re.sub(r"\bspark_jobs\.", "iox_before.", text))
    return str(into)


def default_before() -> str:
    """The commit before the one that added the object-store reader."""
    added = subprocess.run(["git", "-C", str(HERE.parent), "log", "--diff-filter=A", "--format=%H", "--",
                            "spark_jobs/store_read.py"], capture_output=True, text=True, check=True).stdout.split()
    return f"{added[-1]}~1" if added else "HEAD"


def same(a: Any, b: Any) -> None:
    """Two results of one aggregate, sorted rows, equal (sums to a relative 1e-9)."""
    left, right = sorted(map(tuple, a)), sorted(map(tuple, b))
    assert len(left) == len(right), (len(left), len(right))
    for x, y in zip(left, right):
        for u, v in zip(x, y):
            assert u == v or (isinstance(u, float) and abs(u - v) <= 1e-9 * max(1.0, abs(v))), (x, y)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:13]) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=8_000_000, help="rows of (a)'s scan")
    parser.add_argument("--files", type=int, default=8, help="files of (a)'s scan")
    parser.add_argument("--query-rows", type=int, default=4_000_000, help="rows of (b) and (c)'s table")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", help="the commit (c) compares with (default: before the object-store reader)")
    parser.add_argument("--master", default=os.environ.get("IOX_SPARK_MASTER", "local[2]"))
    args = parser.parse_args()
    console = Console(width=200)
    load_start = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="iox-bench-objectstore-"))
    from s3_support import S3Server, fresh_prefix

    server = S3Server()  # before the session: Spark's Python workers inherit the AWS_* settings
    os.environ.update(server.env())
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [before_package(args.before or default_before(), tmp),
                                                             os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(tmp))
    catalog = Catalog()
    catalog.require_schema()
    db = f"bench_store_{uuid.uuid4().hex[:6]}"
    try:
        from pyspark.sql import functions as F

        from iox_before.execute import execute as execute_before  # type: ignore[import-not-found]
        from spark_jobs.execute import ScanBuilder, execute
        from spark_jobs.session import build_session
        from spark_jobs.transform import file_type

        spark = build_session(args.master, app="iox-batch bench objectstore", conf={"spark.driver.memory": "3g"})
        report = Table(title=f"the object-store read path, {args.master}; medians of {args.repeat} rounds taking turns")
        for col in ("comparison", "rows", "variant", "seconds", "other variant", "seconds", "ratio", "note"):
            report.add_column(col, justify="right")

        # (a) the read path alone, on local disk.
        started = time.perf_counter()
        chunks = scan_files(tmp / "files", args.rows, args.files)
        console.print(f"(a) {args.rows:,} rows in {args.files} files written in {time.perf_counter() - started:.1f} s")
        scan_root = local_root(tmp / "files")
        projection = list(COLUMNS)

        def aggregate(df: Any) -> Any:
            return df.groupBy("host").agg(F.count("*"), F.sum("usage"), F.max("value"), F.min("time")).collect()

        schema = ScanBuilder(spark, scan_root, COLUMNS).schema_for(projection)
        assert [f.dataType for f in schema.fields] == [file_type(COLUMNS[c]) for c in projection]
        native_paths = [scan_root.path(c.path) for c in chunks if c.path]
        variants: dict[str, Callable[[], Any]] = {
            "store reader": lambda: aggregate(ScanBuilder(spark, scan_root, COLUMNS)._read_store(
                chunks, projection, None, (None, None))),
            "Spark reader": lambda: aggregate(spark.read.schema(schema).parquet(*native_paths)),
        }
        rounds, results = interleaved(variants, {}, args.repeat)
        same(results["store reader"], results["Spark reader"])
        report.add_row("(a) scan, local disk", f"{args.rows:,}", "store reader",
                       f"{median_of(rounds, 'store reader'):.2f}",
                       "Spark reader", f"{median_of(rounds, 'Spark reader'):.2f}",
                       f"{median_ratio(rounds, 'store reader', 'Spark reader'):.2f}x", "target <= 1.3x")

        # (b) and (c): a query through the catalog, the files in a local warehouse and, byte for byte, on a store.
        local = local_root(tmp / "lake")
        store = parse_root(fresh_prefix())
        started = time.perf_counter()
        days = 4
        write_table(catalog, db, "cpu", rows_of(args.query_rows, days, seed=2), COLUMNS, warehouse=local)
        late = rows_of(args.query_rows // 20, days, seed=3)  # 5%: every day's partition gets a dedup group
        write_table(catalog, db, "cpu", late, COLUMNS, warehouse=local)
        plan = plan_query(QUERY, CatalogSource(catalog, db))
        files = [c.path for c in plan.chunks().values() if c.path]
        for rel in files:
            store.put_bytes(local.read_bytes(rel), rel)
        console.print(f"(b) {args.query_rows:,} rows + a late {late.num_rows:,} in {len(files)} files written in "
                      f"{time.perf_counter() - started:.1f} s")

        server_cpu = {"s3": 0.0}

        def on_store() -> Any:
            before = cpu_seconds(server.process.pid)
            rows = execute(spark, plan, store).result.collect()
            server_cpu["s3"] += cpu_seconds(server.process.pid) - before
            return rows

        variants = {"s3 warehouse": on_store, "local warehouse": lambda: execute(spark, plan, local).result.collect()}
        rounds, results = interleaved(variants, {}, args.repeat)
        same(results["s3 warehouse"], results["local warehouse"])
        on_s3 = median_of(rounds, "s3 warehouse")
        share = server_cpu["s3"] / (args.repeat + 1) / on_s3
        report.add_row("(b) query, s3 vs local", f"{args.query_rows + late.num_rows:,}", "s3 warehouse",
                       f"{on_s3:.2f}",
                       "local warehouse", f"{median_of(rounds, 'local warehouse'):.2f}",
                       f"{median_ratio(rounds, 's3 warehouse', 'local warehouse'):.2f}x",
                       f"target <= 1.5x; S3 server CPU {server_cpu['s3'] / (args.repeat + 1):.2f} s a query "
                       f"({share:.0%} of its wall time)")

        local_path = Path(local.uri)
        variants = {"after": lambda: execute(spark, plan, local).result.collect(),
                    "before": lambda: execute_before(spark, plan, local_path).result.collect()}
        rounds, results = interleaved(variants, {}, args.repeat)
        same(results["after"], results["before"])
        report.add_row("(c) local warehouse", f"{args.query_rows + late.num_rows:,}", "after",
                       f"{median_of(rounds, 'after'):.2f}",
                       "before", f"{median_of(rounds, 'before'):.2f}",
                       f"{median_ratio(rounds, 'after', 'before'):.2f}x", "target <= 1.0x (noise aside)")
        console.print(report)
        console.print(load_report(load_start))
    finally:
        from iox_planner.catalog.drops import drop_database

        try:
            drop_database(catalog, db, tmp / "lake")
        except Exception:  # noqa: BLE001 - the database may not exist when the run failed early
            pass
        catalog.dispose()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
