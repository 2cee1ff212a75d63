"""The Connect server's supervisor: the process `iox-batch spark start` records (`iox_planner/spark/server.py`), which
runs the serving process (`connect_server.py`) and starts it again, on the same address, ports and tokens, when it
ends or stops answering. One query can end the server's JVM (memory its data computes, a fatal error); the service
must not end with it, nor wait for someone to notice.

- The serving process ends with its JVM (`connect_server.py` watches it), so a JVM that died (out of memory:
  `-XX:+ExitOnOutOfMemoryError`; killed) is a child that exited, seen at once.
- A JVM alive but wedged (its Connect port refusing connections, or the gate's parse of `SELECT 1` unanswered) for
  `WEDGED_AFTER_S` in a row is ended and started again.
- A restart kills what is left of the serving process's tree (every process of this process group but this one:
  the JVM, its Python workers), then starts it again after a backoff (`BACKOFF_S`, doubling while starts fail).
- A start that ends or does not answer within `START_TIMEOUT_S` fails; after a failed first start (a setting or
  the machine: `iox-batch spark start` says why at once) or `MAX_FAILED_STARTS` failed restarts in a row, the
  supervisor gives up and ends: a JVM that cannot start does not loop. Its report then says why (`iox-batch spark
  status`: failed). A server that starts well is always started again, however often a query ends it (a count of
  crashes would let one user's repeated query leave the service stopped for everyone); a crash soon after a start
  (within `STABLE_S`) doubles the backoff instead.

What it is doing goes to its report file (`server.py` `Report`: state, restarts, reason), beside the log.
`iox-batch spark stop` signals the whole process group: the serving process stops, and the supervisor with it
rather than starting it again. The serving process's argv comes after `--`; the supervisor reads its address,
ports and the gate's token from it and its environment, and passes the environment on unchanged (the tokens
travel there, never on a command line).
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from iox_planner import config
from iox_planner.spark.conf import OOM_EXIT_STATUSES
from iox_planner.spark.server import GATE_PATH, PROBE_TEXT, START_TIMEOUT_S, Report, write_report

EVERY_S = 1.0
"""How often the serving process is looked at."""
WEDGED_AFTER_S = 30.0
"""How long the server may fail every probe before it is restarted: longer than any pause a loaded JVM takes
(a full garbage collection), short enough that clients wait seconds, not minutes."""
PROBE_TIMEOUT_S = 10.0
BACKOFF_S = 1.0
"""The wait before a restart, doubled after each failed start (at most `MAX_BACKOFF_S`)."""
MAX_BACKOFF_S = 30.0
MAX_FAILED_STARTS = 3
STABLE_S = 60.0
"""A server up this long before it ended restarts after the first backoff again; one that ended sooner doubles it."""


def why_it_ended(status: int) -> str:
    """The report's reason for a serving process that exited with `status` (its JVM's status, `connect_server.py`)."""
    if status in OOM_EXIT_STATUSES:
        return f"its JVM ran out of memory (exit status {status})"
    if status < 0 or status > 128:
        number = -status if status < 0 else status - 128
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"its JVM or the serving process was killed ({name})"
    return f"the serving process ended (exit status {status})"


class Supervisor:
    def __init__(self, command: Sequence[str], report_file: Path) -> None:
        self.command = list(command)
        self.report_file = report_file
        where = argparse.ArgumentParser(add_help=False)
        where.add_argument("--host", default="127.0.0.1")
        where.add_argument("--port", type=int, required=True)
        where.add_argument("--gate-port", type=int, required=True)
        known, _ = where.parse_known_args(self.command)
        self.host = "127.0.0.1" if known.host in ("0.0.0.0", "::") else known.host
        self.port, self.gate_port = int(known.port), int(known.gate_port)
        self.token = config.SPARK_GATE_TOKEN.read() or ""
        self.stopping = threading.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.report = Report(os.getpid(), "starting", 0, "", time.time())

    def tell(self, state: str, reason: str, restarted: bool = False) -> None:
        self.report = Report(os.getpid(), state, self.report.restarts + restarted, reason, time.time())
        write_report(self.report_file, self.report)
        print(f"iox-batch Spark Connect supervisor: {state}" + (f" ({self.report.reason})" if reason else ""),
              file=sys.stderr, flush=True)

    def run(self) -> int:
        failed_starts = 0
        ever_up = False
        backoff = BACKOFF_S
        self.tell("starting", "")
        while not self.stopping.is_set():
            self.child = subprocess.Popen(self.command, stdin=subprocess.DEVNULL)
            up = self._wait_up()
            if self.stopping.is_set():
                break
            if up:
                ever_up, failed_starts = True, 0
                self.tell("running", self.report.reason)
                since = time.monotonic()
                reason = self._watch()
                if self.stopping.is_set():
                    break
                # A crash soon after a start backs off further; one after a while up starts from the first wait.
                backoff = min(backoff * 2, MAX_BACKOFF_S) if time.monotonic() - since < STABLE_S else BACKOFF_S
            else:
                failed_starts += 1
                status = self.child.poll()
                reason = (f"a start failed: {why_it_ended(status)}" if status is not None else
                          f"a start did not answer within {START_TIMEOUT_S} s")
                backoff = min(backoff * 2, MAX_BACKOFF_S) if failed_starts > 1 else backoff
            self._end_tree()
            if not ever_up or failed_starts >= MAX_FAILED_STARTS:
                # A first start that fails is a setting or a machine problem: said at once, not retried.
                many = "its first start failed" if not ever_up else f"{failed_starts} starts in a row failed"
                self.tell("failed", f"{many}, so it is not started again; last: {reason}; see its log, then "
                                    "iox-batch spark start")
                return 1
            self.tell("restarting", reason, restarted=True)
            if self.stopping.wait(backoff):
                break
        self._end_tree(graceful=True)
        self.tell("stopped", "")
        return 0

    def _wait_up(self) -> bool:
        """Whether the serving process answers (both ports) before it ends, is stopped or `START_TIMEOUT_S` pass."""
        assert self.child is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.child.poll() is not None or self.stopping.is_set():
                return False
            if self._connects(self.port) and self._connects(self.gate_port):
                return True
            self.stopping.wait(0.25)
        return False

    def _watch(self) -> str:
        """Until the serving process ends or is wedged (or a stop): why it must be started again."""
        assert self.child is not None
        failing_since: float | None = None
        last_probe = 0.0
        while not self.stopping.wait(EVERY_S):
            status = self.child.poll()
            if status is not None:
                return why_it_ended(status)
            if time.monotonic() - last_probe < min(5.0, WEDGED_AFTER_S / 3):
                continue
            last_probe = time.monotonic()
            if self._connects(self.port) and self._parses():
                failing_since = None
            elif failing_since is None:
                failing_since = time.monotonic()
            elif time.monotonic() - failing_since > WEDGED_AFTER_S:
                return f"it stopped answering for {WEDGED_AFTER_S:.0f} s (its JVM wedged)"
        return ""

    def _connects(self, port: int) -> bool:
        try:
            with socket.create_connection((self.host, port), timeout=PROBE_TIMEOUT_S):
                return True
        except OSError:
            return False

    def _parses(self) -> bool:
        """The gate answers a parse of `SELECT 1` with its plan: the JVM's parser answered. A parse that times out
        (answered as a refusal) or a gate kept busy by parses that do not end is a JVM that does not answer (a
        connection to its Connect port alone proves nothing: the kernel accepts it for a stopped process)."""
        conn = http.client.HTTPConnection(self.host, self.gate_port, timeout=PROBE_TIMEOUT_S)
        try:
            conn.request("POST", GATE_PATH, body=PROBE_TEXT.encode(), headers={"Authorization": f"Bearer {self.token}"})
            response = conn.getresponse()
            return response.status == 200 and b'"plan"' in response.read(1_000_000)
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def _end_tree(self, graceful: bool = False) -> None:
        """End the serving process and everything it started (this process group, this process excepted)."""
        if graceful and self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)
            try:
                self.child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        me, group = os.getpid(), os.getpgid(0)
        if group != me and self.child is not None:  # not a group of its own (run by hand): the child only
            self.child.kill()
        for entry in Path("/proc").iterdir() if group == me else ():
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == group:  # field 5 of stat: the process group
                try:
                    os.kill(int(entry.name), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.child is not None:
            try:
                self.child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", required=True, help="the report file (JSON) `iox-batch spark status` reads")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the serving process's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    supervisor = Supervisor(command, Path(args.report))

    def on_term(*_: object) -> None:
        # `iox-batch spark stop` signals the whole group: the serving process has the same signal and stops.
        supervisor.stopping.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
