"""The project's own local Postgres: started on demand, reused, found through a state file.

Postgres refuses to run as root, and the `postgres` user cannot enter root's home folder, so when invoked as root
the cluster lives in a folder under /var/tmp owned by `postgres` and every server command runs as that user. The
state file (`.iox/postgres.json` in the project) records the data folder, port and socket folder; a file lock stops
two starts racing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock

from iox_planner.config import CATALOG_URL, PG_BIN, project_root, state_dir
from iox_planner.errors import CatalogError

PG_BIN_CANDIDATES = ("/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/17/bin")


@dataclass(frozen=True)
class LocalPostgres:
    data_dir: str
    port: int
    socket_dir: str
    log_file: str

    def url(self, database: str) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{database}"


def _pg_bin() -> Path:
    env = PG_BIN.read()
    candidates = (str(env),) if env is not None else PG_BIN_CANDIDATES
    for candidate in candidates:
        if candidate and (Path(candidate) / "pg_ctl").exists():
            return Path(candidate)
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    raise CatalogError(
        "PostgreSQL server binaries (initdb, pg_ctl) were not found; install them (Debian: apt-get install "
        "postgresql-15) or set IOX_PG_BIN to their folder, or point IOX_CATALOG_URL at a running Postgres"
    )


def _as_root() -> bool:
    return os.geteuid() == 0


def _run(args: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    if _as_root():
        args = ["runuser", "-u", "postgres", "--", *args]
    return subprocess.run(args, check=check, capture_output=True, text=True)


def _base_dir() -> Path:
    """Where the cluster's files live: reachable and owned by the user the server runs as."""
    if not _as_root():
        return state_dir() / "postgres"
    digest = hashlib.sha1(str(project_root()).encode()).hexdigest()[:12]
    base = Path("/var/tmp/iox-batch") / digest
    base.mkdir(parents=True, exist_ok=True)
    Path("/var/tmp/iox-batch").chmod(0o755)
    shutil.chown(base, "postgres", "postgres")
    return base


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _state_file() -> Path:
    return state_dir() / "postgres.json"


def _is_up(pg: LocalPostgres) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", pg.port), timeout=0.5):
            pass
    except OSError:
        return False
    result = subprocess.run(
        [str(_pg_bin() / "pg_isready"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres"],
        capture_output=True,
    )
    return result.returncode == 0


def _create_database(pg: LocalPostgres, name: str) -> None:
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=pg.port, user="postgres", dbname="postgres")
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if cur.fetchone() is None:
                cur.execute(f'CREATE DATABASE "{name}"')  # name is ours, not user input
    finally:
        conn.close()


def drop_database(pg: LocalPostgres, name: str) -> None:
    """Drop database `name` of the local cluster if it exists, closing its connections (a test's or a
    benchmark's own database: the name is ours, not user input)."""
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=pg.port, user="postgres", dbname="postgres")
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        conn.close()


def ensure_database(pg: LocalPostgres, name: str) -> str:
    """Create database `name` in the local cluster if missing; return its URL."""
    _create_database(pg, name)
    return pg.url(name)


def ensure_running() -> LocalPostgres:
    """Start the project's Postgres if it is not running (or reuse it) and make sure database `iox` exists."""
    with FileLock(str(state_dir() / "postgres.lock"), timeout=120):
        state = _state_file()
        if state.exists():
            pg = LocalPostgres(**json.loads(state.read_text()))
            if _is_up(pg):
                return pg
        pg = _start()
        state.write_text(json.dumps(asdict(pg)))
        _create_database(pg, "iox")
        return pg


def _start() -> LocalPostgres:
    return start_cluster(_base_dir())


def start_cluster(base: Path, port: int | None = None) -> LocalPostgres:
    """Start (creating it if needed) a cluster whose files live in `base` (as root: a folder `postgres` owns) on
    `port` (default: a free one). The project's instance is one such cluster; the fault tests start their own,
    which they may stop and restart without disturbing anyone else's catalog."""
    bin_dir = _pg_bin()
    data_dir = base / "data"
    socket_dir = base / "run"
    log_file = base / "postgres.log"
    if not (data_dir / "PG_VERSION").exists():
        if data_dir.exists():
            shutil.rmtree(data_dir)
        result = _run(
            [str(bin_dir / "initdb"), "-D", str(data_dir), "-U", "postgres", "--auth=trust", "-E", "UTF8",
             "--locale=C.UTF-8"],
            check=False,
        )
        if result.returncode != 0:
            raise CatalogError(f"initdb failed for the local Postgres in {data_dir}: {result.stderr.strip()}")
    if not socket_dir.exists():
        _run(["mkdir", "-p", str(socket_dir)])
    port = port or _free_port()
    pg = LocalPostgres(str(data_dir), port, str(socket_dir), str(log_file))
    # A stale postmaster.pid from a killed server would make pg_ctl refuse; pg_ctl status tells if it is alive.
    status = _run([str(bin_dir / "pg_ctl"), "-D", str(data_dir), "status"], check=False)
    if status.returncode == 0:
        _run([str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-m", "fast", "-w", "stop"], check=False)
    options = f"-p {port} -k {socket_dir} -c listen_addresses=127.0.0.1 -c max_connections=200"
    result = _run(
        [str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-o", options, "-l", str(log_file), "-w", "-t", "60", "start"],
        check=False,
    )
    if result.returncode != 0:
        raise CatalogError(
            f"the local Postgres did not start (data {data_dir}, port {port}); see its log {log_file}: "
            f"{result.stderr.strip() or result.stdout.strip()}"
        )
    deadline = time.monotonic() + 30
    while not _is_up(pg):
        if time.monotonic() > deadline:
            raise CatalogError(f"the local Postgres started but does not answer on port {port}; see {log_file}")
        time.sleep(0.1)
    return pg


def stop() -> None:
    """Stop the project's local Postgres if it runs (the data stays)."""
    state = _state_file()
    if not state.exists():
        return
    stop_cluster(LocalPostgres(**json.loads(state.read_text())))
    state.unlink()


def stop_cluster(pg: LocalPostgres, mode: str = "fast") -> None:
    """Stop a cluster started by `start_cluster` (its data stays); `mode` is pg_ctl's (smart, fast, immediate)."""
    _run([str(_pg_bin() / "pg_ctl"), "-D", pg.data_dir, "-m", mode, "-w", "stop"], check=False)


# The catalog's default URL lives here, not in config.py (paths and env only), so config imports nothing.
def catalog_url() -> str:
    """IOX_CATALOG_URL, else the project's own local Postgres (started on demand and reused)."""
    env = CATALOG_URL.read()
    if env:
        return env
    return ensure_running().url("iox")
