"""Warm Spark benchmark: a whole `iox-batch query` process on the demo database (examples/h2o.yaml), over Spark
Connect (IOX_RUNNER=connect, on the project's own server, warm) against the in-process runner (a JVM per
command), the two variants taking turns so machine load falls on both alike. Reports each variant's median and
the ratio. Target: connect at least 5x faster. Run: `python benchmarks/bench_connect.py [--rounds N]`.

`--airflow`: a triggered `iox_query` run end to end (plan, run, merge, commit: the demo query written as jsonl)
over Spark Connect against spark-submit, the DAGs' two ways to Spark. Each runner has its own warm Airflow process
running `dag.test()` (tests/airflow/dagtest_runner.py; a Connect client switches its whole process to Connect
mode), so a figure is the run itself, as a warm worker runs it, without the scheduler's own latency (the same for
both). Target: connect at most 10 s. With `--airflow-cli`, also a whole `airflow dags test` process per run
(Airflow's own start, about 8 s here, included).

Uses the project's catalog (IOX_CATALOG_URL or the local Postgres), loads the demo into database `bench_connect`
(replaced each run), and starts the project's Connect server if it is not running (and leaves it running).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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


def report(title: str, times: dict[str, list[float]], slow: str, target: str) -> None:
    table = Table(title=title)
    for column in ("runner", "median s", "min s", "max s"):
        table.add_column(column)
    for runner, values in times.items():
        table.add_row(runner, f"{statistics.median(values):.2f}", f"{min(values):.2f}", f"{max(values):.2f}")
    Console().print(table)
    ratio = statistics.median(times[slow]) / statistics.median(times["connect"])
    print(f"connect is {ratio:.1f}x faster than {slow} ({target})")


def taking_turns(rounds: int, variants: dict[str, Any]) -> dict[str, list[float]]:
    """Each variant's seconds per round, the variants' order reversed every other round."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(rounds):
        order = list(variants) if round_ % 2 == 0 else list(reversed(variants))
        for name in order:
            times[name].append(variants[name]())
        print(f"round {round_ + 1}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in order), flush=True)
    return times


def bench_cli(rounds: int) -> None:
    cli("query", "--db", DB, QUERY, runner="connect")  # warm: the server's first query compiles its code paths
    times = taking_turns(rounds, {runner: (lambda r=runner: cli("query", "--db", DB, QUERY, runner=r))
                                  for runner in ("connect", "in-process")})
    report(f"whole `iox-batch query` process on the demo, {rounds} rounds taking turns", times, "in-process",
           "target >= 5x")


def bench_airflow(rounds: int, server: Any, whole_process: bool) -> None:
    """`iox_query` runs with real Airflow, the two runners taking turns (see the module's docstring)."""
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "airflow"), str(ROOT / "dags")]
    from airflow_support import DagRunner, airflow_cli, base_env, setup_airflow

    from iox_airflow.spark import connect_connection
    from iox_planner.catalog.localpg import catalog_url
    from iox_planner.config import warehouse

    work = Path(tempfile.mkdtemp(prefix="iox-bench-airflow-"))
    runners: dict[str, DagRunner] = {}
    try:
        os.environ["IOX_WAREHOUSE"] = str(warehouse())
        for folder in ("output", "materialized"):
            (work / folder).mkdir()
        env = base_env(catalog_url(), work / "airflow", work / "output", work / "materialized")
        env["IOX_SPARK_MASTER"] = "local[*]"  # what a deployment's spark-submit gets by default
        setup_airflow(env)
        connect = {"IOX_RUNNER": "connect", "AIRFLOW_CONN_IOX_SPARK_CONNECT": connect_connection(
            server.reach(), server.port, server.gate_port, server.token)}
        envs = {"connect": {**env, **connect}, "spark-submit": {**env, "IOX_RUNNER": "spark-submit"}}
        for name, runner_env in envs.items():
            runners[name] = DagRunner(runner_env, work / f"{name}.stderr.log")
        count = iter(range(1_000_000))

        def dag_test(name: str) -> float:
            conf = {"db": DB, "sql": QUERY, "output": f"h2o-{name}-{next(count)}.jsonl", "format": "jsonl"}
            started = time.perf_counter()
            [result] = runners[name].run([{"dag_id": "iox_query", "conf": conf}])
            elapsed = time.perf_counter() - started
            if result.get("state") != "success":
                raise SystemExit(f"iox_query ({name}) failed: {result.get('error')} {result['log'][-3000:]}")
            return elapsed

        dag_test("connect")  # warm: the first run of each process imports what the next ones reuse
        dag_test("spark-submit")
        times = taking_turns(rounds, {name: (lambda n=name: dag_test(n)) for name in envs})
        report(f"a triggered iox_query run, dag.test() in a warm Airflow process, {rounds} rounds taking turns",
               times, "spark-submit", "target: connect at most 10 s")
        if whole_process:

            def dags_test(name: str) -> float:
                conf = {"db": DB, "sql": QUERY, "output": f"h2o-{name}-{next(count)}.jsonl", "format": "jsonl"}
                started = time.perf_counter()
                done = airflow_cli(envs[name], "dags", "test", "iox_query", "-c", json.dumps(conf))
                elapsed = time.perf_counter() - started
                if done.returncode != 0:
                    raise SystemExit(f"airflow dags test ({name}) failed: {done.stderr[-3000:]}")
                return elapsed

            times = taking_turns(rounds, {name: (lambda n=name: dags_test(n)) for name in envs})
            report(f"a whole `airflow dags test iox_query` process, {rounds} rounds taking turns", times,
                   "spark-submit", "Airflow's own start included")
    finally:
        for runner in runners.values():
            runner.close()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--airflow", action="store_true", help="a triggered iox_query run: connect vs spark-submit")
    parser.add_argument("--airflow-cli", action="store_true",
                        help="with --airflow: also a whole `airflow dags test` process per run")
    args = parser.parse_args()
    from iox_planner.spark import server as sparkserver

    cli("catalog", "migrate")
    subprocess.run([str(Path(sys.executable).parent / "iox-batch"), "drop", "--db", DB, "--yes"], capture_output=True)
    cli("load", str(ROOT / "examples" / "h2o.yaml"), "--db", DB)
    started = time.perf_counter()
    server = sparkserver.ensure_running()
    print(f"Connect server {server.url()} ready in {time.perf_counter() - started:.1f} s")
    if args.airflow:
        bench_airflow(args.rounds, server, args.airflow_cli)
    else:
        bench_cli(args.rounds)


if __name__ == "__main__":
    main()
