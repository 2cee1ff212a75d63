"""The object store's secret is never shown (issue 32, item 1): CLI commands over an `s3://` warehouse on the suite's
S3 server, succeeding and failing (a URI carrying credentials, the store cut mid-run, a wrong endpoint, `IOX_DEBUG=1`
tracebacks), with a distinctive secret key and session token in their environment; the secret appears in no output,
no plan, no row of the catalog (every table of the test database dumped), no file the project keeps under `.iox/`,
no command line of spark-submit, its JVM or its Python processes, nor the Spark Connect server's state file or log.
Those processes do get every standard `AWS_*` setting, through their environment (read from `/proc/<pid>/environ`):
that is how Spark's executors and Python workers reach the store without a shared disk.

Real processes throughout: the installed `iox-batch`, real spark-submit, the run's private Connect server, the
suite's S3 server (moto's standalone server) and a TCP proxy cut under a running command."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from common_support import FULL, assert_one_paragraph_error, free_port, run_cli, sampled
from connect_support import Server, runner_param
from iox_planner.catalog.store import Catalog
from s3_support import BUCKET, CREDENTIALS, CuttableProxy

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
SECRET = CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
SESSION_TOKEN = "iox-test-session-token-never-shown-5e1f"
SECRETS = (SECRET, SESSION_TOKEN)
T0 = 1704067200 * 10**9
LINES = "\n".join(f"cpu,host=h{i % 3} usage={i} {T0 + i * 10**9}" for i in range(30)) + "\n"


def store_env(tmp_path: Path) -> dict[str, str]:
    """Every standard setting a process reaches the store with, each with a value a test can recognize: the
    suite's credentials and endpoint, a session token, a profile and files that name none (the environment's keys
    come first in the AWS credential chain)."""
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    (tmp_path / "aws-config").write_text("[default]\n")
    (tmp_path / "aws-credentials").write_text("")
    return {**CREDENTIALS, "AWS_SESSION_TOKEN": SESSION_TOKEN, "AWS_DEFAULT_REGION": CREDENTIALS["AWS_REGION"],
            "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint, "AWS_PROFILE": "default",
            "AWS_CONFIG_FILE": str(tmp_path / "aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "aws-credentials")}


def test_the_tests_set_every_setting_the_code_passes_to_spark_processes(tmp_path: Path) -> None:
    from iox_planner.spark.conf import STORE_ENV

    assert set(store_env(tmp_path)) == set(STORE_ENV)


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"a secret was shown: ...{text[max(0, text.find(secret) - 300):][:800]}"


def catalog_dump(catalog: Catalog) -> str:
    """Every row of every table of the test database, as text."""
    out = []
    with catalog.engine.connect() as conn:
        tables = conn.execute(sa.text(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_schema NOT IN ('pg_catalog', 'information_schema') AND table_type = 'BASE TABLE'")).all()
        assert len(tables) >= 6, tables
        for schema, table in tables:
            for row in conn.execute(sa.text(f'SELECT * FROM "{schema}"."{table}"')):
                out.append(f"{table}: {tuple(row)!r}")
    return "\n".join(out)


def state_files_since(started: float) -> str:
    """What the project's state folder (`.iox/`: logs, locks, the Connect server's state) took in since `started`."""
    texts = []
    for path in (ROOT / ".iox").rglob("*"):
        try:
            if path.is_file() and path.stat().st_mtime >= started and path.stat().st_size < 50_000_000:
                texts.append(path.read_text(errors="replace"))
        except OSError:
            continue  # gone meanwhile
    return "\n".join(texts)


class ProcessWatch:
    """Every process below `root` (or, with `group`, in the process group `root`), seen while it lives: its
    command line and its environment, read from /proc every 50 ms (a JVM or a Python worker lives for seconds)."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[bytes, dict[str, str]]] = {}
        self._stop = threading.Event()
        self._root: int | None = None
        self._group = False
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def watch(self, root: int, group: bool = False) -> "ProcessWatch":
        self._root, self._group = root, group
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _members(self) -> list[int]:
        assert self._root is not None
        if self._group:
            pids = []
            for entry in Path("/proc").iterdir():
                try:
                    if entry.name.isdigit() and os.getpgid(int(entry.name)) == self._root:
                        pids.append(int(entry.name))
                except OSError:
                    continue
            return pids
        # Down the tree through each thread's `children` file: a few reads a process, not one per process of the
        # machine (a full /proc scan every few milliseconds would slow the very job it watches).
        below, todo = [], [self._root]
        while todo:
            pid = todo.pop()
            try:
                tasks = list((Path("/proc") / str(pid) / "task").iterdir())
            except OSError:
                continue
            for task in tasks:
                try:
                    children = [int(c) for c in (task / "children").read_text().split()]
                except OSError:
                    continue
                below.extend(children)
                todo.extend(children)
        return below

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.scan()
            time.sleep(0.05)

    def scan(self) -> None:
        for pid in self._members():
            try:
                cmdline = (Path("/proc") / str(pid) / "cmdline").read_bytes()
                raw = (Path("/proc") / str(pid) / "environ").read_bytes()
            except OSError:
                continue
            if not cmdline:
                continue  # a zombie
            env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
            self.seen.setdefault(pid, (cmdline, env))

    def named(self, *needles: bytes) -> list[tuple[bytes, dict[str, str]]]:
        return [(cmd, env) for cmd, env in self.seen.values() if any(n in cmd for n in needles)]


@pytest.fixture
def s3_db(s3_warehouse: str, catalog: Catalog, db: str) -> str:
    """A database on the test's `s3://` warehouse, with a persisted Parquet file and an ingester chunk."""
    for args in (("write", "--db", db, "-"), ("persist", "--db", db), ("write", "--db", db, "-")):
        done = run_cli(*args, stdin=LINES if args[0] == "write" else None)
        assert done.returncode == 0, done.stderr
    return db


def test_cli_commands_over_an_s3_warehouse_succeeding_or_failing_never_show_the_secret(
        s3_db: str, s3_server: Any, catalog: Catalog, tmp_path: Path) -> None:
    started = time.time()
    env = store_env(tmp_path)
    outputs: list[str] = []

    def run(*args: str, stdin: str | None = None, **extra: str) -> Any:
        done = run_cli(*args, stdin=stdin, env={**env, **extra})
        outputs.extend((done.stdout, done.stderr))
        return done

    # What works: a write, a persist, show, a plan as JSON (what a run record keeps), a compaction's plan.
    for args in (("write", "--db", s3_db, "-"), ("persist", "--db", s3_db), ("show", "--db", s3_db),
                 ("explain", "--db", s3_db, "--format", "json", "SELECT host, max(usage) FROM cpu GROUP BY host")):
        done = run(*args, stdin=LINES if args[0] == "write" else None)
        assert done.returncode == 0, (args, done.stderr)
    assert json.loads(outputs[-2])  # the plan, as JSON
    before = {(m, p) for m, p, _ in s3_server.requests()}
    assert any(m == "PUT" and p.startswith(f"/{BUCKET}/") for m, p in before), "nothing was put in the store"

    # A URI carrying the credentials (or a presigned-style query with the token), wherever a location is taken.
    # (A CLI run costs a second or two: CI runs a sample of these, `sampled`, IOX_TEST_ALL=1 all.)
    credentials = f"s3://{CREDENTIALS['AWS_ACCESS_KEY_ID']}:{SECRET}@{BUCKET}/wh"
    presigned = f"s3://{BUCKET}/wh?X-Amz-Security-Token={SESSION_TOKEN}"
    for setting, uri in sampled([("IOX_WAREHOUSE", credentials), ("IOX_WAREHOUSE", presigned),
                                 ("IOX_OUTPUT_ROOT", credentials), ("IOX_OUTPUT_ROOT", presigned)], 2):
        done = run("show", "--db", s3_db, **{setting: uri})
        assert done.returncode == 2, (setting, uri, done.stderr)
        assert_one_paragraph_error(done, setting)
    for args in sampled([("load", f"s3://key:{SECRET}@{BUCKET}/h2o.yaml"),
                         ("write", "--db", s3_db, f"s3://key:{SECRET}@{BUCKET}/lines.lp"),
                         ("query", "--db", s3_db, "--sql-file",
                          f"https://{BUCKET}.example/q.sql?token={SESSION_TOKEN}")], 2):
        done = run(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert_one_paragraph_error(done)

    # A Spark setting that would carry a credential on a command line: refused before anything starts.
    for conf in (f"spark.hadoop.fs.s3a.secret.key={SECRET}", f"spark.executorEnv.AWS_SESSION_TOKEN={SESSION_TOKEN}",
                 f"spark.app.name={SECRET}")[:3 if FULL else 2]:
        # (on a local warehouse: a query needs no table here, and must be refused before spark-submit starts)
        done = run("query", "--db", s3_db, "SELECT 1 AS one", IOX_SPARK_CONF=conf, IOX_RUNNER="spark-submit",
                   IOX_WAREHOUSE=str(tmp_path))
        assert done.returncode == 2, (conf, done.stdout, done.stderr)
        assert_one_paragraph_error(done, "IOX_SPARK_CONF", "AWS_")
        done = run("spark", "start", "--conf", conf, JAVA_HOME="/nonexistent/java")
        assert done.returncode == 2, (conf, done.stdout, done.stderr)
        assert_one_paragraph_error(done, "--conf", "AWS_")

    # The store gone mid-command (a proxy in front of it, cut), and an endpoint where nothing answers: the
    # retryable error (75) in one paragraph (IOX_DEBUG=1 too: it traces internal errors only), without a secret.
    proxy = CuttableProxy(s3_server.port)
    try:
        run("write", "--db", s3_db, "-", stdin=LINES)
        proxy.cut()
        done = run("persist", "--db", s3_db, AWS_ENDPOINT_URL=proxy.endpoint, AWS_ENDPOINT_URL_S3=proxy.endpoint)
        assert done.returncode == 75, (done.stdout, done.stderr[-3000:])
        assert_one_paragraph_error(done, "object store", "try again")
    finally:
        proxy.stop()
    nowhere = f"http://127.0.0.1:{free_port()}"
    done = run("persist", "--db", s3_db, IOX_DEBUG="1", AWS_ENDPOINT_URL=nowhere, AWS_ENDPOINT_URL_S3=nowhere)
    assert done.returncode == 75, (done.stdout, done.stderr[-3000:])
    assert_one_paragraph_error(done, "object store", "try again")  # IOX_DEBUG=1 traces internal errors only
    # An endpoint carrying credentials is refused, and not repeated.
    done = run("persist", "--db", s3_db, AWS_ENDPOINT_URL_S3=f"http://key:{SECRET}@127.0.0.1:9",
               AWS_ENDPOINT_URL=f"http://key:{SECRET}@127.0.0.1:9")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert_one_paragraph_error(done, "AWS_ENDPOINT_URL")

    assert_no_secret(*outputs, catalog_dump(catalog), state_files_since(started))


@pytest.fixture
def h2o_local(catalog: Catalog, db: str) -> str:
    from iox_planner.ingest.scenario import load_scenario, read_scenario

    load_scenario(catalog, read_scenario(ROOT / "examples" / "h2o.yaml"), db)
    return db


def assert_store_settings_inherited(seen: list[tuple[bytes, dict[str, str]]], env: dict[str, str]) -> None:
    """Each process has every `AWS_*` setting of `env`, unchanged, and none on its command line."""
    assert seen
    for cmdline, environ in seen:
        assert_no_secret(cmdline.decode(errors="replace"))
        missing = {k for k, v in env.items() if environ.get(k) != v}
        assert not missing, (cmdline[:300], missing)


COUNT_BY_STATE = "SELECT state, count(*) AS n FROM h2o GROUP BY state ORDER BY state"
COUNTED = [{"state": "CA", "n": 4}, {"state": "MA", "n": 4}]


def watched_query(db: str, env: dict[str, str]) -> tuple[int, str, str, ProcessWatch]:
    """`iox-batch query` of COUNT_BY_STATE as a process of its own, every process under it watched: its exit
    status, output, error output and the watch. No command line it ran may hold a secret."""
    import subprocess
    import sys

    exe = Path(sys.executable).parent / "iox-batch"
    proc = subprocess.Popen([str(exe), "query", "--db", db, "--format", "jsonl", COUNT_BY_STATE],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
    watch = ProcessWatch().watch(proc.pid)
    try:
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        watch.stop()
    assert_no_secret(stdout, stderr, *(c.decode(errors="replace") for c, _ in watch.seen.values()))
    return proc.returncode, stdout, stderr, watch


def test_spark_submit_and_its_python_get_the_store_settings_in_their_environment_never_on_a_command_line(
        h2o_local: str, catalog: Catalog, tmp_path: Path) -> None:
    """The spark-submit runner: its launcher script, its JVM and the job's Python (and any Python worker) each
    have every `AWS_*` setting from the CLI's environment; no command line holds a secret."""
    status, stdout, stderr, watch = watched_query(h2o_local, {**store_env(tmp_path), "IOX_RUNNER": "spark-submit",
                                                               "IOX_SPARK_MASTER": "local[1]"})
    assert status == 0, stderr[-3000:]
    assert [json.loads(line) for line in stdout.splitlines()] == COUNTED
    wanted = store_env(tmp_path)
    jvm = watch.named(b"org.apache.spark.deploy.SparkSubmit")
    python = [(c, e) for c, e in watch.seen.values() if b"python" in c.split(b"\0")[0]]
    assert jvm, [c[:200] for c, _ in watch.seen.values()]
    assert python, [c[:200] for c, _ in watch.seen.values()]
    assert_store_settings_inherited(jvm + python, wanted)


@pytest.mark.parametrize("runner", [runner_param("connect")])
def test_the_connect_server_has_the_store_settings_in_its_environment_and_records_no_secret(
        runner: str, connect_server: Server, connect: dict[str, str], h2o_local: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's private Connect server (started as `iox-batch spark start` starts one, from an environment with
    the suite's `AWS_*` settings): its supervisor, server process, JVM and Python workers have them in their
    environment, none on a command line; what `spark start` records of it (its state file) and its log hold no
    secret."""
    from dataclasses import asdict

    from iox_planner.spark import server as sparkserver

    connect_server.up()
    done = run_cli("query", "--db", h2o_local, "--format", "jsonl", "SELECT count(*) AS n FROM h2o", env=connect)
    assert done.returncode == 0 and json.loads(done.stdout) == {"n": 8}, done.stderr
    watch = ProcessWatch()
    watch._root, watch._group = connect_server.server.pid, True
    watch.scan()
    wanted = {k: os.environ[k] for k in CREDENTIALS} | {"AWS_ENDPOINT_URL": os.environ["AWS_ENDPOINT_URL"]}
    jvm = watch.named(b"org.apache.spark.deploy.SparkSubmit", b"java")
    assert jvm, [c[:200] for c, _ in watch.seen.values()]
    assert_store_settings_inherited(list(watch.seen.values()), wanted)
    monkeypatch.setattr(sparkserver, "state_dir", lambda: tmp_path)
    sparkserver._record(connect_server.server)
    state = (tmp_path / "spark-connect.json").read_text()
    assert json.loads(state) == json.loads(json.dumps(asdict(connect_server.server)))
    assert_no_secret(state, connect_server.log.read_text(errors="replace"), done.stdout, done.stderr)


@pytest.fixture
def h2o_s3(s3_warehouse: str, catalog: Catalog, db: str) -> str:
    from iox_planner.ingest.scenario import load_scenario, read_scenario

    load_scenario(catalog, read_scenario(ROOT / "examples" / "h2o.yaml"), db)
    return db


@pytest.mark.parametrize("runner", ["in-process", "spark-submit"])
def test_a_query_over_an_s3_warehouse_on_each_runner_shows_no_secret_and_passes_none_in_argv(
        runner: str, h2o_s3: str, tmp_path: Path) -> None:
    """Needs the query executor's object-store read path (issue 32 item 4): the same rows as the local example;
    spark-submit's processes read the store with the settings of their environment."""
    status, stdout, stderr, watch = watched_query(h2o_s3, {**store_env(tmp_path), "IOX_RUNNER": runner,
                                                           "IOX_SPARK_MASTER": "local[1]", "IOX_DEBUG": "1"})
    assert status == 0, stderr[-3000:]
    assert [json.loads(line) for line in stdout.splitlines()] == COUNTED
    if runner == "spark-submit":
        assert_store_settings_inherited(watch.named(b"org.apache.spark.deploy.SparkSubmit"), store_env(tmp_path))


def test_an_output_uri_carrying_credentials_is_refused_without_repeating_them(s3_db: str, tmp_path: Path) -> None:
    """`--output` is a location too (needs outputs on the store, issue 32 item 5, to word its refusal)."""
    for target in (f"s3://key:{SECRET}@{BUCKET}/out.jsonl", f"s3://{BUCKET}/out.jsonl?X-Amz-Security-Token="
                   f"{SESSION_TOKEN}"):
        done = run_cli("query", "--db", s3_db, "--format", "jsonl", "--output", target, "SELECT * FROM cpu",
                       env=store_env(tmp_path))
        assert done.returncode == 2, (target, done.stdout, done.stderr)
        assert_one_paragraph_error(done)
        assert_no_secret(done.stdout, done.stderr)


@pytest.mark.parametrize("runner", [runner_param("connect")])
def test_a_query_and_a_compaction_over_an_s3_warehouse_run_on_the_connect_server(
        runner: str, connect_server: Server, connect: dict[str, str], h2o_s3: str) -> None:
    """The third runner: no JVM in the client (connect_support's env has no Java), so the server's Python
    workers read the store with the settings of the server's own environment; the answer is the local example's,
    and neither output holds a secret. A compaction's slices run there too, reading and putting on the store."""
    done = run_cli("query", "--db", h2o_s3, "--format", "jsonl", COUNT_BY_STATE, env=connect)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [json.loads(line) for line in done.stdout.splitlines()] == COUNTED
    compacted = run_cli("compact", "--db", h2o_s3, env=connect)
    assert compacted.returncode == 0, compacted.stderr[-3000:]
    again = run_cli("query", "--db", h2o_s3, "--format", "jsonl", COUNT_BY_STATE, env=connect)
    assert again.returncode == 0 and [json.loads(line) for line in again.stdout.splitlines()] == COUNTED, \
        again.stderr[-3000:]
    assert_no_secret(done.stdout, done.stderr, compacted.stdout, compacted.stderr, again.stdout, again.stderr)
