"""A private Spark Connect server for the tests that run on the `connect` runner (tests/spark_jobs/test_connect.py,
tests/airflow/test_airflow_connect.py): started once per test session that asks for it (about 20 s; the
`connect_server` fixture of tests/conftest.py), again when a test has killed it, never the project's own
(`iox-batch spark start`), which a developer may be using."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any, Iterator

import pytest

# tests/spark_jobs/test_query_budget.py's slow but cheap query: minutes uncancelled, a few MB, cancellable at every
# row (a backtracking regular expression would keep the server's cores after its cancellation).
SLOW = ("SELECT max(i + j) AS m FROM (SELECT i FROM h2o LATERAL VIEW explode(sequence(1, 100000)) s AS i "
        "DISTRIBUTE BY i) LATERAL VIEW explode(sequence(1, 100000)) t AS j")


class Server:
    """The tests' private Connect server, started again when a test has killed it."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.server: Any = None
        self.proc: Any = None

    def up(self) -> str:
        from iox_planner.spark import server as sparkserver

        if self.proc is None or self.proc.poll() is not None:
            self.server, self.proc = sparkserver.launch(self.log, conf={"spark.driver.memory": "1g"})
            sparkserver.wait_until_up(self.server, self.proc)
        return str(self.server.url())

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        from iox_planner.spark import server as sparkserver

        if self.proc is not None and self.proc.poll() is None:
            sparkserver.stop_server(self.server)
            self.proc.wait()


def private_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The body of a session fixture: the server, up, stopped at the end. Skipped only where Spark cannot run at
    all (no Java); a server that fails to start otherwise is a failure."""
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
