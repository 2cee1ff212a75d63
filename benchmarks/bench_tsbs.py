"""TSBS query-suite benchmark: the cpu-only query types of the Time Series Benchmark Suite (devops use case) as Spark
SQL over the project's `cpu` table, iox-batch against a plain scan of the same Parquet files.

Builds a duplicate-free TSBS-style cpu data set (`bench_spark.py`'s generator: `--hosts` hosts x `--hours` hourly
Parquet files of 10 s samples, TSBS's tags and ten usage fields), then writes each query type as TSBS phrases it
(hosts and time windows drawn by a seeded generator, as `tsbs_generate_queries` draws them):
  single-groupby-M-H-T  max of M fields per minute for H hosts over T hours;
  cpu-max-all-H         max of all ten fields per hour for H hosts over 8 hours;
  double-groupby-M      mean of M fields per hour and host over 12 hours, every host;
  high-cpu-H            every reading with usage_user > 90 over 12 hours, H hosts or all;
  lastpoint             each host's last reading;
  groupby-orderby-limit the last 5 minutes' max of usage_user before a point in time.
Every query's answer from iox-batch is checked equal to the plain scan's (same rows, in the same order where the
query orders them; floats to 1e-9 relative) before anything is timed: on duplicate-free files the plain scan's
answer is the answer. (An empty answer, which high-cpu-1 may have on a small data set, checks little: the `rows`
column shows it.) Then:
  - one session: on one SparkSession, `iox` (the planner's plan through the product's query path: `plan_query`,
    `execute`, the result fetched as Arrow as the CLI fetches one it prints) and `plain` (`tsbs_plain.plain_view`
    over the files, the same SQL, fetched as Arrow) for
    every query type take turns (`--repeat` rounds after a warm-up round, reversed every other round); medians
    and the median of the rounds' own iox/plain ratios per query type;
  - whole processes (`--process-rounds`, 0 to skip; each run starts a JVM): `iox-batch query --format parquet
    --output DIR` (IOX_RUNNER=in-process), the same over Spark Connect (IOX_RUNNER=connect, on the project's own
    server, `iox-batch spark start`: started here if it is not running and stopped again at the end; `--no-connect`
    leaves it out) and `python benchmarks/tsbs_plain.py` (a fresh SparkSession, the view, the query, Parquet
    written by Spark), taking turns for each of `--process-queries`; the outputs are checked equal too.

Run: `python benchmarks/bench_tsbs.py [--hosts 200 --hours 24 --repeat 3 --process-rounds 2]` (`make bench-tsbs`;
`--hosts 10 --hours 12 --repeat 1 --process-rounds 0` is a smoke test).
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from turns import interleaved, load_report, median_of, median_ratio  # noqa: E402
from bench_spark import T0, build  # noqa: E402
from tsbs_plain import plain_view  # noqa: E402

from iox_planner.catalog.drops import drop_database  # noqa: E402
from iox_planner.catalog.store import Catalog, CatalogSource  # noqa: E402
from iox_planner.config import warehouse  # noqa: E402
from iox_planner.ingest import tsbs  # noqa: E402
from iox_planner.model import NS_PREFIX  # noqa: E402
from iox_planner.planner import plan_query  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HOUR_S = 3600
# What `--process-queries` runs by default: one query of each TSBS family.
PROCESS_DEFAULT = "single-groupby-1-1-1,cpu-max-all-8,double-groupby-1,high-cpu-all,lastpoint,groupby-orderby-limit"


def tsbs_queries(hosts: int, hours: int, seed: int) -> dict[str, str]:
    """The cpu-only query types as Spark SQL, TSBS's shapes (its TimescaleDB and ClickHouse forms), each with its
    hosts and window drawn from `seed`."""
    rng = random.Random(seed)

    def ts(hour: int) -> str:
        return "TIMESTAMP '" + dt.datetime.fromtimestamp(T0 // 10**9 + hour * HOUR_S, dt.timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S") + "'"

    def window(length: int) -> str:
        start = rng.randrange(0, hours - length + 1)
        return f"time >= {ts(start)} AND time < {ts(start + length)}"

    def some_hosts(n: int) -> str:
        return "hostname IN (" + ", ".join(f"'host_{h}'" for h in sorted(rng.sample(range(hosts), n))) + ")"

    def maxes(fields: Sequence[str]) -> str:
        return ", ".join(f"max({f}) AS max_{f}" for f in fields)

    out: dict[str, str] = {}
    for metrics, nhosts, length in ((1, 1, 1), (1, 1, 12), (1, 8, 1), (5, 1, 1), (5, 1, 12), (5, 8, 1)):
        out[f"single-groupby-{metrics}-{nhosts}-{length}"] = (
            f"SELECT date_trunc('MINUTE', time) AS minute, {maxes(tsbs.FIELDS[:metrics])} FROM cpu "
            f"WHERE {some_hosts(nhosts)} AND {window(length)} GROUP BY 1 ORDER BY 1")
    for nhosts in (1, 8):
        out[f"cpu-max-all-{nhosts}"] = (
            f"SELECT date_trunc('HOUR', time) AS hour, {maxes(tsbs.FIELDS)} FROM cpu "
            f"WHERE {some_hosts(nhosts)} AND {window(8)} GROUP BY 1 ORDER BY 1")
    for label, metrics in (("1", 1), ("5", 5), ("all", len(tsbs.FIELDS))):
        means = ", ".join(f"avg({f}) AS mean_{f}" for f in tsbs.FIELDS[:metrics])
        out[f"double-groupby-{label}"] = (
            f"SELECT date_trunc('HOUR', time) AS hour, hostname, {means} FROM cpu WHERE {window(12)} "
            "GROUP BY 1, 2 ORDER BY 1, 2")
    out["high-cpu-1"] = f"SELECT * FROM cpu WHERE usage_user > 90.0 AND {some_hosts(1)} AND {window(12)}"
    out["high-cpu-all"] = f"SELECT * FROM cpu WHERE usage_user > 90.0 AND {window(12)}"
    out["lastpoint"] = ("SELECT c.* FROM cpu c JOIN (SELECT hostname, max(time) AS last FROM cpu GROUP BY hostname) l "
                        "ON c.hostname = l.hostname AND c.time = l.last")
    out["groupby-orderby-limit"] = (
        f"SELECT date_trunc('MINUTE', time) AS minute, max(usage_user) AS max_usage_user FROM cpu "
        f"WHERE time < {ts(rng.randrange(1, hours + 1))} GROUP BY 1 ORDER BY 1 DESC LIMIT 5")
    return out


def _value(v: Any) -> Any:
    """A result value compared across Spark's Python rows and Parquet read back by pyarrow: timestamps as UTC
    naive datetimes (Spark writes them as INT96 without a zone, iox-batch as UTC microseconds)."""
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return v.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return v


def difference(got: Sequence[Mapping[str, Any]], expected: Sequence[Mapping[str, Any]], ordered: bool) -> str | None:
    """Why two results differ, or None when they are the same rows (in the same order when `ordered`)."""
    def norm(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        out = [{k: _value(v) for k, v in r.items()} for r in rows]
        if not ordered:
            out.sort(key=lambda r: tuple(sorted((k, repr(v)) for k, v in r.items() if not isinstance(v, float))))
        return out

    a, b = norm(got), norm(expected)
    if len(a) != len(b):
        return f"{len(a)} rows, expected {len(b)}"
    for i, (ra, rb) in enumerate(zip(a, b)):
        if set(ra) != set(rb):
            return f"columns {sorted(ra)}, expected {sorted(rb)}"
        for k in ra:
            x, y = ra[k], rb[k]
            same = (math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9) if isinstance(x, float) and isinstance(y, float)
                    else x == y)
            if not same:
                return f"row {i} column {k}: {x!r}, expected {y!r}"
    return None


def _rows(table: Any) -> list[dict[str, Any]]:
    """An Arrow result's rows without the planner's nanosecond helpers (`__iox_ns_<name>`: the product folds them
    into `<name>` when it prints and drops them when it writes Parquet; the plain scan has none)."""
    return [{k: v for k, v in r.items() if not k.startswith(NS_PREFIX)} for r in table.to_pylist()]


def _parquet_rows(folder: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return _rows(pq.read_table(folder))


def connect_server(console: Console) -> Callable[[], None]:
    """The project's Spark Connect server running; returns how to put things back as they were (stop it only if
    this benchmark started it)."""
    cli = str(REPO / ".venv" / "bin" / "iox-batch")
    if subprocess.run([cli, "spark", "status"], cwd=REPO, capture_output=True).returncode == 0:
        return lambda: None
    console.print("starting the project's Spark Connect server (iox-batch spark start)")
    subprocess.run([cli, "spark", "start"], cwd=REPO, check=True, capture_output=True)

    def stop() -> None:
        subprocess.run([cli, "spark", "stop"], cwd=REPO, check=False, capture_output=True)

    return stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--hours", type=int, default=24, help="at least 12 (the longest TSBS window)")
    parser.add_argument("--interval", type=int, default=10)
    parser.add_argument("--seed", type=int, default=123)
    parser.add_argument("--repeat", type=int, default=3, help="one-session rounds after the warm-up round")
    parser.add_argument("--queries", default="all", help="query types of the one-session run, separated by ','")
    parser.add_argument("--process-rounds", type=int, default=2, help="whole-process rounds (0: none)")
    parser.add_argument("--process-queries", default=PROCESS_DEFAULT)
    parser.add_argument("--no-connect", action="store_true", help="no whole-process run over Spark Connect")
    parser.add_argument("--master", default=os.environ.get("IOX_SPARK_MASTER", "local[2]"))
    args = parser.parse_args()
    if args.hours < 12 or args.hosts < 8:
        parser.error("--hours must be at least 12 and --hosts at least 8 (TSBS's windows and host sets)")
    queries = tsbs_queries(args.hosts, args.hours, args.seed)
    session_names = list(queries) if args.queries == "all" else args.queries.split(",")
    process_names = [] if args.process_rounds < 1 else args.process_queries.split(",")
    unknown = [n for n in [*session_names, *process_names] if n not in queries]
    if unknown:
        parser.error(f"unknown query types {unknown}; known: {', '.join(queries)}")
    console = Console(width=200)

    from spark_jobs.execute import execute
    from spark_jobs.load import result_to_arrow
    from spark_jobs.session import build_session

    catalog = Catalog()
    catalog.require_schema()
    root = warehouse()
    db = f"bench_tsbs_{uuid.uuid4().hex[:6]}"
    load_start = os.getloadavg()
    started = time.perf_counter()
    stored = build(catalog, db, args.hosts, args.hours, args.interval, 0.0)
    files = sorted(str(root / c.path) for c in plan_query("SELECT * FROM cpu", CatalogSource(catalog, db))
                   .chunks().values() if c.path)
    console.print(f"built {db}: {stored:,} rows, {len(files)} files ({args.hosts} hosts x {args.hours} h, no "
                  f"duplicates) in {time.perf_counter() - started:.1f} s")
    for name in session_names:
        console.print(f"  {name}: {queries[name]}", markup=False, highlight=False)

    spark = build_session(args.master, app="iox-batch bench tsbs", conf={"spark.driver.memory": "4g"})

    # Both results come to the driver as Arrow, as the product fetches a result it prints (`result_to_arrow`).
    def iox(sql: str) -> Any:
        return result_to_arrow(execute(spark, plan_query(sql, CatalogSource(catalog, db)), root).result)

    def plain(sql: str) -> Any:
        plain_view(spark, files)
        return spark.sql(sql).toArrow()

    result_rows = {}
    for name in session_names:
        got, expected = _rows(iox(queries[name])), _rows(plain(queries[name]))
        why = difference(got, expected, "ORDER BY" in queries[name])
        assert why is None, f"{name}: iox-batch's answer differs from the plain scan's: {why}"
        result_rows[name] = len(expected)
    variants: dict[str, Callable[[], Any]] = {}
    for name in session_names:
        variants[f"iox {name}"] = (lambda sql: lambda: iox(sql))(queries[name])
        variants[f"plain {name}"] = (lambda sql: lambda: plain(sql))(queries[name])
    rounds, _ = interleaved(variants, {}, args.repeat)
    spark.stop()

    session = Table(title=f"TSBS cpu-only queries, one session ({args.master}): {stored:,} rows, {args.hosts} hosts x "
                          f"{args.hours} h; medians of {args.repeat} rounds taking turns")
    for col in ("query type", "rows", "iox s", "plain s", "iox/plain"):
        session.add_column(col, justify="right")
    for name in session_names:
        session.add_row(name, f"{result_rows[name]:,}", f"{median_of(rounds, f'iox {name}'):.3f}",
                        f"{median_of(rounds, f'plain {name}'):.3f}",
                        f"{median_ratio(rounds, f'iox {name}', f'plain {name}'):.2f}x")
    console.print(session)

    if process_names:
        processes(console, args, db, files, {n: queries[n] for n in process_names})
    console.print(load_report(load_start))
    drop_database(catalog, db, root)


def processes(console: Console, args: argparse.Namespace, db: str, files: Sequence[str],
              queries: Mapping[str, str]) -> None:
    """Each query as whole processes taking turns: iox-batch in-process, iox-batch over Connect, the plain
    script; each output checked equal to the plain script's."""
    python, cli = str(REPO / ".venv" / "bin" / "python"), str(REPO / ".venv" / "bin" / "iox-batch")
    restore = (lambda: None) if args.no_connect else connect_server(console)
    tmp = Path(tempfile.mkdtemp(prefix="iox-bench-tsbs-"))
    try:
        (tmp / "files.txt").write_text("\n".join(files) + "\n")
        env = {**os.environ, "IOX_SPARK_MASTER": args.master}
        runner = {"iox": "in-process", "iox connect": "connect"}
        names = ["iox", "plain"] if args.no_connect else ["iox", "iox connect", "plain"]
        timings: list[dict[str, float]] = []
        for name, sql in queries.items():
            (tmp / f"{name}.sql").write_text(sql)
        for round_ in range(args.process_rounds):
            times: dict[str, float] = {}
            for qname, sql in queries.items():
                outputs = {}
                for variant in (names if round_ % 2 == 0 else names[::-1]):
                    out = tmp / f"{qname}-{variant.replace(' ', '-')}-{round_}"
                    if variant == "plain":
                        cmd, venv = [python, str(REPO / "benchmarks" / "tsbs_plain.py"), "--files",
                                     str(tmp / "files.txt"), "--output", str(out), "--sql-file",
                                     str(tmp / f"{qname}.sql")], env
                    else:
                        cmd = [cli, "query", "--db", db, "--format", "parquet", "--output", str(out),
                               "--sql-file", str(tmp / f"{qname}.sql")]
                        venv = {**env, "IOX_RUNNER": runner[variant]}
                    t = time.perf_counter()
                    done = subprocess.run(cmd, cwd=REPO, env=venv, capture_output=True, text=True)
                    times[f"{variant} {qname}"] = time.perf_counter() - t
                    if done.returncode != 0:
                        raise SystemExit(f"{variant} {qname} failed ({done.returncode}):\n{done.stderr[-3000:]}")
                    outputs[variant] = _parquet_rows(out)
                for variant in names:
                    why = difference(outputs[variant], outputs["plain"], ordered=False)
                    assert why is None, f"{qname}: {variant}'s output differs from the plain script's: {why}"
                console.print(f"  process round {round_ + 1} {qname}: " + ", ".join(
                    f"{v} {times[f'{v} {qname}']:.2f} s" for v in names))
            timings.append(times)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        restore()
    table = Table(title=f"TSBS cpu-only queries as whole processes (a JVM each; the connect variant on a warm "
                        f"server): medians of {args.process_rounds} rounds taking turns")
    cols = ["query type", *[f"{v} s" for v in names], *[f"{v}/plain" for v in names if v != "plain"]]
    for col in cols:
        table.add_column(col, justify="right")
    for qname in queries:
        table.add_row(qname, *[f"{median_of(timings, f'{v} {qname}'):.2f}" for v in names],
                      *[f"{median_ratio(timings, f'{v} {qname}', f'plain {qname}'):.2f}x" for v in names
                        if v != "plain"])
    console.print(table)


if __name__ == "__main__":
    main()
