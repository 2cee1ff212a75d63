"""The project's Spark Connect server, one Python process (`python -m spark_jobs.connect_server`, started by
`iox-batch spark start`: `iox_planner/spark/server.py`): a SparkSession whose JVM runs Spark's Connect plugin (the
server the `connect` runner's sessions use), and beside it the last gate's parse endpoint and the watch that
cancels a job still running after its query ended (`orphans.py`: an interrupted operation can leave one behind).

Spark Connect has no parse-only call: EXPLAIN analyzes, and analysis runs EXECUTE IMMEDIATE's statement (`EXPLAIN
EXTENDED EXECUTE IMMEDIATE 'CREATE TABLE ...'` creates the table). The endpoint gives the client what the
in-process gate reads: the JSON of the plan this JVM's own SQL parser builds for the exact text
(`gate.parsed_plan_json`), nothing analyzed or run, nothing else offered. HTTP on the server's address: POST
`/parse` with `Authorization: Bearer <token>` (the token comes in the environment, never on the command line), one
UTF-8 text of at most `GATE_MAX_BYTES`; the answer is JSON, `{"plan": ...}` or `{"error": ..., "message": ...}`.

The same token is Spark Connect's own (`spark.connect.authenticate.token`): its gRPC service refuses every call
without it as a bearer token, before any plan runs. A client elsewhere reaches both ports through a TLS-terminating
proxy (README: Spark Connect beyond one machine).
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Sequence

from iox_planner import config
from iox_planner.errors import BadQueryError, IoxError
from iox_planner.spark.conf import CONNECT_SERVER_CONF
from iox_planner.spark.server import CONNECT_TOKEN_ENV, GATE_MAX_BYTES, GATE_PATH, PROBE_TEXT, check_token, parse_conf

CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"
_BUSY = 2
"""Parses at once; more are refused (503) rather than queued without bound. A parse is milliseconds; two at once
keep a core for the queries whatever texts arrive."""
PARSE_TIMEOUT_S = 10.0
"""How long a parse may take before the gate answers that the text is refused: texts within the planner's limits
(`prescan`) parse in milliseconds. The parse itself cannot be stopped: it keeps its slot of `_BUSY` until it ends."""
_READ_TIMEOUT_S = 10
"""A client that does not send its whole request within this is dropped."""


def server_conf(host: str, port: int, conf: dict[str, str]) -> dict[str, str]:
    """The server's own defaults (`spark/conf.py` `CONNECT_SERVER_CONF`: what one query may take, how soon a gone
    client's work stops), the user's `--conf`, then what the server must have whatever it says: Connect in the
    driver, and where it listens (the session's own settings, `session_conf`, are added by `build_session`)."""
    return {**CONNECT_SERVER_CONF, **conf, "spark.plugins": CONNECT_PLUGIN, "spark.connect.grpc.binding.address": host,
            "spark.connect.grpc.binding.port": str(port)}


def gate_handler(spark: Any, token: str) -> type[BaseHTTPRequestHandler]:
    from iox_planner.planner.limits import SqlLimits
    from iox_planner.planner.sql.parse import prescan
    from spark_jobs.gate import parsed_plan_json

    expected = f"Bearer {token}".encode()
    busy = threading.BoundedSemaphore(_BUSY)
    # The supervisor's probe has a slot of its own: parses that each end within the timeout, sent back to back,
    # keep `busy` full for good, and a probe answered 503 meanwhile would have the JVM restarted under every query.
    probing = threading.BoundedSemaphore(1)
    limits = SqlLimits.from_env()

    def parse(text: str, answer: dict[str, Any], done: threading.Event, slot: threading.BoundedSemaphore) -> None:
        try:
            prescan(text, limits)  # the planner's limits, before Spark's parser sees the text
            answer["plan"] = parsed_plan_json(spark, text)
        except Exception as err:  # noqa: BLE001 - handed to the request's thread
            answer["error"] = err
        finally:
            slot.release()  # only once the parse has really ended: a runaway parse keeps its slot
            done.set()

    class Gate(BaseHTTPRequestHandler):
        timeout = _READ_TIMEOUT_S
        server_version = "iox-gate"
        sys_version = ""

        def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
            if self.path != GATE_PATH:
                return self._answer(404, {"error": "not_found", "message": f"only POST {GATE_PATH}"})
            if not hmac.compare_digest(self.headers.get("Authorization", "").encode(), expected):
                return self._answer(401, {"error": "unauthorized", "message": "the gate token was not accepted"})
            length = self.headers.get("Content-Length", "")
            if not length.isdigit() or int(length) > GATE_MAX_BYTES:
                return self._answer(413, {"error": "too_large",
                                          "message": f"one text of at most {GATE_MAX_BYTES} bytes, with its length"})
            try:
                text = self.rfile.read(int(length)).decode("utf-8")
            except (OSError, UnicodeDecodeError):
                return self._answer(400, {"error": "bad_text", "message": "the text is not whole UTF-8"})
            slot = probing if text == PROBE_TEXT else busy
            if not slot.acquire(blocking=False):
                return self._answer(503, {"error": "busy", "message": f"more than {_BUSY} parses at once"})
            answer: dict[str, Any] = {}
            done = threading.Event()
            threading.Thread(target=parse, args=(text, answer, done, slot), name="iox-gate-parse",
                             daemon=True).start()
            if not done.wait(PARSE_TIMEOUT_S):
                return self._answer(200, {"error": "parse", "message": (
                    f"Spark's parser did not finish reading the query within {PARSE_TIMEOUT_S:.0f} s, so it is "
                    "refused; simplify it (fewer values, less nesting)")})
            error = answer.get("error")
            if error is None:
                return self._answer(200, {"plan": answer["plan"]})
            if isinstance(error, BadQueryError):
                return self._answer(200, {"error": "parse", "message": str(error)})
            # The client refuses the query on any other answer.
            return self._answer(500, {"error": "internal", "message": type(error).__name__})

        def do_GET(self) -> None:  # noqa: N802
            self._answer(405, {"error": "method", "message": f"only POST {GATE_PATH}"})

        do_PUT = do_DELETE = do_PATCH = do_HEAD = do_GET  # noqa: N815

        def _answer(self, status: int, body: dict[str, str]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            pass  # a line per query is noise in the server's log; the texts are the users' own

    return Gate


def _end_with(jvm: Any, stopping: threading.Event) -> None:
    """End this process, with the JVM's exit status, as soon as the JVM it started ends (out of memory, a fatal
    error, killed) unless it is stopping: a server whose JVM is gone must not live on (its gate up, its Connect port
    gone, the JVM a zombie), so its supervisor (`connect_supervisor.py`) sees it end and starts it again."""

    def wait() -> None:
        status = jvm.wait()
        if not stopping.is_set():
            print(f"the Spark Connect server's JVM ended (exit status {status}); the server ends with it",
                  file=sys.stderr, flush=True)
            os._exit(status if 0 < status < 256 else 128 - status if status < 0 else 1)

    threading.Thread(target=wait, name="iox-jvm-watch", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--gate-port", type=int, required=True)
    parser.add_argument("--conf", action="append", default=[])
    args = parser.parse_args(argv)
    try:
        # No server runs without its token, on any address: Spark Connect's and the gate's (one secret, as one
        # client holds both).
        token = check_token(config.SPARK_GATE_TOKEN.read() or "")
        os.environ.pop(config.SPARK_GATE_TOKEN.name, None)
        conf = server_conf(args.host, args.port, parse_conf(args.conf))
        # Spark Connect's server reads its token from the JVM's environment when its setting is unset
        # (`Connect.getAuthenticateToken`): the JVM, started next, inherits this process's. A `--conf` would put it
        # on the JVM's command line, which every user of the machine can read (/proc/PID/cmdline).
        os.environ[CONNECT_TOKEN_ENV] = token
    except IoxError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    from spark_jobs import orphans
    from spark_jobs.session import build_session

    spark = build_session(app="iox-batch Spark Connect", conf=conf)
    stopping = threading.Event()
    gateway = spark.sparkContext._gateway
    assert gateway is not None  # this process started the JVM
    _end_with(gateway.proc, stopping)
    orphans.watch(spark, stopping, connect=True)
    gate = ThreadingHTTPServer((args.host, args.gate_port), gate_handler(spark, token))
    gate.daemon_threads = True

    def on_term(*_: Any) -> None:
        # SIGTERM (iox-batch spark stop, to the whole group) ends the gate, then the session, then the process;
        # the JVM has it too, so the watch stops looking at once.
        stopping.set()
        threading.Thread(target=gate.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    print(f"iox-batch Spark Connect server: Connect on {args.host}:{args.port}, gate on {args.host}:"
          f"{args.gate_port}", file=sys.stderr, flush=True)
    try:
        gate.serve_forever()
    finally:
        gate.server_close()
        stopping.set()
        try:
            spark.stop()
        except Exception:  # noqa: BLE001 - the JVM had the same signal and may be gone already
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
