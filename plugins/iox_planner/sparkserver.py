"""The project's own Spark Connect server, managed as its local Postgres is (`catalog/localpg.py`): started by
`iox-batch spark start` or on demand by the `connect` runner, reused while it answers, found through a state file
(`.iox/spark-connect.json`: pid, address, port, log), stopped by `iox-batch spark stop`. A file lock stops two
starts racing; a state file whose process is gone (or is no longer this server) is stale and replaced.

The server is pyspark's own (`spark-submit --class SparkConnectServer`, no daemon script), in its own process
group so a stop reaches its Python workers too, bound to 127.0.0.1 unless told otherwise, its workers in this
virtualenv (`sparkconf.spark_env`), with the settings of every iox-batch session (`sparkconf.session_conf`) and
the gate's parse plugin (`spark_jobs/connect_plugin/`, built here into a jar with javac). Imports no pyspark.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Sequence

from filelock import FileLock

from iox_planner.config import project_root, state_dir
from iox_planner.errors import BadInputError, IoxError, SparkUnavailableError
from iox_planner.sparkconf import session_conf, spark_env, spark_master

REMOTE_ENV = "IOX_SPARK_REMOTE"
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
PLUGIN_CLASS = "iox.ParsePlanPlugin"
PLUGIN_TYPE_URL = "type.googleapis.com/iox.ParsePlan"
START_TIMEOUT_S = 180
"""How long a start may take to answer: about 20 s here under load; a JVM still silent after this is wedged."""
STOP_GRACE_S = 15
"""After SIGTERM (the JVM's shutdown hooks remove Spark's temporary folders), how long before SIGKILL."""

_REMOTE = re.compile(r"sc://(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):"
                     r"(?P<port>[0-9]{1,5})/?")


@dataclass(frozen=True)
class ConnectServer:
    pid: int
    host: str
    port: int
    log_file: str

    def reach(self) -> str:
        """The address a client on this machine uses (a server bound to every address answers on loopback)."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host

    def url(self) -> str:
        return f"sc://{self.reach()}:{self.port}"


def check_remote(url: str, what: str = REMOTE_ENV) -> str:
    """`url` if it is `sc://HOST:PORT` (a name or address and a port from 1 to 65535), else a one-paragraph error.
    Nothing else is allowed in it: Spark Connect reads `;key=value` parameters (a token, TLS, a user id) from the
    URL, which are a deployment's business, not a setting to pass through unread."""
    found = _REMOTE.fullmatch(url.strip())
    if found is None or not 1 <= int(found.group("port")) <= 65535:
        raise BadInputError(f"{what}={url[:80]!r} is not a Spark Connect address; give sc://HOST:PORT (for example "
                            "sc://127.0.0.1:15002), or unset it to use the project's own server (iox-batch spark "
                            "start)")
    return f"sc://{found.group('host')}:{int(found.group('port'))}"


def remote_url() -> str:
    """IOX_SPARK_REMOTE, else the project's own server (started on demand and reused)."""
    env = os.environ.get(REMOTE_ENV, "").strip()
    if env:
        return check_remote(env)
    return ensure_running().url()


# --- state -----------------------------------------------------------------------------------------------------


def _state_file() -> Path:
    return state_dir() / "spark-connect.json"


def _lock() -> FileLock:
    return FileLock(str(state_dir() / "spark-connect.lock"), timeout=START_TIMEOUT_S + 60)


def _recorded() -> ConnectServer | None:
    try:
        return ConnectServer(**json.loads(_state_file().read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _is_ours(pid: int) -> bool:
    """`pid` runs (not a zombie) and is a Spark Connect server: a pid reused by another process is not ours."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
        cmdline = (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and SERVER_CLASS.encode() in cmdline


def _answers(server: ConnectServer) -> bool:
    try:
        with socket.create_connection((server.reach(), server.port), timeout=0.5):
            return True
    except OSError:
        return False


def status() -> tuple[ConnectServer | None, str]:
    """The recorded server and what it is doing: `running`, `starting` (its process runs, its port does not
    answer yet), `stale` (recorded, but its process is gone), or `stopped` (nothing recorded)."""
    server = _recorded()
    if server is None:
        return None, "stopped"
    if not _is_ours(server.pid):
        return server, "stale"
    return server, "running" if _answers(server) else "starting"


# --- start and stop --------------------------------------------------------------------------------------------


def ensure_running() -> ConnectServer:
    """The project's server, started if it is not running (see `start`)."""
    server, state = status()
    if state == "running" and server is not None:
        return server
    return start()


def start(port: int | None = None, host: str = "127.0.0.1", conf: Mapping[str, str] | None = None) -> ConnectServer:
    """Start the project's Spark Connect server, or return the one already running (idempotent: `port`, `host` and
    `conf` apply to a new start only). A stale record (its process gone) is replaced. Waits until it answers."""
    with _lock():
        server, state = status()
        if server is not None and state in ("running", "starting"):
            return _wait(server, None)
        _state_file().unlink(missing_ok=True)
        server, proc = launch(state_dir() / "spark-connect.log", port, host, conf)
        _state_file().write_text(json.dumps(asdict(server)))
        try:
            return _wait(server, proc)
        except BaseException:
            _stop_group(server.pid)
            _state_file().unlink(missing_ok=True)
            raise


def launch(log: Path, port: int | None = None, host: str = "127.0.0.1",
           conf: Mapping[str, str] | None = None) -> tuple[ConnectServer, subprocess.Popen[bytes]]:
    """Start a Connect server process in a process group of its own, its output appended to `log`; nothing
    recorded, not waited for (`start` does both; a test starts a private server it may kill with this)."""
    jar = plugin_jar()
    chosen = port or _free_port(host)
    env = {**os.environ, **spark_env()}
    env.setdefault("SPARK_LOG_DIR", str(log.parent))
    with open(log, "ab") as sink:
        proc = subprocess.Popen(server_command(jar, chosen, host, conf), stdin=subprocess.DEVNULL, stdout=sink,
                                stderr=subprocess.STDOUT, env=env, cwd=str(log.parent), start_new_session=True)
    return ConnectServer(proc.pid, host, chosen, str(log)), proc


def wait_until_up(server: ConnectServer, proc: subprocess.Popen[bytes]) -> ConnectServer:
    """`server` once it answers; `SparkUnavailableError` if its process ends first or it stays silent."""
    return _wait(server, proc)


def stop_server(server: ConnectServer) -> None:
    """Stop `server`'s whole process group (its JVM and Python workers), SIGKILL after `STOP_GRACE_S`."""
    _stop_group(server.pid)


def server_command(jar: Path, port: int, host: str, conf: Mapping[str, str] | None = None) -> list[str]:
    """spark-submit of the Connect server with iox-batch's session settings, then `conf` (the user's `--conf`),
    then what the server must have whatever `conf` says: its address and the gate's plugin."""
    submit = shutil.which("spark-submit", path=spark_env()["PATH"]) or "spark-submit"
    settings = {**session_conf(), **(conf or {}),
                "spark.connect.grpc.binding.address": host,
                "spark.connect.grpc.binding.port": str(port),
                "spark.connect.extensions.relation.classes": PLUGIN_CLASS}
    cmd = [submit, "--class", SERVER_CLASS, "--name", "iox-batch Spark Connect", "--master", spark_master(),
           "--jars", str(jar)]
    for key, value in settings.items():
        cmd += ["--conf", f"{key}={value}"]
    return cmd


def _wait(server: ConnectServer, proc: subprocess.Popen[bytes] | None) -> ConnectServer:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _answers(server):
        ended = proc.poll() if proc is not None else (None if _is_ours(server.pid) else -1)
        if ended is not None:
            raise SparkUnavailableError(f"the Spark Connect server did not start (exit status {ended}); its log "
                                        f"{server.log_file} says why: {_log_tail(server.log_file)}")
        if time.monotonic() > deadline:
            raise SparkUnavailableError(f"the Spark Connect server (pid {server.pid}) did not answer on port "
                                        f"{server.port} within {START_TIMEOUT_S} s; see its log {server.log_file}")
        time.sleep(0.25)
    return server


def stop() -> ConnectServer | None:
    """Stop the project's server if one is recorded (and its process is still the server); returns what was
    stopped. Its whole process group goes: the JVM and its Python workers."""
    with _lock():
        server = _recorded()
        if server is not None and _is_ours(server.pid):
            _stop_group(server.pid)
        _state_file().unlink(missing_ok=True)
        return server


def _stop_group(pid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline:
            try:
                os.waitpid(pid, os.WNOHANG)  # our own child (a start that failed): reap it
            except ChildProcessError:
                pass
            if not _is_ours(pid):
                return
            time.sleep(0.2)


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host if host not in ("0.0.0.0", "::") else "", 0))
        return int(sock.getsockname()[1])


def _log_tail(path: str, lines: int = 3) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    wanted = [line for line in text.splitlines() if "ERROR" in line or "Exception" in line] or text.splitlines()
    return " / ".join(wanted[-lines:])[:800]


# --- the gate's plugin -----------------------------------------------------------------------------------------


def spark_home() -> Path:
    """The pyspark package's folder: its jars are the server's, and the plugin compiles against them."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise IoxError("pyspark is not installed in this virtualenv; run `make venv`")
    return Path(list(spec.submodule_search_locations)[0])


def plugin_source() -> Path:
    return project_root() / "spark_jobs" / "connect_plugin" / "iox" / "ParsePlanPlugin.java"


def plugin_jar() -> Path:
    """The gate's parse plugin as a jar, built with javac on first use and kept under `.iox/spark-connect/`, named
    by a digest of its source and of the Spark jars it is built against (a change of either builds it again)."""
    source = plugin_source()
    jars = sorted((spark_home() / "jars").glob("spark-*.jar"))
    digest = hashlib.sha256(source.read_bytes() + "\n".join(p.name for p in jars).encode()).hexdigest()[:16]
    target = state_dir() / "spark-connect" / f"iox-parse-plan-{digest}.jar"
    if target.exists():
        return target
    javac = shutil.which("javac") or (Path(os.environ["JAVA_HOME"]) / "bin" / "javac"
                                      if os.environ.get("JAVA_HOME") else None)
    if javac is None or not Path(javac).exists():
        raise IoxError("javac was not found: the Spark Connect server needs iox-batch's parse plugin (the last gate "
                       "reads each query with the server's own parser), which is built from source on first start; "
                       "install a JDK (Debian: apt-get install openjdk-17-jdk-headless) or set JAVA_HOME")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="iox-plugin-", dir=target.parent) as tmp:
        result = subprocess.run([str(javac), "-d", tmp, "-cp", str(spark_home() / "jars" / "*"), str(source)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise IoxError(f"building the Spark Connect parse plugin failed: {result.stderr.strip()[:800]}")
        staged = Path(tmp) / "plugin.jar"
        with zipfile.ZipFile(staged, "w") as jar:
            for path in sorted(Path(tmp).rglob("*.class")):
                jar.write(path, path.relative_to(tmp).as_posix())
        os.replace(staged, target)
    return target


def parse_conf(items: Sequence[str]) -> dict[str, str]:
    """`--conf key=value` options of `iox-batch spark start`."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().startswith("spark."):
            raise BadInputError(f"--conf {item[:80]!r} is not a Spark setting; give spark.KEY=VALUE (for example "
                                "--conf spark.driver.memory=4g)")
        out[key.strip()] = value.strip()
    return out
