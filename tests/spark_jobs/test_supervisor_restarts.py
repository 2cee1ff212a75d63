"""The Connect server's supervisor (`spark_jobs/connect_supervisor.py`) without a JVM: a serving process that starts
well is started again however often it ends (a user's query that ends the JVM again and again must not leave the
service stopped for everyone), while one that cannot start is given up on. The serving process is a stand-in
that opens the two ports, then exits as a crashed server would."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from spark_jobs import connect_supervisor
from spark_jobs.connect_supervisor import Supervisor

CRASHES = connect_supervisor.MAX_FAILED_STARTS + 12
"""More crashes than any count the supervisor might keep (the old one gave up after 10 in 10 minutes)."""

STAND_IN = """
import socket, sys, time
args = sys.argv[1:]
ports = [int(args[args.index(flag) + 1]) for flag in ("--port", "--gate-port")]
socks = [socket.create_server(("127.0.0.1", p)) for p in ports]
time.sleep(float(args[args.index("--up") + 1]))
sys.exit(3)
"""


def free_ports() -> tuple[int, int]:
    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    ports = tuple(s.getsockname()[1] for s in socks)
    for s in socks:
        s.close()
    return ports  # type: ignore[return-value]


def supervise(tmp_path: Path, up_s: float) -> Supervisor:
    port, gate = free_ports()
    command = [sys.executable, "-c", STAND_IN, "--host", "127.0.0.1", "--port", str(port), "--gate-port", str(gate),
               "--up", str(up_s)]
    return Supervisor(command, tmp_path / "report.json")


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connect_supervisor, "BACKOFF_S", 0.01)
    monkeypatch.setattr(connect_supervisor, "MAX_BACKOFF_S", 0.02)
    monkeypatch.setattr(connect_supervisor, "START_TIMEOUT_S", 20)


def test_a_server_that_starts_well_is_started_again_however_often_it_ends(tmp_path: Path) -> None:
    supervisor = supervise(tmp_path, up_s=1.0)
    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(supervisor.run()), daemon=True)
    runner.start()
    deadline = time.monotonic() + 120
    while supervisor.report.restarts < CRASHES and runner.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    supervisor.stopping.set()
    runner.join(30)
    assert supervisor.report.restarts >= CRASHES, (supervisor.report, result)
    assert result == [0] and supervisor.report.state == "stopped", supervisor.report


def test_a_server_that_cannot_start_is_given_up_on(tmp_path: Path) -> None:
    supervisor = supervise(tmp_path, up_s=0)
    supervisor.command[supervisor.command.index("-c") + 1] = "import sys; sys.exit(3)"
    assert supervisor.run() == 1
    assert supervisor.report.state == "failed" and "first start failed" in supervisor.report.reason
