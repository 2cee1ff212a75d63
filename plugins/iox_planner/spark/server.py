"""The project's own Spark Connect server, managed as its local Postgres is (`catalog/localpg.py`): started by
`iox-batch spark start` or on demand by the `connect` runner, reused while it answers, found through a state file
(`.iox/spark-connect.json`, mode 0600: pid, address, ports, settings, log, the server's token), stopped by
`iox-batch spark stop`. A file lock stops two starts racing; a state file whose process is gone (or is no longer
this server) is stale and replaced.

The server is one Python process (`spark_jobs/connect_server.py`): a SparkSession whose JVM runs Spark's Connect
plugin, and beside it the last gate's parse endpoint. One token per server guards both: Spark Connect's own
pre-shared token (`spark.connect.authenticate.token`, read by the JVM from its environment) and the gate's bearer
token, so no client without it runs anything there. A supervisor (`spark_jobs/connect_supervisor.py`, the recorded
pid) runs it and starts it again when its JVM dies or wedges, reporting what it does in a file beside the log
(`Report`). It runs in its own process group (a stop reaches the supervisor, the JVM and its Python workers),
bound to 127.0.0.1 unless told otherwise, its workers in this virtualenv (`conf.spark_env`), with the settings of
every iox-batch session (`conf.session_conf`). Another server (IOX_SPARK_REMOTE) is one started the same way
elsewhere: its gate's port and the token come from IOX_SPARK_GATE_PORT and IOX_SPARK_GATE_TOKEN, and one not on
this machine is reached over TLS only (IOX_SPARK_TLS_CA: a TLS-terminating proxy in front of both ports, so the
token never travels in clear). Part of the Spark seam: imports no pyspark.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from filelock import FileLock

from iox_planner import config
from iox_planner.config import state_dir
from iox_planner.errors import BadInputError, SparkUnavailableError
from iox_planner.spark.conf import check_not_secret, spark_env

REMOTE_ENV = config.SPARK_REMOTE.name
GATE_PORT_ENV = config.SPARK_GATE_PORT.name
GATE_TOKEN_ENV = config.SPARK_GATE_TOKEN.name
TLS_CA_ENV = config.SPARK_TLS_CA.name
CONNECT_TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"
"""Where Spark Connect's server reads its pre-shared token when `spark.connect.authenticate.token` is not set
(`Connect.getAuthenticateToken`), and where its Python client looks for one: the environment, never a command line."""
SERVER_MODULE = "spark_jobs.connect_server"
SUPERVISOR_MODULE = "spark_jobs.connect_supervisor"
GATE_PATH = "/parse"
GATE_MAX_BYTES = 4 * 1_048_576
PROBE_TEXT = "SELECT 1"
"""The text the supervisor's liveness probe parses (`connect_supervisor.py`): the gate gives it a slot of its own,
so users' parses keeping every other slot busy are not read as a wedged JVM (and the JVM restarted under them)."""
"""The largest text the gate reads: four times the planner's IOX_MAX_SQL_BYTES default, room for its edits."""
GATE_TIMEOUT_S = 30.0
"""How long the client waits on the gate: a parse takes milliseconds; a server that does not answer is refused."""
START_TIMEOUT_S = 180
"""How long a start may take to answer: about 20 s here under load; a JVM still silent after this is wedged."""
RESTART_WAIT_S = 60
"""How long a client waits for a server its supervisor is restarting (a JVM starts in 10 to 20 s here) before it
gives up with the retryable error."""
STOP_GRACE_S = 15
"""After SIGTERM (the JVM's shutdown hooks remove Spark's temporary folders), how long before SIGKILL."""
_MIN_TOKEN = 32
_CLIENT_MODE = frozenset({"SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE", CONNECT_TOKEN_ENV})
"""What PySpark sets in the environment of a process that opened a Spark Connect session (and its token)."""
_SERVER_ONLY = ("spark.connect.authenticate.", "spark.connect.grpc.binding.", "spark.connect.grpc.interceptor.")
"""`--conf` keys the server sets itself: its token (a `--conf` would put it on the JVM's command line, readable by
every user of the machine, and replace the server's own), where it listens, who may call it."""
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})

_REMOTE = re.compile(r"sc://(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):"
                     r"(?P<port>[0-9]{1,5})/?")


@dataclass(frozen=True)
class ConnectServer:
    pid: int
    host: str
    port: int
    gate_port: int
    token: str
    log_file: str
    conf: dict[str, str] = field(default_factory=dict)
    """The `--conf` settings it was started with (a second start with others is refused, `start`)."""

    def __repr__(self) -> str:  # never the token, in a traceback or a log
        return f"ConnectServer(pid {self.pid}, {self.host}:{self.port}, gate port {self.gate_port})"

    def reach(self) -> str:
        """The address a client on this machine uses (a server bound to every address answers on loopback)."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host

    def url(self) -> str:
        return f"sc://{self.reach()}:{self.port}"

    def remote(self) -> Remote:
        return Remote(self.url(), self.reach(), self.gate_port, self.token)


@dataclass(frozen=True)
class Remote:
    """Where a `connect` session goes: the Spark Connect address, the gate's host and port, the server's token
    (Connect's and the gate's), and whether both are reached over TLS (`tls`, trusting the CA bundle `ca`, or the
    system's when None): required for a server not on this machine."""

    url: str
    gate_host: str
    gate_port: int
    token: str
    tls: bool = False
    ca: str | None = None

    def __repr__(self) -> str:  # never the token, in a traceback or a log
        return f"Remote({self.url!r}, gate {self.gate_host}:{self.gate_port}{', TLS' if self.tls else ''})"


def is_loopback(host: str) -> bool:
    """`host` names this machine's loopback (a name or address); anything else is reached over a network."""
    if host.strip("[]").lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_remote(url: str, what: str = REMOTE_ENV) -> tuple[str, int]:
    """The host and port of `url` if it is `sc://HOST:PORT` (a name or address and a port from 1 to 65535), else a
    one-paragraph error. Nothing else is allowed in it: Spark Connect reads `;key=value` parameters (a token, TLS, a
    user id) from the URL, which are a deployment's business, not a setting to pass through unread."""
    found = _REMOTE.fullmatch(url.strip())
    if found is None or not 1 <= int(found.group("port")) <= 65535:
        # Shown up to its first `;`: what follows may be a token (`;token=...`), never repeated in a message.
        raise BadInputError(f"{what}={url.split(';')[0][:80]!r} is not a Spark Connect address; give sc://HOST:PORT "
                            "and nothing after it (a token goes in IOX_SPARK_GATE_TOKEN; for example "
                            "sc://127.0.0.1:15002), or unset it to use the project's own server (iox-batch spark "
                            "start)")
    return found.group("host"), int(found.group("port"))


def check_token(token: str, what: str = GATE_TOKEN_ENV) -> str:
    """`token` if it is at least 32 printable ASCII characters without spaces (it travels in an HTTP header)."""
    if len(token) < _MIN_TOKEN or len(token) > 512 or not all(33 <= ord(c) < 127 for c in token):
        raise BadInputError(f"{what} is not a usable token for the Spark Connect server; set {_MIN_TOKEN} or more "
                            "printable ASCII characters without spaces (for example the output of `openssl rand "
                            "-hex 32`), the same for the server and its clients")
    return token


def remote() -> Remote:
    """IOX_SPARK_REMOTE (its gate on the same host, IOX_SPARK_GATE_PORT or the Connect port + 1, with
    IOX_SPARK_GATE_TOKEN; over TLS when IOX_SPARK_TLS_CA is set), else the project's own server (started on demand
    and reused)."""
    env = config.SPARK_REMOTE.read()
    if not env:
        return ensure_running().remote()
    ca = config.SPARK_TLS_CA.read()
    return named_remote(env, config.SPARK_GATE_PORT.read() or None, config.SPARK_GATE_TOKEN.read() or None,
                        tls=ca is not None, ca=str(ca) if ca is not None else None)


def named_remote(url: str, gate_port: int | None, token: str | None, what: str = REMOTE_ENV,
                 gate_port_what: str = GATE_PORT_ENV, token_what: str = GATE_TOKEN_ENV, tls: bool = False,
                 ca: str | None = None,
                 tls_what: str = f"{TLS_CA_ENV} to the PEM file of the CA that signed its certificate") -> Remote:
    """A server named by its address (`url`, `check_remote`), its gate's port (None: the Connect port + 1), the
    server's token (required) and whether it is reached over TLS (`tls`, trusting `ca` or the system's CAs), each
    checked; `what` and the others name where each came from (a setting, a connection's field) in the error. A
    server not on this machine is refused without TLS: the token would travel in clear."""
    host, port = check_remote(url, what)
    if not token:
        raise BadInputError(f"{what} names a Spark Connect server but {token_what} is not set: the server runs "
                            "nothing for a client without the token it was started with (Spark Connect's and its "
                            "gate's); set it, or unset "
                            f"{what} to use the project's own server")
    gate = gate_port or port + 1
    if not 1 <= gate <= 65_535:
        raise BadInputError(f"{what} uses port {port}, so its gate's port ({gate}) is not a port; set "
                            f"{gate_port_what}")
    if not tls and not is_loopback(host):
        raise BadInputError(f"{what} names {host}, not this machine, without TLS: the server's token would travel "
                            "in clear. Put a TLS-terminating proxy in front of its Connect and gate ports (README: "
                            f"Spark Connect beyond one machine) and set {tls_what}")
    if ca is not None and not os.path.isfile(ca):
        raise BadInputError(f"{TLS_CA_ENV}={ca[:200]!r} is not a file; give the PEM file of the CA that signed "
                            "the TLS proxy's certificate")
    return Remote(f"sc://{host}:{port}", host.strip("[]"), gate, check_token(token, token_what), tls, ca)


@dataclass(frozen=True)
class Report:
    """What the supervisor of the server with pid `pid` is doing: `state` (starting, running, restarting, failed,
    stopped), how many times it restarted the server, why (the last restart's reason, or why it gave up), since
    when (Unix seconds)."""

    pid: int
    state: str
    restarts: int
    reason: str
    since: float


def report_file(log_file: str | Path) -> Path:
    """Where the supervisor of the server logging to `log_file` reports (`spark-connect.status.json` beside it)."""
    return Path(log_file).with_suffix(".status.json")


def write_report(path: Path, report: Report) -> None:
    staged = path.with_suffix(".tmp")
    staged.write_text(json.dumps(asdict(report)))
    os.replace(staged, path)


def read_report(server: ConnectServer) -> Report | None:
    """The report of `server`'s own supervisor (one of an earlier server, another pid, is not its)."""
    try:
        report = Report(**json.loads(report_file(server.log_file).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return report if report.pid == server.pid else None


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


def _record(server: ConnectServer) -> None:
    """The state file, readable by this user only (it holds the gate's token), replaced whole."""
    staged = _state_file().with_suffix(".tmp")
    staged.unlink(missing_ok=True)
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(asdict(server)))
    os.replace(staged, _state_file())


def _is_ours(pid: int) -> bool:
    """`pid` runs (not a zombie) and is a Spark Connect server or its supervisor: a pid reused by another process
    is not ours."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
        cmdline = (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False
    argv = cmdline.split(b"\0")
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and (SERVER_MODULE.encode() in argv or
                                                          SUPERVISOR_MODULE.encode() in argv)


def _answers(server: ConnectServer) -> bool:
    """Both ports accept a connection (the gate opens only once the session, and Connect with it, is up)."""
    for port in (server.port, server.gate_port):
        try:
            with socket.create_connection((server.reach(), port), timeout=0.5):
                pass
        except OSError:
            return False
    return True


def status() -> tuple[ConnectServer | None, str]:
    """The recorded server and what it is doing (`server_state`), or `stopped` when nothing is recorded."""
    server = _recorded()
    if server is None:
        return None, "stopped"
    return server, server_state(server)


def server_state(server: ConnectServer) -> str:
    """`running` (it answers), `starting` (its first start, not answering yet), `restarting` (its supervisor is
    starting it again: `read_report` says why and how often), `failed` (its supervisor gave up: the report says
    why), or `stale` (its process is gone, or is no longer this server)."""
    report = read_report(server)
    if not _is_ours(server.pid):
        return "failed" if report is not None and report.state == "failed" else "stale"
    if _answers(server):
        return "running"
    return "restarting" if report is not None and report.state == "restarting" else "starting"


# --- start and stop --------------------------------------------------------------------------------------------


def ensure_running() -> ConnectServer:
    """The project's server, started if it is not running (see `start`)."""
    server, state = status()
    if state == "running" and server is not None:
        return server
    if state == "failed" and server is not None:
        report = read_report(server)
        raise SparkUnavailableError(f"the Spark Connect server at {server.url()} failed and is not restarted by "
                                    f"itself: {report.reason if report else 'see its log'} (log {server.log_file}); "
                                    "`iox-batch spark start` starts it again")
    return start()


def check_ports(port: int | None, what: str = "--port") -> None:
    """`port` (None: a free one) is a port whose gate's port, the next one, is a port too."""
    if port is not None and not 1 <= port <= 65_534:
        raise BadInputError(f"{what} {port} cannot be the Connect port: the server's gate listens on the port after "
                            "it, so give one from 1 to 65534 (or none for a free one)")


def start(port: int | None = None, host: str | None = None, conf: Mapping[str, str] | None = None) -> ConnectServer:
    """Start the project's Spark Connect server, or return the one already running when it matches what is asked:
    `port`, `host` and `conf` (None: not asked, whatever the running one has) that differ from the running server's
    are refused (it would not be what was asked for; stop it first). A stale record (its process gone) is replaced.
    Waits until it answers. Its token is IOX_SPARK_GATE_TOKEN when set (a deployment whose clients are elsewhere
    shares it), else a new random one, known only through the state file."""
    check_ports(port)
    with _lock():
        server, state = status()
        if server is not None and state in ("running", "starting", "restarting"):
            _check_same(server, port, host, conf)
            return _wait(server, None, RESTART_WAIT_S if state == "restarting" else START_TIMEOUT_S)
        _state_file().unlink(missing_ok=True)
        token = config.SPARK_GATE_TOKEN.read()
        server, proc = launch(state_dir() / "spark-connect.log", port, host or "127.0.0.1", conf,
                              token=check_token(token) if token else None)
        _record(server)
        try:
            return _wait(server, proc)
        except BaseException:
            _stop_group(server.pid)
            _state_file().unlink(missing_ok=True)
            raise


def _check_same(server: ConnectServer, port: int | None, host: str | None, conf: Mapping[str, str] | None) -> None:
    """A start that asks for nothing, or for what `server` has, keeps it; one asking for another port, bind address
    or settings is refused rather than silently given the running server."""
    differ = []
    if port is not None and port != server.port:
        differ.append(f"--port {port} (it listens on {server.port})")
    if host is not None and host != server.host:
        differ.append(f"--host {host} (it is bound to {server.host})")
    if conf and dict(conf) != server.conf:
        differ.append(f"--conf {_shown_conf(conf)} (it has {_shown_conf(server.conf)})")
    if differ:
        raise BadInputError(f"a Spark Connect server is already running (pid {server.pid}) and this start asks for "
                            f"another: {'; '.join(differ)}. It is kept as it is; to run one with these options, "
                            "stop it first (`iox-batch spark stop`), then start it again")


def _shown_conf(conf: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(conf.items()))[:300] or "none"


def launch(log: Path, port: int | None = None, host: str = "127.0.0.1", conf: Mapping[str, str] | None = None,
           token: str | None = None) -> tuple[ConnectServer, subprocess.Popen[bytes]]:
    """Start a Connect server process in a process group of its own, its output appended to `log`; nothing
    recorded, not waited for (`start` does both; a test starts a private server it may kill with this). The gate
    listens on `port` + 1 when `port` is given (what IOX_SPARK_GATE_PORT defaults to), else on a free port."""
    check_ports(port)
    chosen = port or _free_port(host)
    gate_port = chosen + 1 if port else _free_port(host, avoid=chosen)
    token = token or secrets.token_hex(32)
    # The token reaches the server in its environment (a command line is readable by every user of the machine;
    # an environment by this user only, as the state file); the server hands it to its JVM the same way. A process
    # that is itself a Connect client (PySpark marks it in its environment) does not pass that on: the server's own
    # session would try to be a client too.
    env = {**{k: v for k, v in os.environ.items() if k not in _CLIENT_MODE}, **spark_env(), GATE_TOKEN_ENV: token}
    report_file(log).unlink(missing_ok=True)
    supervised = [sys.executable, "-m", SUPERVISOR_MODULE, "--report", str(report_file(log)), "--",
                  *server_command(chosen, gate_port, host, conf)]
    with open(log, "ab") as sink:
        proc = subprocess.Popen(supervised, stdin=subprocess.DEVNULL,
                                stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=str(log.parent),
                                start_new_session=True)
    return ConnectServer(proc.pid, host, chosen, gate_port, token, str(log), dict(conf or {})), proc


def wait_until_up(server: ConnectServer, proc: subprocess.Popen[bytes]) -> ConnectServer:
    """`server` once it answers; `SparkUnavailableError` if its process ends first or it stays silent."""
    return _wait(server, proc)


def stop_server(server: ConnectServer) -> None:
    """Stop `server`'s whole process group (its JVM and Python workers), SIGKILL after `STOP_GRACE_S`."""
    _stop_group(server.pid)


def server_command(port: int, gate_port: int, host: str, conf: Mapping[str, str] | None = None) -> list[str]:
    """The server process: this interpreter running `spark_jobs/connect_server.py` (the user's `--conf` passed on;
    it adds iox-batch's session settings and what the server must have whatever they say)."""
    cmd = [sys.executable, "-m", SERVER_MODULE, "--host", host, "--port", str(port), "--gate-port", str(gate_port)]
    for key, value in (conf or {}).items():
        cmd += ["--conf", f"{key}={value}"]
    return cmd


def _wait(server: ConnectServer, proc: subprocess.Popen[bytes] | None,
          seconds: float = START_TIMEOUT_S) -> ConnectServer:
    deadline = time.monotonic() + seconds
    while not _answers(server):
        ended = proc.poll() if proc is not None else (None if _is_ours(server.pid) else -1)
        report = read_report(server)
        if ended is not None or (report is not None and report.state == "failed"):
            why = report.reason if report is not None and report.reason else _log_tail(server.log_file)
            raise SparkUnavailableError(f"the Spark Connect server did not start (exit status {ended}); its log "
                                        f"{server.log_file} says why: {why}")
        if time.monotonic() > deadline:
            doing = f", restarting ({report.reason})" if report is not None and report.state == "restarting" else ""
            raise SparkUnavailableError(f"the Spark Connect server (pid {server.pid}{doing}) did not answer on ports "
                                        f"{server.port} and {server.gate_port} within {seconds:.0f} s; see its log "
                                        f"{server.log_file}, and run the command again once `iox-batch spark "
                                        "status` says running")
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


def _free_port(host: str, avoid: int = 0) -> int:
    while True:
        with socket.socket() as sock:
            sock.bind((host if host not in ("0.0.0.0", "::") else "", 0))
            port = int(sock.getsockname()[1])
        if port != avoid:
            return port


def _log_tail(path: str, lines: int = 3) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    wanted = [line for line in text.splitlines() if "ERROR" in line or "Exception" in line] or text.splitlines()
    return " / ".join(wanted[-lines:])[:800]


def parse_conf(items: Sequence[str]) -> dict[str, str]:
    """`--conf key=value` options of `iox-batch spark start`."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().startswith("spark."):
            raise BadInputError(f"--conf {item[:80]!r} is not a Spark setting; give spark.KEY=VALUE (for example "
                                "--conf spark.driver.memory=4g)")
        if key.strip().startswith(_SERVER_ONLY):
            raise BadInputError(f"--conf {key.strip()[:80]} is set by iox-batch itself: the server's token (from "
                                f"{GATE_TOKEN_ENV} or a random one, in the environment, never on a command line), "
                                "its address (--host, --port) and who may call it; leave it out")
        check_not_secret(key.strip(), value, "--conf")
        out[key.strip()] = value.strip()
    return out
