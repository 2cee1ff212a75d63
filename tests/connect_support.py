"""The two runners tests run queries on: the in-process session (`spark_support.py`) and a private Spark Connect
server (IOX_RUNNER=connect), with the cases each runs on Connect.

One private server per pytest process (the `connect_server` fixture of conftest.py, shared with the DAGs' tests over
Connect, tests/airflow/test_airflow_connect.py; a JVM of about 1 GB that
takes 10 to 20 s to start), never the project's own (`iox-batch spark start`), which a developer may be using.
Under xdist (`make test`), every test that reaches it goes to one worker (`OneConnectWorker`), so one server
starts in all.

A Connect client switches its whole Python process to Connect mode, so the pytest process never opens one: a
query runs in a child, either the CLI or the long-lived `ConnectClient` below, which runs plans the test process
made through the connect launcher as `iox-batch query` does, one session for all of them.

Which cases run on Connect: every case of a module on the in-process runner; on Connect a sample drawn from
`IOX_CONNECT_SEED` (default 0), or all of them with `IOX_CONNECT_RUN=all`.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import pytest

from iox_planner.catalog.store import Catalog

RUN_ALL = os.environ.get("IOX_CONNECT_RUN", "") == "all"
SAMPLE_SEED = int(os.environ.get("IOX_CONNECT_SEED", "0"))
CONNECT_MODULES = ("tests/spark_jobs/test_connect.py::", "tests/spark_jobs/test_connect_auth.py::")
_CONNECT_ID = re.compile(r"\[(?:.*-)?connect(?:-.*)?\]$")

# tests/spark_jobs/test_query_budget.py's slow but cheap query: minutes uncancelled, a few MB, cancellable at every
# row (a backtracking regular expression would keep the server's cores after its cancellation).
SLOW = ("SELECT max(i + j) AS m FROM (SELECT i FROM h2o LATERAL VIEW explode(sequence(1, 100000)) s AS i "
        "DISTRIBUTE BY i) LATERAL VIEW explode(sequence(1, 100000)) t AS j")


def runner_param(name: str, seed: int | None = None) -> Any:
    """A `runner` parameter (with a `seed` after it when given), its id the runner's name (`on_connect` reads it)."""
    values, ident = (name,) if seed is None else (name, seed), name if seed is None else f"{name}-seed={seed}"
    return pytest.param(*values, id=ident)


def kills_the_server(test: Any) -> Any:
    """Marks a test that kills the shared server: conftest.py runs it after every other test, so none of them
    waits for another server to start (10 to 20 s, and its first queries warm it up again)."""
    test.kills_the_server = True
    return test


def on_connect(nodeid: str) -> bool:
    """Whether a test reaches the Connect server, from its node id (all xdist's scheduler sees): those of
    test_connect.py and test_connect_auth.py, and each case whose `runner_param` is connect."""
    return nodeid.startswith(CONNECT_MODULES) or _CONNECT_ID.search(nodeid) is not None


def one_connect_worker(config: pytest.Config, log: Any) -> Any:
    """xdist's scheduler for `make test`: tests dealt one by one as workers free up (as xdist's `load` deals
    them), except those on the Connect server, which go together to one worker, first (the largest unit), so one
    server starts in all rather than one a worker. (xdist's own `loadgroup` marks tests by rewriting their node
    ids, which pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class OneConnectWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "connect" if on_connect(nodeid) else nodeid

    return OneConnectWorker(config, log)


def sample(names: Sequence[Any], k: int) -> list[Any]:
    """The cases that run on Connect: all with IOX_CONNECT_RUN=all, else `k` drawn from IOX_CONNECT_SEED (the same
    on every xdist worker, whose collections must agree)."""
    if RUN_ALL:
        return list(names)
    return sorted(random.Random(SAMPLE_SEED).sample(list(names), min(k, len(names))), key=list(names).index)


def both_runners(metafunc: pytest.Metafunc, k: int) -> None:
    """For a module's `pytest_generate_tests`: each test taking `runner` runs on the in-process runner, and `k`
    of them (a sample, see `sample`) on Connect too."""
    if "runner" not in metafunc.fixturenames:
        return
    tests = sorted(name for name, f in vars(metafunc.module).items() if name.startswith("test_")
                   and inspect.isfunction(f) and "runner" in inspect.signature(f).parameters)
    chosen = metafunc.function.__name__ in sample(tests, k)
    metafunc.parametrize("runner", [runner_param(r) for r in ("in-process", "connect")[:2 if chosen else 1]],
                         indirect=True)


class Server:
    """The tests' private Connect server (its supervisor's process group), started again when a test has killed it,
    waited for while its supervisor restarts it."""

    def __init__(self, log: Path, memory: str = "1g") -> None:
        self.log = log
        self.memory = memory
        self.server: Any = None
        self.proc: Any = None

    def up(self) -> str:
        from iox_planner.spark import server as sparkserver

        if self.proc is None or self.proc.poll() is not None:
            self.server, self.proc = sparkserver.launch(self.log, conf={"spark.driver.memory": self.memory})
        sparkserver.wait_until_up(self.server, self.proc)
        return str(self.server.url())

    def kill(self) -> None:
        """The whole server, supervisor included, at once: nothing is left to start it again."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def jvms(self) -> list[int]:
        """The pids of the server's JVM (the serving process's child; one, unless a restart is under way)."""
        return [pid for pid, comm, _ in _group(self.proc.pid) if comm == "java"]

    def jvm_cpu_s(self) -> float:
        """CPU seconds the server's JVM has used so far (what a query still running on it shows)."""
        return sum(cpu for _, comm, cpu in _group(self.proc.pid) if comm == "java")

    def idle_within(self, seconds: float, window_s: float = 2.0, busy_cores: float = 0.3) -> float | None:
        """The seconds it took the server's JVM to go idle (under `busy_cores` over `window_s`), None if it stayed
        busy `seconds` long: a query whose command ended must stop using the server."""
        import time

        started = time.monotonic()
        while time.monotonic() - started < seconds:
            before = self.jvm_cpu_s()
            time.sleep(window_s)
            if self.jvm_cpu_s() - before < busy_cores * window_s:
                return time.monotonic() - started - window_s
        return None

    def wait_busy(self, seconds: float, window_s: float = 1.0, busy_cores: float = 0.4) -> bool:
        """Whether the server's JVM got busy (a query running on it) within `seconds`."""
        import time

        started = time.monotonic()
        while time.monotonic() - started < seconds:
            before = self.jvm_cpu_s()
            time.sleep(window_s)
            if self.jvm_cpu_s() - before >= busy_cores * window_s:
                return True
        return False

    def stop(self) -> None:
        from iox_planner.spark import server as sparkserver

        if self.proc is not None and self.proc.poll() is None:
            sparkserver.stop_server(self.server)
            self.proc.wait()

    def env(self) -> dict[str, str]:
        """The environment of an `iox-batch` run on the connect runner: this server as a remote one, its gate's
        port and token given as a deployment gives them. No JVM can start in the client (a Java that is not
        there): whatever Spark work a command does runs on the server, or the command fails."""
        url = self.up()
        return {"IOX_RUNNER": "connect", "JAVA_HOME": "/nonexistent/java", "IOX_SPARK_REMOTE": url,
                "IOX_SPARK_GATE_PORT": str(self.server.gate_port), "IOX_SPARK_GATE_TOKEN": self.server.token}


def _group(pgid: int) -> list[tuple[int, str, float]]:
    """The processes of process group `pgid`: pid, command name, CPU seconds used."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            out.append((int(entry.name), comm, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")))
    return out


def private_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The body of the `connect_server` session fixture: the server, up, stopped at the end. Skipped only where
    Spark cannot run at all (no Java); a server that fails to start otherwise is a failure."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java here: Spark cannot run")
    server = Server(tmp_path_factory.mktemp("connect") / "spark-connect.log")
    try:
        server.up()
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()


class ConnectClient:
    """A child process holding one Connect session, running plan files through the connect launcher (the
    `fetch` of `iox-batch query`) and answering with the result as `--format jsonl` prints it. Started on first
    use, and again for another server (a test killed the last one)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen[str] | None = None
        self.env: dict[str, str] = {}

    def run(self, env: dict[str, str], plan_file: Path, strategy: str | None, timeout_s: int,
            conf: Mapping[str, str]) -> str:
        if self.proc is None or self.proc.poll() is not None or env != self.env:
            self.close()
            with open(self.log, "a") as sink:
                self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=sink, text=True,
                                             env={**os.environ, **env})
            self.env = env
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"plan": str(plan_file), "strategy": strategy, "timeout": timeout_s,
                                          "conf": dict(conf)}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the Connect client ended ({self.proc.wait()}); see {self.log}")
        answer = json.loads(line)
        if answer["error"] is not None:
            raise _error_class(answer["error"])(answer["message"])
        return str(answer["jsonl"])

    def close(self) -> None:
        if self.proc is not None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
            self.proc = None


def _error_class(name: str) -> type[Exception]:
    """The iox-batch error class a failed run raised in the client (by name, from the error tree only)."""
    from iox_planner import errors

    found = getattr(errors, name, None)
    return found if isinstance(found, type) and issubclass(found, errors.IoxError) else AssertionError


class Leg:
    """One runner as a test uses it: queries (`jsonl`) and `iox-batch` commands (`cli`)."""

    name = "in-process"

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def cli(self, *args: str) -> Any:
        """`iox-batch` run in this process on the shared session (a whole process would start a JVM of its own):
        its exit status, standard output and error."""
        from spark_support import cli

        return cli(*args)

    def jsonl(self, catalog: Catalog, db: str, sql: str, *, optimize: bool = True, strategy: str | None = None,
              conf: Mapping[str, str] | None = None, **kw: Any) -> list[dict[str, Any]]:
        """The rows a user gets from `iox-batch query --format jsonl`, parsed; `conf` (SQL settings) holds for
        this query alone."""
        from spark_support import run_jsonl

        saved = {key: self.spark.conf.get(key) for key in conf or {}}
        for key, value in (conf or {}).items():
            self.spark.conf.set(key, value)
        try:
            return run_jsonl(self.spark, catalog, db, sql, optimize=optimize, strategy=strategy, **kw)
        finally:
            for key, value in saved.items():
                self.spark.conf.set(key, value)


class ConnectLeg(Leg):
    name = "connect"

    def __init__(self, server: Server, client: ConnectClient) -> None:
        self.env = server.env()
        self.client = client

    def cli(self, *args: str) -> Any:
        """`iox-batch` as a whole process on the connect runner."""
        from common_support import run_cli

        return run_cli(*args, env=self.env)

    def jsonl(self, catalog: Catalog, db: str, sql: str, *, optimize: bool = True, strategy: str | None = None,
              conf: Mapping[str, str] | None = None, **kw: Any) -> list[dict[str, Any]]:
        from spark_support import write_plan

        from iox_planner.spark.budget import query_timeout_s

        with tempfile.TemporaryDirectory(prefix="iox-test-") as tmp:
            plan_file = write_plan(Path(tmp), catalog, db, sql, optimize=optimize, **kw)
            text = self.client.run(self.env, plan_file, strategy, query_timeout_s(), conf or {})
        return [json.loads(line) for line in text.splitlines()]


def serve() -> None:
    """The client's side: one request (JSON) a line on standard input, one answer a line on the standard output
    it started with (anything else written there goes to standard error)."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    from iox_planner.cli.runner import print_result
    from iox_planner.errors import IoxError
    from iox_planner.output import OutputFormat
    from iox_planner.spark.jobs import PlanJob
    from spark_jobs.connect import shared_remote
    from spark_jobs.launch import ConnectLauncher

    for line in sys.stdin:
        ask = json.loads(line)
        answer: dict[str, Any] = {"error": None}
        saved: dict[str, str] = {}
        try:
            spark = shared_remote()
            for key, value in ask["conf"].items():
                saved[key] = spark.conf.get(key)
                spark.conf.set(key, value)
            plan_file = Path(ask["plan"])
            table = ConnectLauncher().fetch(PlanJob(plan_file, plan_file.with_name("result.arrow"),
                                                    OutputFormat.ARROW, ask["timeout"], strategy=ask["strategy"]))
            out = io.StringIO()
            print_result(table, OutputFormat.JSONL, out)
            answer["jsonl"] = out.getvalue()
        except IoxError as err:
            answer.update(error=type(err).__name__, message=str(err))
        finally:
            for key, value in saved.items():
                spark.conf.set(key, value)
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve()
