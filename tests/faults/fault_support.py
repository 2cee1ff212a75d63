"""The fault-injection suite's own world and helpers: a Postgres cluster of its own (so it may be stopped and restarted in the
middle of a command without touching anyone else's catalog), its own warehouse, and the test's own readers of
what the catalog and the warehouse hold.

`IOX_FAULT_POINTS` kill points per operation (CI default 2; the full run uses 10 or more), drawn from
`IOX_FAULT_SEED` (default 11). A failure names the seed, the operation and the kill point so it replays."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from iox_planner.catalog import localpg
from iox_planner.catalog.store import Catalog

POINTS = int(os.environ.get("IOX_FAULT_POINTS", "2"))
FULL = POINTS >= 5
# A killed query costs a JVM start (10-40 s on a loaded 2-core box): CI runs its named point only (with the fixed
# seed a CI "random" point is one fixed case too); any IOX_FAULT_POINTS given explicitly applies to queries too.
QUERY_POINTS = POINTS if "IOX_FAULT_POINTS" in os.environ else 0
"""The full run (IOX_FAULT_POINTS of 5 or more) also runs the costlier named-point cases CI samples."""
SEED = int(os.environ.get("IOX_FAULT_SEED", "11"))
# CI restarts Postgres once per operation (the CI budget); an explicit IOX_FAULT_POINTS applies here too.
RESTARTS = POINTS if "IOX_FAULT_POINTS" in os.environ else 1
IOX = str(Path(sys.executable).parent / "iox-batch")


def replay(operation: str, point: object) -> str:
    """What a failure message starts with: enough to replay it."""
    return (f"[replay: IOX_FAULT_SEED={SEED} IOX_FAULT_POINTS={POINTS}, operation {operation}, kill point {point}]")


def report(line: str) -> None:
    """A suite's figures: printed, and appended to IOX_FAULT_REPORT if set (pytest-xdist swallows prints)."""
    print(line)
    target = os.environ.get("IOX_FAULT_REPORT")
    if target:
        with open(target, "a") as fh:
            fh.write(line + "\n")


def rng_for(operation: str) -> random.Random:
    return random.Random(f"{SEED}:{operation}")


@dataclass
class FaultWorld:
    base: Path
    pg: localpg.LocalPostgres
    url: str
    warehouse: Path
    catalog: Catalog

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a command run against this world (never the project's catalog)."""
        env = {k: v for k, v in os.environ.items() if k != "IOX_FAULT_KILL_AT"}
        env.update(IOX_CATALOG_URL=self.url, IOX_WAREHOUSE=str(self.warehouse), **extra)
        return env

    def stop_pg(self, mode: str = "immediate") -> None:
        localpg.stop_cluster(self.pg, mode)

    def start_pg(self) -> None:
        pg = localpg.start_cluster(self.base, self.pg.port)
        assert pg.port == self.pg.port
        self.catalog.engine.dispose()  # pooled connections died with the server


def own_base() -> Path:
    """A cluster folder the server's user can reach (as root the server runs as `postgres`, who cannot enter
    pytest's temporary folders under /tmp/pytest-of-root)."""
    base = Path(tempfile.mkdtemp(prefix="iox-faults-", dir="/var/tmp"))
    base.chmod(0o755)
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    return base


@contextlib.contextmanager
def own_world(name: str, warehouse: Path) -> Iterator[FaultWorld]:
    """A Postgres cluster of the suite's own (never the project's: the tests stop and restart it), a migrated
    catalog database `<name>_<random>` on it, and `warehouse`; the cluster is stopped and removed afterwards."""
    base = own_base()
    pg = localpg.start_cluster(base)
    try:
        url = localpg.ensure_database(pg, f"{name}_{uuid.uuid4().hex[:8]}")
        catalog = Catalog(url)
        catalog.migrate()
        yield FaultWorld(base, pg, url, warehouse, catalog)
        catalog.dispose()
    finally:
        localpg.stop_cluster(pg, "immediate")
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultWorld]:
    with own_world("faults", tmp_path_factory.mktemp("fault_warehouse")) as w:
        yield w


@pytest.fixture
def fw(world: FaultWorld, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultWorld]:
    """The world, with this process's environment pointed at it for in-process steps (restored afterwards).

    publish.py keeps the publication ledger it first made in a context variable for the process's life; one made
    here would point at this world's catalog and follow later tests of this worker, so it is reset after."""
    from iox_planner.output import publish

    monkeypatch.setenv("IOX_CATALOG_URL", world.url)
    monkeypatch.setenv("IOX_WAREHOUSE", str(world.warehouse))
    token = publish._LEDGER.set(None)
    yield world
    publish._LEDGER.reset(token)


# --- running and killing commands -------------------------------------------------------------------------------


@dataclass
class Outcome:
    killed: bool
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_and_kill(args: list[str], env: dict[str, str], delay: float | None, *, stdin: str | None = None,
                 timeout: float = 300) -> Outcome:
    """Run `iox-batch args` in a process group of its own; after `delay` seconds SIGKILL the whole group (the
    command and any JVM it started), as a power cut would. `delay=None` runs it to completion."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.monotonic()
        proc = subprocess.Popen([IOX, *args], stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                                stdout=out, stderr=err, env=env, start_new_session=True, text=True)
        if stdin is not None:
            assert proc.stdin is not None
            proc.stdin.write(stdin)
            proc.stdin.close()
        killed = False
        try:
            proc.wait(timeout=delay if delay is not None else timeout)
        except subprocess.TimeoutExpired:
            if delay is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
            os.killpg(proc.pid, signal.SIGKILL)
            killed = True
            proc.wait()
        else:
            # Even a finished command's group may hold a straggler (a JVM): it goes too.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        seconds = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        return Outcome(killed, proc.returncode, out.read(), err.read(), seconds)


def proc_stats() -> Iterator[tuple[int, list[str]]]:
    """Every process: its pid and the fields of /proc/<pid>/stat after its name (state, ppid, pgrp, session...)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        yield int(entry.name), text[text.rindex(")") + 2:].split()


def stopped_in_session(sid: int) -> list[int]:
    """The processes of session `sid` that are stopped (state T: at a pause point, IOX_FAULT_PAUSE_AT)."""
    return [pid for pid, fields in proc_stats() if fields[0] in ("T", "t") and int(fields[3]) == sid]


class PausedCommand:
    """A command in a session (and process group) of its own, run with IOX_FAULT_PAUSE_AT set: `wait_stopped`
    returns once one of its processes (the command itself, or the Python driver of a job it runs through
    spark-submit) stopped at the pause point, so the test can change the world before `resume`."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self._out = tempfile.TemporaryFile("w+")
        self._err = tempfile.TemporaryFile("w+")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._out, stderr=self._err, env=env,
                                     start_new_session=True, text=True)

    def wait_stopped(self, timeout: float = 600) -> bool:
        """True once a process of the command stopped; False if the command ended first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:  # a stopped child is not reported by poll()
                return False
            if stopped_in_session(self.proc.pid):
                return True
            time.sleep(0.05)
        self.finish(kill=True)
        raise AssertionError(f"no pause point reached in {timeout} s")

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def finish(self, timeout: float = 600, *, kill: bool = False) -> Outcome:
        """Wait for the command (or kill it) and what it printed; stragglers of its group go too."""
        try:
            if kill:
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._out.seek(0)
        self._err.seek(0)
        outcome = Outcome(kill, self.proc.returncode, self._out.read(), self._err.read(),
                          time.monotonic() - self.started)
        self._out.close()
        self._err.close()
        return outcome


def assert_clean_failure(outcome: Outcome, context: str) -> None:
    """A command that was not killed either succeeded or failed with one paragraph, no traceback."""
    if outcome.killed or outcome.returncode in (0, -signal.SIGKILL):  # -9: it reached its named kill point
        return
    stderr = outcome.stderr.strip()
    assert stderr.startswith("error: "), f"{context}: not a one-paragraph error: {stderr[:2000]}"
    assert "Traceback" not in stderr and "\tat " not in stderr, f"{context}: {stderr[:2000]}"


# --- restarting the suite's Postgres ------------------------------------------------------------------------------


class Restarter:
    """Stops the cluster after `delay` seconds (immediate mode: a crash, no checkpoint), keeps it down for
    `down` seconds, starts it again on the same port."""

    def __init__(self, fw: FaultWorld, delay: float, down: float = 0.7) -> None:
        self.fw = fw
        self.delay = delay
        self.down = down
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            time.sleep(self.delay)
            self.fw.stop_pg("immediate")
            time.sleep(self.down)
            self.fw.start_pg()
        except BaseException as err:  # noqa: BLE001 - reported by join()
            self.error = err

    def __enter__(self) -> "Restarter":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(timeout=120)
        assert not self.thread.is_alive(), "Postgres did not come back"
        if self.error is not None:
            raise self.error


def failed_retryably(outcome: Outcome, context: str) -> bool:
    assert_clean_failure(outcome, context)
    if outcome.returncode != 0:
        assert outcome.returncode == 75, f"{context}: not the retryable catalog error: {outcome.stderr[:2000]}"
        return True
    return False


# --- what the catalog and warehouse hold, read directly -------------------------------------------------------------


def db_id(catalog: Catalog, db: str) -> int | None:
    with catalog.engine.connect() as conn:
        return conn.execute(sa.text("SELECT id FROM iox_database WHERE name = :n").bindparams(n=db)).scalar()


def chunk_rows(catalog: Catalog, db: str, *, live: bool = True) -> list[dict[str, Any]]:
    out = []
    with catalog.engine.connect() as conn:
        for kind, table in (("parquet", "iox_parquet_file"), ("ingester", "iox_ingester_chunk")):
            where = "AND c.to_delete IS NULL" if live else ""
            rows = conn.execute(sa.text(
                f"SELECT c.id, c.path, c.row_count, c.chunk_order, c.to_delete FROM {table} c "
                "JOIN iox_table t ON t.id = c.table_id JOIN iox_database d ON d.id = t.database_id "
                f"WHERE d.name = :db {where}").bindparams(db=db)).mappings()
            out.extend({**r, "kind": kind} for r in rows)
    return out


def catalog_problems(world: FaultWorld, db: str) -> list[str]:
    """Every live chunk's file exists, reads with pyarrow and holds the rows its row says."""
    problems = []
    for row in chunk_rows(world.catalog, db):
        path = world.warehouse / row["path"]
        if not path.is_file():
            problems.append(f"{row['kind']} chunk {row['id']}: file {row['path']} is missing")
            continue
        try:
            table = pq.read_table(path)
        except Exception as err:  # noqa: BLE001 - any failure to read is the finding
            problems.append(f"{row['kind']} chunk {row['id']}: {row['path']} does not read: {err}")
            continue
        if table.num_rows != row["row_count"]:
            problems.append(f"{row['kind']} chunk {row['id']}: {table.num_rows} rows, catalog says {row['row_count']}")
    return problems


def unreferenced_files(world: FaultWorld, db: str) -> list[str]:
    """Files under the database's warehouse folder that no catalog row (live or retired) names."""
    ident = db_id(world.catalog, db)
    if ident is None:
        return []
    folder = world.warehouse / str(ident)
    known = {r["path"] for r in chunk_rows(world.catalog, db, live=False)}
    files = [str(p.relative_to(world.warehouse)) for p in folder.rglob("*") if p.is_file()] if folder.exists() else []
    return sorted(f for f in files if f not in known)


def naive_answer(world: FaultWorld, db: str, table: str, key: tuple[str, ...]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """IOx dedup done the slow obvious way over the live chunks' files: rows in (chunk order, write position)
    order, each field's last non-null value per key. Independent of the product's dedup code."""
    rows: list[tuple[int, int, dict[str, Any]]] = []
    with world.catalog.engine.connect() as conn:
        for kind, tbl in (("parquet", "iox_parquet_file"), ("ingester", "iox_ingester_chunk")):
            found = conn.execute(sa.text(
                f"SELECT c.path, c.chunk_order FROM {tbl} c JOIN iox_table t ON t.id = c.table_id "
                "JOIN iox_database d ON d.id = t.database_id "
                "WHERE d.name = :db AND t.name = :t AND c.to_delete IS NULL").bindparams(db=db, t=table)).all()
            for path, order in found:
                for pos, rec in enumerate(pq.read_table(world.warehouse / path).to_pylist()):
                    seq = rec.pop("__seq", pos)
                    rec.pop("__write_order", None)  # persisted files' bookkeeping for changes reads, not data
                    rows.append((order, seq, rec))
    rows.sort(key=lambda r: (r[0], r[1]))
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for _, _, rec in rows:
        k = tuple(rec.get(c) for c in key)
        cur = out.setdefault(k, {})
        for name, value in rec.items():
            if name not in key and value is not None:
                cur[name] = value
    return out


# --- the data every fault test writes, and the test's own tally of it -----------------------------------------------

DAY0 = 1_704_067_200_000_000_000  # 2024-01-01, and the next day: every write spans two partitions (two chunks)
DAY1 = DAY0 + 86_400_000_000_000
KEYS = 40
QUERY = "SELECT k, kt, v, n0, n1, n2 FROM m"


def batch(i: int) -> str:
    """Write number i: every key of both days again, `v` unique to the write, one of three NULL-able fields."""
    lines = []
    for day in (DAY0, DAY1):
        for j in range(KEYS):
            lines.append(f"m,k=k{j:02d} kt={j}i,v={i * 1000 + j}i,n{i % 3}={i}.5 {day + j * 1_000_000_000}")
    return "\n".join(lines) + "\n"


class Tally:
    """Per key (k, time) the last non-null value of each field, folding the writes in the order they committed
    (the tests commit them one after another, so that order is the test's own)."""

    def __init__(self) -> None:
        self.expected: dict[tuple[Any, ...], dict[str, Any]] = {}

    def apply(self, i: int) -> None:
        for day in (DAY0, DAY1):
            for j in range(KEYS):
                cur = self.expected.setdefault((f"k{j:02d}", day + j * 1_000_000_000), {})
                cur.update({"kt": j, "v": i * 1000 + j, f"n{i % 3}": i + 0.5})

    def rows(self) -> list[tuple[Any, ...]]:
        """The expected rows of QUERY."""
        return sorted((k, f["kt"], f["v"], f.get("n0"), f.get("n1"), f.get("n2"))
                      for (k, _), f in self.expected.items())


def rows_of_write(world: FaultWorld, db: str, i: int) -> int:
    """How many rows of write i the live ingester chunks hold (read from the files, not through the product)."""
    count = 0
    for row in chunk_rows(world.catalog, db):
        if row["kind"] != "ingester":
            continue
        table = pq.read_table(world.warehouse / row["path"], columns=["v"])
        count += sum(1 for v in table.column("v").to_pylist() if v is not None and i * 1000 <= v < i * 1000 + KEYS)
    return count


def read_output(path: Path, fmt: str) -> list[tuple[Any, ...]]:
    """QUERY's rows as published, whatever the format, as sorted tuples."""
    import csv
    import json

    def num(value: Any, kind: type) -> Any:
        return None if value in (None, "") else kind(value)

    if fmt == "parquet":
        recs = pq.read_table(path).to_pylist()
    elif fmt == "jsonl":
        recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    else:
        with path.open(newline="") as fh:
            recs = list(csv.DictReader(fh))
    return sorted((r["k"], num(r["kt"], int), num(r["v"], int), num(r["n0"], float), num(r["n1"], float),
                   num(r["n2"], float)) for r in recs)


def hidden_siblings(path: Path) -> list[str]:
    """What publishing `path` may have left next to it (staged copies, set-aside old outputs, run locks)."""
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}."))
