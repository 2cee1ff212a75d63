"""The catalog's Postgres (the suite's OWN cluster, never the project's) stopped and restarted in the middle of a
write, a persist and a query --output, at seeded random moments across each command's measured duration. The
command either succeeds or fails with one paragraph (the retryable CatalogUnavailableError, exit 75); afterwards
the catalog is consistent, a write is all or nothing, no partial output is visible, and rerunning the command
gives the tally's answer."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Callable

import pytest

from fault_support import (IOX, RESTARTS, report, KEYS, QUERY, FaultWorld, PausedCommand, Restarter, Tally, batch,
                           catalog_problems,
                           failed_retryably, hidden_siblings, naive_answer, read_output, replay, rng_for,
                           rows_of_write, run_and_kill, unreferenced_files)
from iox_planner.maintenance.persist import persist
from iox_planner.ingest.write import write_line_protocol
from iox_planner.model import ChunkKind

pytestmark = pytest.mark.slow

def _measure(run: Callable[[], object]) -> float:
    started = time.monotonic()
    run()
    return time.monotonic() - started


def test_postgres_restarted_during_write(fw: FaultWorld) -> None:
    rng = rng_for("postgres-write")
    db = f"pw_{uuid.uuid4().hex[:10]}"
    tally = Tally()
    first = run_and_kill(["write", "--db", db, "-"], fw.env(), None, stdin=batch(0))
    assert first.returncode == 0, first.stderr
    tally.apply(0)
    failed = 0
    for point in range(RESTARTS):
        i = point + 1
        delay = rng.uniform(0, first.seconds * 1.1)
        context = replay("write + Postgres restart", f"{point} (stop after {delay:.3f} s of {first.seconds:.3f} s)")
        with Restarter(fw, delay):
            outcome = run_and_kill(["write", "--db", db, "-"], fw.env(), None, stdin=batch(i))
        failed += failed_retryably(outcome, context)
        assert catalog_problems(fw, db) == [], context
        landed = rows_of_write(fw, db, i)
        assert landed == (2 * KEYS if outcome.returncode == 0 else landed) and landed in (0, 2 * KEYS), context
        rerun = run_and_kill(["write", "--db", db, "-"], fw.env(), None, stdin=batch(i))
        assert rerun.returncode == 0, f"{context}: the rerun failed: {rerun.stderr}"
        tally.apply(i)
        assert naive_answer(fw, db, "m", ("k", "time")) == tally.expected, context
    persist(fw.catalog, db, warehouse=fw.warehouse, grace_seconds=0)
    assert unreferenced_files(fw, db) == [] and catalog_problems(fw, db) == []
    assert naive_answer(fw, db, "m", ("k", "time")) == tally.expected
    report(f"write + Postgres restart: {RESTARTS} restarts, {failed} writes failed retryably, 0 lost points")


def test_postgres_restarted_during_persist(fw: FaultWorld) -> None:
    rng = rng_for("postgres-persist")
    db = f"pp_{uuid.uuid4().hex[:10]}"
    tally = Tally()
    write_line_protocol(fw.catalog, db, batch(0))
    tally.apply(0)
    first = run_and_kill(["persist", "--db", db], fw.env(), None)
    assert first.returncode == 0, first.stderr
    failed = 0
    for point in range(RESTARTS):
        i = point + 1
        write_line_protocol(fw.catalog, db, batch(i))
        tally.apply(i)
        delay = rng.uniform(0, first.seconds * 1.1)
        context = replay("persist + Postgres restart", f"{point} (stop after {delay:.3f} s of {first.seconds:.3f} s)")
        with Restarter(fw, delay):
            outcome = run_and_kill(["persist", "--db", db], fw.env(), None)
        failed += failed_retryably(outcome, context)
        assert catalog_problems(fw, db) == [], context
        assert naive_answer(fw, db, "m", ("k", "time")) == tally.expected, context
        rerun = run_and_kill(["persist", "--db", db], fw.env(), None)
        assert rerun.returncode == 0, f"{context}: the rerun failed: {rerun.stderr}"
        assert naive_answer(fw, db, "m", ("k", "time")) == tally.expected, context
    persist(fw.catalog, db, warehouse=fw.warehouse, grace_seconds=0)
    assert unreferenced_files(fw, db) == [] and catalog_problems(fw, db) == []
    report(f"persist + Postgres restart: {RESTARTS} restarts, {failed} persists failed retryably, 0 lost points")


def test_postgres_lost_after_a_persist_committed_is_a_warning_not_a_failure(fw: FaultWorld) -> None:
    """The sweeps run after every partition committed: Postgres gone then leaves the persist done, and the
    command says so and exits 0 (a command that exits non-zero has changed nothing)."""
    db = f"pw_{uuid.uuid4().hex[:10]}"
    tally = Tally()
    write_line_protocol(fw.catalog, db, batch(0))
    tally.apply(0)
    command = PausedCommand([IOX, "persist", "--db", db], fw.env(IOX_FAULT_PAUSE_AT="persist.before_sweeps"))
    assert command.wait_stopped(), command.finish().stderr
    fw.stop_pg("immediate")
    try:
        command.resume()
        outcome = command.finish(timeout=120)
    finally:
        fw.start_pg()
    assert outcome.returncode == 0, outcome.stderr
    assert outcome.stdout.startswith("persisted m "), outcome.stdout
    assert outcome.stderr.startswith("warning: the persist is committed, but cleaning up old files failed"), \
        outcome.stderr
    assert "Traceback" not in outcome.stderr and outcome.stderr.count("\n") == 1, outcome.stderr
    with fw.catalog.engine.connect() as conn:
        kinds = [row.kind for row in fw.catalog.chunk_rows(conn, fw.catalog.database_id(conn, db))]
    assert kinds and set(kinds) == {ChunkKind.PARQUET}, kinds  # every ingester chunk persisted
    assert naive_answer(fw, db, "m", ("k", "time")) == tally.expected


@pytest.mark.spark
def test_postgres_restarted_during_query_output(fw: FaultWorld, spark: object, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """In this process (the shared SparkSession; a JVM per point would cost CI minutes): the catalog is read
    while planning and written when publishing, so a restart can hit either."""
    from iox_planner.catalog.publications import CatalogLedger
    from iox_planner.cli.main import main
    from iox_planner.output.publish import publishing_as

    rng = rng_for("postgres-query")
    db = f"pq_{uuid.uuid4().hex[:10]}"
    tally = Tally()
    for i in range(3):
        write_line_protocol(fw.catalog, db, batch(i))
        tally.apply(i)
    formats = ("csv", "parquet", "jsonl")

    def query(fmt: str) -> int:
        with publishing_as("fault test", CatalogLedger(fw.catalog)):
            return main(["query", "--db", db, QUERY, "--format", fmt, "--output", str(tmp_path / f"r.{fmt}")])

    duration = _measure(lambda: query("csv"))
    assert read_output(tmp_path / "r.csv", "csv") == tally.rows()
    published = {"csv": tally.rows()}  # what each output path last received, by the test's own account
    failed = 0
    for point in range(RESTARTS):
        fmt = formats[point % len(formats)]
        out = tmp_path / f"r.{fmt}"
        old = published.get(fmt)
        i = point + 3
        write_line_protocol(fw.catalog, db, batch(i))
        tally.apply(i)
        delay = rng.uniform(0, duration * 1.1)
        context = replay(f"query --format {fmt} + Postgres restart", f"{point} (stop after {delay:.3f} s)")
        capsys.readouterr()
        with Restarter(fw, delay):
            code = query(fmt)
        stderr = capsys.readouterr().err
        if code != 0:
            failed += 1
            assert code == 75 and stderr.startswith("error: ") and "Traceback" not in stderr, f"{context}: {stderr}"
            if out.exists():
                assert read_output(out, fmt) == old, f"{context}: a partial output is visible"
        else:
            assert read_output(out, fmt) == tally.rows(), context
        assert query(fmt) == 0, f"{context}: the rerun failed: {capsys.readouterr().err}"
        assert read_output(out, fmt) == tally.rows(), f"{context}: the rerun's answer"
        published[fmt] = tally.rows()
        assert hidden_siblings(out) == [], context
    report(f"query --output + Postgres restart: {RESTARTS} restarts, {failed} queries failed retryably, 0 partial outputs")
