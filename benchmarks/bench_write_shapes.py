"""Write shapes that grow the catalog (issue 31, item 5): one `iox-batch write` process of N lines where every line
brings a new tag key of one table (1,000 / 2,000 / 4,000 / 20,000), lands on a new day (10,000 days) or names a new
measurement (100,000), with the catalog limits raised (IOX_DB_MAX_TABLES, IOX_TABLE_MAX_COLUMNS,
IOX_WRITE_MAX_PARTITIONS) so that the write is done, not refused.

Each write is a whole process, as a user runs it, into a database of its own on a scratch catalog (the project's
local Postgres) and a scratch warehouse. `--baseline REV` also runs each shape on the code of git revision REV
(its `plugins/` and `catalog_sql/` extracted with `git archive` to a temporary folder, first on PYTHONPATH; the
same virtualenv), right after this checkout's run of the same shape, and prints the ratio. A run past
`--timeout` seconds is stopped and shown as "> T s", as the issue measured.

Run: `python benchmarks/bench_write_shapes.py [--baseline REV] [--timeout 300] [--baseline-timeout S]
[--only tags,days,tables] [--tables N]`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from iox_planner.catalog import localpg
from iox_planner.catalog.store import Catalog

ROOT = Path(__file__).resolve().parents[1]
DAY0 = 1_704_067_200_000_000_000
NS_PER_DAY = 86_400 * 10**9
SHAPES = [("tags", 1_000), ("tags", 2_000), ("tags", 4_000), ("tags", 20_000), ("days", 10_000),
          ("tables", 100_000)]
WHAT = {"tags": "new tag keys in one table", "days": "days (partitions)", "tables": "measurements (tables)"}
RAISED = {"IOX_DB_MAX_TABLES": "1000000", "IOX_TABLE_MAX_COLUMNS": "1000000", "IOX_WRITE_MAX_PARTITIONS": "10000000"}
MAIN = "import sys; from iox_planner.cli.main import main; sys.exit(main())"


def lines(shape: str, n: int) -> str:
    if shape == "tags":
        return "".join(f"m,k{i}=v f=1 {DAY0 + i}\n" for i in range(n))
    if shape == "days":
        return "".join(f"m,h=a f=1 {DAY0 + i * NS_PER_DAY}\n" for i in range(n))
    return "".join(f"m{i},h=a f=1 {DAY0 + i}\n" for i in range(n))


def write(plugins: Path | None, path: Path, env: dict[str, str], timeout: float) -> float | None:
    """Seconds of one `iox-batch write` process (None past `timeout`, stopped); `plugins`: the code to run."""
    run_env = {**env, "IOX_HOME": str(plugins.parent if plugins else ROOT)}
    if plugins is not None:
        run_env["PYTHONPATH"] = os.pathsep.join([str(plugins), str(plugins.parent)])
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", MAIN, "write", "--db", f"b_{uuid.uuid4().hex[:10]}", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=run_env,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        return None
    if proc.returncode != 0:
        raise SystemExit(f"the write failed ({proc.returncode}): {err[-2000:]}")
    return time.perf_counter() - started


def shown(seconds: float | None, timeout: float) -> str:
    return f"> {timeout:.0f} s" if seconds is None else f"{seconds:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", help="a git revision to run the same shapes on, for the ratio")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--baseline-timeout", type=float, help="the baseline's own timeout (default: --timeout)")
    parser.add_argument("--only", default="tags,days,tables")
    parser.add_argument("--tables", type=int, default=100_000, help="lines of the measurements shape")
    args = parser.parse_args()
    wanted = set(args.only.split(","))
    pg = localpg.ensure_running()
    name = f"iox_bench_shapes_{uuid.uuid4().hex[:8]}"
    url = localpg.ensure_database(pg, name)
    Catalog(url).migrate()
    scratch = Path(tempfile.mkdtemp(prefix="iox-bench-shapes-"))
    env = {**os.environ, **RAISED, "IOX_CATALOG_URL": url, "IOX_WAREHOUSE": str(scratch / "warehouse")}
    env.pop("PYTHONPATH", None)
    baseline: Path | None = None
    try:
        if args.baseline:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline, "plugins", "catalog_sql"],
                                     check=True, capture_output=True).stdout
            (scratch / "baseline").mkdir()
            subprocess.run(["tar", "-x", "-C", str(scratch / "baseline")], input=archive, check=True)
            baseline = scratch / "baseline" / "plugins"
        print(f"load average at the start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}, "
              f"{os.cpu_count()} cores")
        header = "| lines | shape | this checkout | per line |"
        if baseline is not None:
            header += f" {args.baseline} | {args.baseline} / this |"
        print(header)
        print("|" + "---|" * (header.count("|") - 1))
        for shape, n in SHAPES:
            if shape not in wanted:
                continue
            n = args.tables if shape == "tables" else n
            path = scratch / f"{shape}-{n}.lp"
            path.write_text(lines(shape, n))
            now = write(None, path, env, args.timeout)
            row = f"| {n:,} | {WHAT[shape]} | {shown(now, args.timeout)} | "
            row += "-" if now is None else f"{now / n * 1000:.3f} ms"
            if baseline is not None:
                limit = args.baseline_timeout or args.timeout
                before = write(baseline, path, env, limit)
                ratio = ("-" if now is None else f"> {limit / now:.1f}x" if before is None else f"{before / now:.1f}x")
                row += f" | {shown(before, limit)} | {ratio}"
            print(row + " |", flush=True)
        print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        localpg.drop_database(localpg.ensure_running(), name)


if __name__ == "__main__":
    main()
