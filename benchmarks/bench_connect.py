"""Warm Spark benchmark: a whole `iox-batch query` process on the demo database (examples/h2o.yaml), over Spark
Connect (IOX_RUNNER=connect, on the project's own server, warm) against the in-process runner (a JVM per
command), the two variants taking turns so machine load falls on both alike. Reports each variant's median and
the ratio. Target: connect at least 5x faster. Run: `python benchmarks/bench_connect.py [--rounds N]`.

Uses the project's catalog (IOX_CATALOG_URL or the local Postgres), loads the demo into database `bench_connect`
(replaced each run), and starts the project's Connect server if it is not running (and leaves it running).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
DB = "bench_connect"
QUERY = "SELECT state, city, min_temp, max_temp, area, time FROM h2o ORDER BY state, city, time"


def cli(*args: str, runner: str = "in-process") -> float:
    """Seconds one `iox-batch` process takes, start to exit; a failure stops the benchmark."""
    exe = Path(sys.executable).parent / "iox-batch"
    env = {**os.environ, "IOX_RUNNER": runner}
    started = time.perf_counter()
    done = subprocess.run([str(exe), *args], capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"iox-batch {' '.join(args)} failed ({runner}): {done.stderr.strip()[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from iox_planner.spark import server as sparkserver

    cli("catalog", "migrate")
    subprocess.run([str(Path(sys.executable).parent / "iox-batch"), "drop", "--db", DB, "--yes"], capture_output=True)
    cli("load", str(ROOT / "examples" / "h2o.yaml"), "--db", DB)
    started = time.perf_counter()
    server = sparkserver.ensure_running()
    print(f"Connect server {server.url()} ready in {time.perf_counter() - started:.1f} s")
    cli("query", "--db", DB, QUERY, runner="connect")  # warm: the server's first query compiles its code paths
    times: dict[str, list[float]] = {"in-process": [], "connect": []}
    for round_ in range(args.rounds):
        order = ["connect", "in-process"] if round_ % 2 == 0 else ["in-process", "connect"]
        for runner in order:
            times[runner].append(cli("query", "--db", DB, QUERY, runner=runner))
        print(f"round {round_ + 1}: " + ", ".join(f"{r} {times[r][-1]:.2f} s" for r in order))
    table = Table(title=f"whole `iox-batch query` process on the demo, {args.rounds} rounds taking turns")
    for column in ("runner", "median s", "min s", "max s"):
        table.add_column(column)
    for runner, values in times.items():
        table.add_row(runner, f"{statistics.median(values):.2f}", f"{min(values):.2f}", f"{max(values):.2f}")
    Console().print(table)
    ratio = statistics.median(times["in-process"]) / statistics.median(times["connect"])
    print(f"connect is {ratio:.1f}x faster than in-process (target >= 5x)")


if __name__ == "__main__":
    main()
