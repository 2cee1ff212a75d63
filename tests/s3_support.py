"""A real S3 API server on loopback for the object-store tests: moto's standalone server (`moto_server`, from
PyPI), started by the suite in its own process group, talked to over HTTP by pyarrow's S3 filesystem exactly as
AWS S3 would be. No mock replaces any code: the server is a separate process speaking the S3 protocol.

`S3Server` starts one, creates the test bucket (the tests' doing: iox-batch never creates a bucket), and counts
the requests it has answered from its request log. `CuttableProxy` stands between clients and the server for the
fault tests: `cut()` drops every connection and refuses new ones, as a store that went away does, without losing
the server's objects; `restore()` lets traffic through again.

Each pytest-xdist worker starts its own server (about 1 s); `s3_env` gives the `AWS_*` settings that point a
process at it (dummy credentials: moto accepts any).
"""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

BUCKET = "iox-test-lake"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "iox-test-key", "AWS_SECRET_ACCESS_KEY": "iox-test-secret-do-not-print",
               "AWS_REGION": "us-east-1"}
"""Dummy credentials: moto takes any. The secret is distinctive so a test can look for it in every output."""

_REQUEST = re.compile(r'"(GET|PUT|POST|HEAD|DELETE) (\S+) HTTP/1\.[01]" (\d{3})')
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
"""The server's log colours some status classes (a 206 Partial Content, say) with terminal escapes."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def moto_server_bin() -> str:
    here = Path(sys.executable).parent / "moto_server"
    found = str(here) if here.exists() else shutil.which("moto_server")
    if not found:
        raise RuntimeError("moto_server is not installed: run `make venv` (requirements.lock pins moto[server])")
    return found


class S3Server:
    """moto's S3 server on 127.0.0.1, its own process group, its log in a file the request counter reads."""

    def __init__(self) -> None:
        self.port = free_port()
        self.log = Path(tempfile.mkdtemp(prefix="iox-moto-")) / "requests.log"
        self._log_fh = open(self.log, "wb")
        self.process = subprocess.Popen(
            [moto_server_bin(), "-H", "127.0.0.1", "-p", str(self.port)], stdout=self._log_fh,
            stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "MOTO_PORT": str(self.port)})
        self._wait_ready()
        self.create_bucket(BUCKET)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The `AWS_*` settings that send a process's S3 requests here (or to `endpoint`: a proxy in front)."""
        return {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint or self.endpoint}

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto_server ended at start: {self.log.read_text(errors='replace')[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("moto_server did not answer within 60 s")

    def create_bucket(self, name: str) -> None:
        """The bucket the tests use: made by the test, as a user makes theirs (iox-batch never does)."""
        import pyarrow.fs as pafs

        host = f"127.0.0.1:{self.port}"
        fs = pafs.S3FileSystem(endpoint_override=host, scheme="http", access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                               secret_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"], region="us-east-1",
                               allow_bucket_creation=True, force_virtual_addressing=False)
        fs.create_dir(name)

    def requests(self) -> list[tuple[str, str, int]]:
        """Every request answered so far: (method, path with query, status), in order."""
        self._log_fh.flush()
        text = _COLOUR.sub("", self.log.read_text(errors="replace"))
        return [(m.group(1), m.group(2), int(m.group(3))) for m in _REQUEST.finditer(text)]

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log_fh.close()


def fresh_prefix() -> str:
    """A warehouse of its own inside the test bucket: `s3://BUCKET/t-<hex>`."""
    return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}"


class CuttableProxy:
    """A TCP forwarder on loopback in front of `target_port`. `cut()` closes every open connection and refuses new
    ones (the store went away mid-request); `restore()` lets connections through again."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self._open = True
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._stopped = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                if not self._open:
                    client.close()
                    continue
                try:
                    upstream = socket.create_connection(("127.0.0.1", self.target_port))
                except OSError:
                    client.close()
                    continue
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        try:
            while True:
                for key, _ in sel.select(timeout=1.0):
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)
        except OSError:
            return
        finally:
            sel.close()
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def cut(self) -> None:
        with self._lock:
            self._open = False
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for s in pair:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def restore(self) -> None:
        with self._lock:
            self._open = True

    def stop(self) -> None:
        self._stopped = True
        self.cut()
        self.listener.close()


def local_parquet_files(*roots: Path) -> Iterator[Path]:
    """Every Parquet file under `roots` (for the test that an `s3://` warehouse leaves none on the local disk)."""
    for root in roots:
        if root.exists():
            yield from (p for p in root.rglob("*.parquet") if p.is_file())
