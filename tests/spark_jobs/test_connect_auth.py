"""Only iox-batch reaches its Spark Connect server (issue 31): every server it starts requires its token (Spark
Connect's own, the gate's too), so plain PySpark without it, or with a wrong one, is refused before any plan runs;
the token is on no command line and in no output, log or message; through a TLS-terminating proxy (nginx, as
docker-compose.yml runs it, from scripts/spark-tls-proxy.conf.template) a client elsewhere reaches both ports over
TLS only; and `iox-batch spark start` refuses what it would otherwise silently ignore or expose.

The tests share the run's private server (`tests/connect_support.py`, on the Connect worker). Every Connect client
is a child process: a Connect session switches its whole Python process to Connect mode."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from common_support import assert_one_paragraph_error, run_cli
from connect_support import Server
from iox_planner.catalog.store import Catalog
from iox_planner.ingest.scenario import load_scenario, read_scenario

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "scripts" / "spark-tls-proxy.conf.template"
COUNT = "SELECT count(*) AS n FROM h2o"

# Plain PySpark, as any local process could run it: `SparkSession.builder.remote(url)`, a query and a `reflect`
# call (run anything in the JVM). Prints one JSON line: what each call gave, or the gRPC status that refused it.
PLAIN = textwrap.dedent("""
    import json, sys
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.retries import DefaultPolicy
    out = {}
    try:
        spark = SparkSession.builder.remote(sys.argv[1]).create()
        spark.client.set_retry_policies([DefaultPolicy(max_retries=0)])  # an answer, not 10 minutes of retries
        for name, sql in (("sql", "SELECT 41 + 1 AS n"),
                          ("reflect", "SELECT reflect('java.lang.System', 'getProperty', 'user.name') AS u")):
            try:
                out[name] = str(spark.sql(sql).collect()[0][0])
            except Exception as err:
                code = getattr(err, "getGrpcStatusCode", None)
                out[name] = "refused: " + (code().name if code else type(err).__name__)
    except Exception as err:
        out["session"] = "refused: " + type(err).__name__
    print(json.dumps(out))
""")


def plain_pyspark(url: str, env: dict[str, str] | None = None) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_CONNECT", "SPARK_REMOTE"))}
    done = subprocess.run([sys.executable, "-c", PLAIN, url], capture_output=True, text=True, timeout=300,
                          env={**clean, **(env or {})})
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def wrong(token: str) -> str:
    return token[:-1] + ("0" if token[-1] != "0" else "1")


@pytest.fixture
def h2o(catalog: Catalog, db: str) -> str:
    load_scenario(catalog, read_scenario(ROOT / "examples" / "h2o.yaml"), db)
    return db


def group_cmdlines(pgid: int) -> list[bytes]:
    """The command lines of every process of the server's group: its Python process, its JVM, its workers."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    found.append((entry / "cmdline").read_bytes())
            except (OSError, ProcessLookupError):
                continue
    return found


def test_plain_pyspark_without_the_token_or_with_a_wrong_one_runs_nothing(connect_server: Server) -> None:
    connect_server.up()
    server = connect_server.server
    port, token = server.port, server.token
    # PySpark sends a token without TLS to `localhost` only (its ChannelBuilder).
    for url in (f"sc://127.0.0.1:{port}", f"sc://localhost:{port}/;token={wrong(token)}"):
        got = plain_pyspark(url)
        assert got == {"sql": "refused: UNAUTHENTICATED", "reflect": "refused: UNAUTHENTICATED"}, (url, got)
    got = plain_pyspark(f"sc://localhost:{port}", env={"SPARK_CONNECT_AUTHENTICATE_TOKEN": wrong(token)})
    assert got == {"sql": "refused: UNAUTHENTICATED", "reflect": "refused: UNAUTHENTICATED"}, got
    # With it, the same client runs both: what was refused was the token, nothing else.
    got = plain_pyspark(f"sc://localhost:{port}", env={"SPARK_CONNECT_AUTHENTICATE_TOKEN": token})
    assert got["sql"] == "42" and not got["reflect"].startswith("refused"), got
    # The JVM has it from its environment: no process of the server has it on its command line (world-readable).
    cmdlines = group_cmdlines(server.pid)
    assert any(b"java" in c for c in cmdlines), "the server's JVM was not found among its processes"
    assert not [c for c in cmdlines if token.encode() in c]


def test_the_token_appears_in_no_output_log_or_message(connect_server: Server, connect: dict[str, str],
                                                      h2o: str) -> None:
    token = connect_server.server.token
    ok = run_cli("query", "--db", h2o, "--format", "jsonl", COUNT, env=connect)
    assert ok.returncode == 0 and json.loads(ok.stdout) == {"n": 8}, ok.stderr
    # A wrong token: refused by Spark Connect itself, before its gate or any plan, in one paragraph.
    bad = {**connect, "IOX_SPARK_GATE_TOKEN": wrong(token)}
    refused = run_cli("query", "--db", h2o, COUNT, env=bad)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert_one_paragraph_error(refused, "refused the token", "IOX_SPARK_GATE_TOKEN")
    failed = run_cli("query", "--db", h2o, "SELECT no_such_column FROM h2o", env=connect)
    assert failed.returncode != 0
    for seen in (ok.stdout, ok.stderr, refused.stdout, refused.stderr, failed.stdout, failed.stderr,
                 connect_server.log.read_text(errors="replace")):
        assert token not in seen and wrong(token) not in seen
    assert token not in repr(connect_server.server) and token not in repr(connect_server.server.remote())


# --- through a TLS-terminating proxy ----------------------------------------------------------------------------


def this_machines_address() -> str | None:
    """An address of this machine that is not loopback (no packet is sent), else None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
            address = str(probe.getsockname()[0])
        except OSError:
            return None
    return None if ipaddress.ip_address(address).is_loopback else address


def certificates(folder: Path, address: str) -> tuple[Path, Path, Path]:
    """A CA, and a certificate it signed for `address`: the CA file, the certificate, its key."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.timezone.utc)

    def cert(subject: str, key: Any, issuer: Any, issuer_key: Any, ca: bool) -> Any:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(address))]), critical=False)
        return builder.sign(issuer_key or key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = cert("iox-batch test CA", ca_key, None, None, True)
    leaf = cert(address, key, ca.subject, ca_key, False)
    paths = folder / "ca.pem", folder / "proxy.pem", folder / "proxy.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    paths[2].chmod(0o600)
    return paths


def free_pair(address: str) -> int:
    """A port whose next one is free too (the proxy's gate listens on the Connect port + 1, as the server's)."""
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind((address, 0))
            port = a.getsockname()[1]
            try:
                b.bind((address, port + 1))
            except OSError:
                continue
            return int(port)
    raise AssertionError("no two free ports in a row")


@pytest.fixture(scope="module")
def tls_proxy(connect_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """nginx from the committed template, on an address of this machine that is not loopback, in front of the
    private server (bound to loopback); its CA, made here."""
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if nginx is None:
        pytest.skip("no nginx here (`make test` installs it: Debian's nginx package)")
    address = this_machines_address()
    if address is None:
        pytest.skip("this machine has no address beyond loopback")
    connect_server.up()
    server = connect_server.server
    folder = tmp_path_factory.mktemp("tls-proxy")
    ca, cert, key = certificates(folder, address)
    port = free_pair(address)
    servers = TEMPLATE.read_text()
    for name, value in {"IOX_PROXY_CONNECT_LISTEN": f"{address}:{port}", "IOX_PROXY_GATE_LISTEN":
                        f"{address}:{port + 1}", "IOX_PROXY_CONNECT_UPSTREAM": f"127.0.0.1:{server.port}",
                        "IOX_PROXY_GATE_UPSTREAM": f"127.0.0.1:{server.gate_port}", "IOX_PROXY_CERT": str(cert),
                        "IOX_PROXY_KEY": str(key)}.items():
        servers = servers.replace("${" + name + "}", value)
    assert "${" not in servers
    (folder / "servers.conf").write_text(servers)
    (folder / "nginx.conf").write_text(textwrap.dedent(f"""
        worker_processes 1;
        pid {folder}/nginx.pid;
        error_log {folder}/error.log warn;
        events {{ worker_connections 64; }}
        http {{
            access_log off;
            client_body_temp_path {folder}/body;
            proxy_temp_path {folder}/proxy;
            fastcgi_temp_path {folder}/fastcgi;
            uwsgi_temp_path {folder}/uwsgi;
            scgi_temp_path {folder}/scgi;
            include {folder}/servers.conf;
        }}
    """))
    proc = subprocess.Popen([nginx, "-p", str(folder), "-c", str(folder / "nginx.conf"), "-g", "daemon off;"],
                            stdout=subprocess.DEVNULL, stderr=open(folder / "stderr.log", "w"),
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection((address, port + 1), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, (folder / "stderr.log").read_text()
                time.sleep(0.1)
        env = {"IOX_RUNNER": "connect", "JAVA_HOME": "/nonexistent/java", "IOX_SPARK_REMOTE":
               f"sc://{address}:{port}", "IOX_SPARK_GATE_PORT": str(port + 1), "IOX_SPARK_GATE_TOKEN": server.token,
               "IOX_SPARK_TLS_CA": str(ca)}
        yield {"env": env, "address": address, "port": port, "ca": ca, "token": server.token}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_through_a_tls_proxy_a_query_runs_and_without_tls_or_the_token_nothing_does(
        tls_proxy: dict[str, Any], h2o: str) -> None:
    env, address, port, token = tls_proxy["env"], tls_proxy["address"], tls_proxy["port"], tls_proxy["token"]
    ok = run_cli("query", "--db", h2o, "--format", "jsonl", COUNT, env=env)
    assert ok.returncode == 0 and json.loads(ok.stdout) == {"n": 8}, ok.stderr
    assert token not in ok.stdout + ok.stderr
    # The same path without TLS: iox-batch will not send the token in clear to another host.
    plain = {k: v for k, v in env.items() if k != "IOX_SPARK_TLS_CA"}
    refused = run_cli("query", "--db", h2o, COUNT, env=plain)
    assert refused.returncode == 2
    assert_one_paragraph_error(refused, "without TLS", "IOX_SPARK_TLS_CA")
    assert token not in refused.stderr
    # Nor does the proxy answer a client that speaks no TLS, token or not.
    got = plain_pyspark(f"sc://{address}:{port}")
    assert all(v.startswith("refused") for v in got.values()) and got, got
    # Over TLS, trusting its CA, but without the token (or with a wrong one): the server refuses it.
    roots = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(tls_proxy["ca"])}
    for url in (f"sc://{address}:{port}/;use_ssl=true", f"sc://{address}:{port}/;use_ssl=true;token={wrong(token)}"):
        got = plain_pyspark(url, env=roots)
        assert got == {"sql": "refused: UNAUTHENTICATED", "reflect": "refused: UNAUTHENTICATED"}, (url, got)
    # And with it, through the proxy: the refusals above were the token's.
    got = plain_pyspark(f"sc://{address}:{port}/;use_ssl=true", env={**roots,
                                                                     "SPARK_CONNECT_AUTHENTICATE_TOKEN": token})
    assert got["sql"] == "42", got
    # A CA that did not sign the proxy's certificate: refused as a server not reached, nothing sent.
    other = Path(tls_proxy["ca"]).parent / "other"
    other.mkdir(exist_ok=True)
    untrusted = run_cli("query", "--db", h2o, COUNT, env={**env, "IOX_SPARK_TLS_CA": str(certificates(other,
                                                                                                   address)[0])})
    assert untrusted.returncode == 75, (untrusted.stdout, untrusted.stderr)


# --- iox-batch spark start --------------------------------------------------------------------------------------


def test_spark_start_refuses_a_port_without_a_gate_port_a_bare_public_bind_and_the_token_as_conf() -> None:
    for args, needles in (
            (("--port", "65535"), ("--port 65535", "gate", "65534")),
            (("--port", "0"), ("--port 0", "from 1 to 65534")),
            (("--host", "0.0.0.0"), ("--host 0.0.0.0", "in clear", "--behind-tls-proxy")),
            (("--conf", "spark.connect.authenticate.token=x" * 4), ("spark.connect.authenticate.token", "set by"))):
        # No Java: were the refusal missing, the start would fail rather than start the project's own server.
        result = run_cli("spark", "start", *args, env={"JAVA_HOME": "/nonexistent/java"})
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert_one_paragraph_error(result, *needles)


def test_the_server_process_refuses_to_start_without_a_token_on_any_address() -> None:
    """`python -m spark_jobs.connect_server` itself (what `spark start` runs) refuses a missing or short token before
    its JVM starts, whether bound to loopback or beyond it."""
    env = {k: v for k, v in os.environ.items() if k != "IOX_SPARK_GATE_TOKEN"}
    for host, token in (("0.0.0.0", None), ("127.0.0.1", None), ("0.0.0.0", "short")):
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "spark_jobs.connect_server", "--host", host, "--port", "1",
                               "--gate-port", "2"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                              env={**env, "JAVA_HOME": "/nonexistent/java",
                                   **({"IOX_SPARK_GATE_TOKEN": token} if token else {})})
        # Missing: the server's own refusal; too short: the settings registry's, before it (both one paragraph).
        assert done.returncode == 2, (host, done.stderr[-2000:])
        assert "IOX_SPARK_GATE_TOKEN" in done.stderr and "printable ASCII characters" in done.stderr, done.stderr
        assert time.monotonic() - started < 60


def test_a_second_start_asking_for_another_server_is_refused_and_a_plain_one_keeps_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A running server (a process that is one by its command line, and both its ports listening) is kept by a
    plain start or one asking for what it has; another port, address or settings are refused, it untouched."""
    from iox_planner.errors import BadInputError
    from iox_planner.spark import server as sparkserver

    monkeypatch.setattr(sparkserver, "state_dir", lambda: tmp_path)
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", sparkserver.SERVER_MODULE])
    listening = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    try:
        running = sparkserver.ConnectServer(stand_in.pid, "127.0.0.1", listening[0].getsockname()[1],
                                            listening[1].getsockname()[1], "t" * 64, str(tmp_path / "log"),
                                            {"spark.driver.memory": "1g"})
        sparkserver._record(running)
        assert sparkserver.start() == running
        assert sparkserver.start(running.port, "127.0.0.1", {"spark.driver.memory": "1g"}) == running
        for asked, needle in (({"port": running.port + 2}, f"--port {running.port + 2}"),
                              ({"host": "0.0.0.0"}, "--host 0.0.0.0"),
                              ({"conf": {"spark.driver.memory": "2g"}}, "spark.driver.memory=2g")):
            with pytest.raises(BadInputError) as refused:
                sparkserver.start(**asked)  # type: ignore[arg-type]
            message = str(refused.value)
            assert needle in message and "stop it first" in message and "\n" not in message, message
            assert "t" * 64 not in message
            assert sparkserver.status() == (running, "running") and stand_in.poll() is None
    finally:
        stand_in.kill()
        stand_in.wait()
        for sock in listening:
            sock.close()
