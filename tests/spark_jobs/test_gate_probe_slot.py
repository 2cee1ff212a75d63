"""The gate's parse slots: users' parses that keep every slot busy do not starve the supervisor's liveness probe.

Two parses of a large text sent back to back (each ending within the parse timeout) kept both slots full; the
probe, answered 503, read that as a wedged JVM and restarted it under every running query. The parse here is a
stand-in that blocks until released: what is tested is the slot accounting, not Spark's parser.
"""

from __future__ import annotations

import http.client
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any, Iterator

import pytest

import spark_jobs.gate
from iox_planner.spark.server import GATE_PATH, PROBE_TEXT
from spark_jobs.connect_server import _BUSY, gate_handler

TOKEN = "t" * 40


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, threading.Event]]:
    release = threading.Event()

    def parse(spark: Any, text: str) -> str:
        if text != PROBE_TEXT:
            release.wait(30)
        return "[]"

    monkeypatch.setattr(spark_jobs.gate, "parsed_plan_json", parse)
    server = ThreadingHTTPServer(("127.0.0.1", 0), gate_handler(None, TOKEN))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], release
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def _post(port: int, text: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", GATE_PATH, body=text.encode(), headers={"Authorization": f"Bearer {TOKEN}"})
        return conn.getresponse().status
    finally:
        conn.close()


def test_the_probe_is_answered_while_users_parses_fill_every_slot(gate: tuple[int, threading.Event]) -> None:
    port, release = gate
    users = [threading.Thread(target=_post, args=(port, f"SELECT {i} AS slow")) for i in range(_BUSY)]
    for user in users:
        user.start()
    time.sleep(1)  # the users' parses have their slots before anything else asks
    # every user slot taken: one more user's parse is refused as busy
    for _ in range(100):
        if _post(port, "SELECT 99 AS more") == 503:
            break
    else:
        pytest.fail("the users' parses never filled the gate's slots")
    assert _post(port, PROBE_TEXT) == 200
    release.set()
    for user in users:
        user.join(30)
