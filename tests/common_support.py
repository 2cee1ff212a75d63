"""Small readers for tests: what the catalog and the warehouse hold, read directly (not through the code under
test's own summaries)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import sqlalchemy as sa

from iox_planner.catalog.store import Catalog


FULL = os.environ.get("IOX_TEST_ALL", "") == "1"
"""`IOX_TEST_ALL=1` runs every case of the suites that CI samples (the object-store legs, the Spark Connect
supervisor's restarts, the TLS proxy): CI runs `sampled`'s choice, a full run before a release runs them all."""


def sampled(cases: list[Any], ci: int) -> list[Any]:
    """`cases` whole under IOX_TEST_ALL=1, else `ci` of them spread evenly (first and last included), the same
    ones every run so a failure is reproducible."""
    if FULL or len(cases) <= ci:
        return list(cases)
    if ci <= 1:
        return list(cases[:ci])
    step = (len(cases) - 1) / (ci - 1)
    return [cases[round(i * step)] for i in range(ci)]


def free_port() -> int:
    """A local TCP port nothing listens on now (bound, then freed: the caller starts a server on it, or relies
    on nothing answering there)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def live_chunks(catalog: Catalog, db: str) -> list[dict[str, Any]]:
    """Every live chunk of a database, straight from the catalog tables."""
    out = []
    with catalog.engine.connect() as conn:
        for kind, table in (("parquet", "iox_parquet_file"), ("ingester", "iox_ingester_chunk")):
            rows = conn.execute(sa.text(
                f"SELECT c.*, t.name AS table_name, p.partition_key FROM {table} c "
                "JOIN iox_table t ON t.id = c.table_id JOIN iox_database d ON d.id = t.database_id "
                "JOIN iox_partition p ON p.id = c.partition_id "
                "WHERE d.name = :db AND c.to_delete IS NULL ORDER BY c.chunk_order, c.id"
            ).bindparams(db=db)).mappings()
            out.extend({**r, "kind": kind} for r in rows)
    out.sort(key=lambda r: (r["chunk_order"], r["kind"]))
    return out


def read_rows(path: Path, drop: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    table = pq.read_table(path)
    return [{k: v for k, v in row.items() if k not in drop} for row in table.to_pylist()]


def warehouse_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def catalog_counts(catalog: Catalog) -> dict[str, int]:
    with catalog.engine.connect() as conn:
        return {t: int(conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one())
                for t in ("iox_database", "iox_table", "iox_column", "iox_partition", "iox_parquet_file",
                          "iox_ingester_chunk")}


def env_without(*keys: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in keys}


def run_cli(*args: str, stdin: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed `iox-batch` as a user would."""
    exe = Path(sys.executable).parent / "iox-batch"
    return subprocess.run([str(exe), *args], input=stdin, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)


def assert_one_paragraph_error(result: object, *needles: str) -> None:
    """A user's mistake: non-zero exit, one `error: ...` paragraph on stderr, no traceback (Python or Java)."""
    assert result.returncode != 0, result.stdout  # type: ignore[attr-defined]
    stderr = result.stderr.strip()  # type: ignore[attr-defined]
    assert stderr.startswith("error: "), stderr[:2000]
    assert "\n\n" not in stderr and "Traceback" not in stderr, stderr[:2000]
    assert "\tat " not in stderr and "py4j" not in stderr, stderr[:2000]
    for needle in needles:
        assert needle in stderr, stderr[:2000]


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under `root` (symlinks as their target text) with a digest of its content: what a hostile
    input must not change."""
    import hashlib

    out: dict[str, str] = {}
    if not root.exists():
        return out
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.is_dir():
            out[rel] = "dir"
    return out


def materialized_env(tmp_path: Path, monkeypatch: Any) -> tuple[Path, Path]:
    """A materialization's world of the test's own: an output root (made) and a definitions folder (left to the
    test to fill), the in-process runner. Returns (output root, definitions folder)."""
    out, defs = tmp_path / "out", tmp_path / "defs"
    out.mkdir()
    monkeypatch.setenv("IOX_OUTPUT_ROOT", str(out))
    monkeypatch.delenv("IOX_OUTPUT_ROOTS", raising=False)
    monkeypatch.setenv("IOX_MATERIALIZED_DIR", str(defs))
    monkeypatch.delenv("IOX_RUNNER", raising=False)
    return out, defs
