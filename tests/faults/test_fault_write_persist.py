"""`iox-batch write` and `iox-batch persist` killed with SIGKILL at seeded random points (uniform over the
command's own measured duration) and at the named points of the narrow windows (files written, transaction not
committed). After each kill: every live chunk's file reads, a write is all or nothing, the answer is unchanged
(persist) or either before or after the write, and rerunning the command gives the tally's answer. Leftover
files are swept by persist's grace-period sweep."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pyarrow.parquet as pq
import pytest

from fault_support import (report, KEYS, POINTS, FaultWorld, Tally, assert_clean_failure, batch, catalog_problems, chunk_rows,
                      db_id, naive_answer, replay, rng_for, rows_of_write, run_and_kill, unreferenced_files)
from iox_planner.maintenance.persist import persist
from iox_planner.ingest.write import write_line_protocol
from iox_planner.objectstore import Root, parse_root

T0 = 1_704_067_200_000_000_000

pytestmark = pytest.mark.slow


def _db() -> str:
    return f"f_{uuid.uuid4().hex[:10]}"


def _write(fw: FaultWorld, db: str, i: int, delay: float | None, **env: str):  # type: ignore[no-untyped-def]
    return run_and_kill(["write", "--db", db, "-"], fw.env(**env), delay, stdin=batch(i))


def _check_write(fw: FaultWorld, db: str, i: int, tally: Tally, context: str) -> None:
    assert catalog_problems(fw, db) == [], context
    landed = rows_of_write(fw, db, i)
    assert landed in (0, 2 * KEYS), f"{context}: a half-registered write: {landed} of {2 * KEYS} rows"
    before = dict(tally.expected)
    after = Tally()
    after.expected = {k: dict(v) for k, v in before.items()}
    after.apply(i)
    answer = naive_answer(fw, db, "m", ("k", "time"))
    assert answer in (before, after.expected), f"{context}: the answer is neither before nor after the write"


def _sweep_and_check(fw: FaultWorld, db: str, tally: Tally, context: str) -> None:
    """Persist with a zero grace period (nothing else runs): every leftover file goes, the answer is the tally's."""
    persist(fw.catalog, db, warehouse=fw.warehouse, grace_seconds=0)
    assert catalog_problems(fw, db) == [], context
    assert unreferenced_files(fw, db) == [], f"{context}: files left behind after the sweep"
    assert naive_answer(fw, db, "m", ("k", "time")) == tally.expected, context


def test_write_killed_at_random_points(fw: FaultWorld) -> None:
    rng = rng_for("write")
    db = _db()
    tally = Tally()
    reference = _write(fw, db, 0, None)
    assert reference.returncode == 0, reference.stderr
    tally.apply(0)
    duration = reference.seconds
    killed = 0
    for point in range(POINTS):
        i = point + 1
        delay = rng.uniform(0, duration * 1.1)
        context = replay("write", f"{point} (SIGKILL after {delay:.3f} s of {duration:.3f} s)")
        outcome = _write(fw, db, i, delay)
        killed += outcome.killed
        assert_clean_failure(outcome, context)
        _check_write(fw, db, i, tally, context)
        rerun = _write(fw, db, i, None)
        assert rerun.returncode == 0, f"{context}: the rerun failed: {rerun.stderr}"
        tally.apply(i)
        assert naive_answer(fw, db, "m", ("k", "time")) == tally.expected, f"{context}: rerun answer"
    _sweep_and_check(fw, db, tally, replay("write", "final sweep"))
    report(f"write: {POINTS} kill points, {killed} killed mid-run, 0 lost points")


def test_write_killed_before_commit_leaves_nothing_and_its_file_is_swept(fw: FaultWorld) -> None:
    """The narrow window: chunk files written, catalog transaction open. Regression: such a file was never
    deleted by anything (persist's sweep only knew retired rows)."""
    db = _db()
    tally = Tally()
    assert _write(fw, db, 0, None).returncode == 0
    tally.apply(0)
    context = replay("write", "write.before_commit")
    outcome = _write(fw, db, 1, None, IOX_FAULT_KILL_AT="write.before_commit")
    assert outcome.returncode == -9, f"{context}: the kill point was not reached: {outcome.stderr}"
    assert rows_of_write(fw, db, 1) == 0, context
    assert catalog_problems(fw, db) == [], context
    orphans = unreferenced_files(fw, db)
    assert len(orphans) == 2, f"{context}: expected the two uncommitted chunk files, found {orphans}"
    # A sweep with the default grace period keeps them: they may belong to a write still in flight.
    persist(fw.catalog, db, warehouse=fw.warehouse)
    assert unreferenced_files(fw, db) == orphans, context
    assert _write(fw, db, 1, None).returncode == 0
    tally.apply(1)
    _sweep_and_check(fw, db, tally, context)


def test_persist_killed_at_random_points(fw: FaultWorld) -> None:
    rng = rng_for("persist")
    db = _db()
    tally = Tally()
    for i in range(3):
        write_line_protocol(fw.catalog, db, batch(i))
        tally.apply(i)
    reference = run_and_kill(["persist", "--db", db], fw.env(), None)
    assert reference.returncode == 0, reference.stderr
    duration = reference.seconds
    killed = 0
    for point in range(POINTS):
        i = point + 3
        write_line_protocol(fw.catalog, db, batch(i))
        tally.apply(i)
        delay = rng.uniform(0, duration * 1.1)
        context = replay("persist", f"{point} (SIGKILL after {delay:.3f} s of {duration:.3f} s)")
        outcome = run_and_kill(["persist", "--db", db], fw.env(), delay)
        killed += outcome.killed
        assert_clean_failure(outcome, context)
        assert catalog_problems(fw, db) == [], context
        assert naive_answer(fw, db, "m", ("k", "time")) == tally.expected, f"{context}: the answer changed"
        rerun = run_and_kill(["persist", "--db", db], fw.env(), None)
        assert rerun.returncode == 0, f"{context}: the rerun failed: {rerun.stderr}"
        assert not [r for r in chunk_rows(fw.catalog, db) if r["kind"] == "ingester"], context
        assert naive_answer(fw, db, "m", ("k", "time")) == tally.expected, f"{context}: rerun answer"
    _sweep_and_check(fw, db, tally, replay("persist", "final sweep"))
    report(f"persist: {POINTS} kill points, {killed} killed mid-run, 0 lost points")


def test_persist_killed_before_commit_changes_nothing_and_its_file_is_swept(fw: FaultWorld) -> None:
    db = _db()
    tally = Tally()
    for i in range(2):
        write_line_protocol(fw.catalog, db, batch(i))
        tally.apply(i)
    before = chunk_rows(fw.catalog, db)
    context = replay("persist", "persist.before_commit")
    outcome = run_and_kill(["persist", "--db", db], fw.env(IOX_FAULT_KILL_AT="persist.before_commit"), None)
    assert outcome.returncode == -9, f"{context}: the kill point was not reached: {outcome.stderr}"
    assert chunk_rows(fw.catalog, db) == before, context
    assert len(unreferenced_files(fw, db)) == 1, context
    assert naive_answer(fw, db, "m", ("k", "time")) == tally.expected, context
    rerun = run_and_kill(["persist", "--db", db], fw.env(), None)
    assert rerun.returncode == 0, rerun.stderr
    _sweep_and_check(fw, db, tally, context)


# --- on an s3 warehouse ---------------------------------------------------------------------------------------------
# The same windows with the warehouse on the suite's real S3 API server: a killed writer leaves at most objects no
# row names (nothing of the catalog changes), which only a sweep past the grace period deletes; the store cut
# (`CuttableProxy`) in the middle of a write or a persist ends in the retryable error (exit 75) with nothing
# registered.


def _s3_env(fw: FaultWorld, uri: str, endpoint: str, **extra: str) -> dict[str, str]:
    env = fw.env(**extra)
    env.update(IOX_WAREHOUSE=uri, AWS_ENDPOINT_URL=endpoint)
    return env


def _orphans(fw: FaultWorld, root: Root, db: str) -> list[str]:
    """Objects under the database's prefix that no catalog row (live or retired) names."""
    ident = db_id(fw.catalog, db)
    if ident is None:
        return []
    known = {r["path"] for r in chunk_rows(fw.catalog, db, live=False)}
    return sorted(o.rel for o in root.list(str(ident)) if o.rel not in known)


def _s3_problems(fw: FaultWorld, root: Root, db: str) -> list[str]:
    """Every live chunk's object exists and holds the rows its row says."""
    problems = []
    for row in chunk_rows(fw.catalog, db):
        try:
            rows = pq.read_metadata(root.path(row["path"]), filesystem=root.filesystem()).num_rows
        except FileNotFoundError:
            problems.append(f"{row['kind']} chunk {row['id']}: object {row['path']} is missing")
            continue
        if rows != row["row_count"]:
            problems.append(f"{row['kind']} chunk {row['id']}: {rows} rows, the catalog says {row['row_count']}")
    return problems


@pytest.fixture
def s3_root(s3_server: Any) -> Root:
    from s3_support import fresh_prefix

    return parse_root(fresh_prefix())


@pytest.mark.parametrize("point", ["write.before_commit", "persist.before_commit"])
def test_a_writer_killed_on_a_store_leaves_only_orphans_the_sweep_takes_after_the_grace_period(
        fw: FaultWorld, s3_root: Root, s3_server: Any, point: str) -> None:
    db = _db()
    env = _s3_env(fw, s3_root.uri, s3_server.endpoint)
    for i in range(2):
        assert run_and_kill(["write", "--db", db, "-"], env, None, stdin=batch(i)).returncode == 0
    before = chunk_rows(fw.catalog, db, live=False)
    assert before and _orphans(fw, s3_root, db) == []
    context = replay(f"s3 {point}", point)
    if point.startswith("write"):
        outcome = run_and_kill(["write", "--db", db, "-"], {**env, "IOX_FAULT_KILL_AT": point}, None,
                               stdin=batch(2))
    else:
        outcome = run_and_kill(["persist", "--db", db], {**env, "IOX_FAULT_KILL_AT": point}, None)
    assert outcome.returncode == -9, f"{context}: the kill point was not reached: {outcome.stderr}"
    assert chunk_rows(fw.catalog, db, live=False) == before, f"{context}: the catalog changed"
    assert _s3_problems(fw, s3_root, db) == [], context
    orphans = _orphans(fw, s3_root, db)
    assert len(orphans) == (2 if point.startswith("write") else 1), f"{context}: {orphans}"
    # A sweep within the grace period keeps them (they may be a write's in flight); past it they go.
    persist(fw.catalog, db, warehouse=s3_root, grace_seconds=3600)
    assert set(orphans) <= set(_orphans(fw, s3_root, db)), context
    time.sleep(1.1)  # the store's last-modified times have whole seconds
    persist(fw.catalog, db, warehouse=s3_root, grace_seconds=0)
    assert _orphans(fw, s3_root, db) == [], f"{context}: orphans left after the sweep"
    assert _s3_problems(fw, s3_root, db) == [], context


@pytest.mark.parametrize("operation", ["write", "persist"])
def test_the_store_cut_mid_command_is_the_retryable_error_with_nothing_registered(
        fw: FaultWorld, s3_root: Root, s3_server: Any, operation: str) -> None:
    """The command stops at a point between its store requests (`write.chunk_put`: a chunk put, more to come;
    `persist.before_put`: the chunks read, the partition locked, the file not yet put), the store goes away, the
    command goes on."""
    from fault_support import PausedCommand, IOX
    from s3_support import CuttableProxy

    db = _db()
    proxy = CuttableProxy(s3_server.port)
    if operation == "persist":
        for i in range(3):
            write_line_protocol(fw.catalog, db, batch(i), warehouse=s3_root)
    before = chunk_rows(fw.catalog, db, live=False)
    point = "write.chunk_put" if operation == "write" else "persist.before_put"
    env = _s3_env(fw, s3_root.uri, proxy.endpoint, IOX_FAULT_PAUSE_AT=point)
    context = replay(f"s3 cut {operation}", point)
    try:
        if operation == "write":
            source = fw.base / f"{db}.lp"
            source.write_text(batch(9))
            command = PausedCommand([IOX, "write", "--db", db, str(source)], env)
        else:
            command = PausedCommand([IOX, "persist", "--db", db], env)
        assert command.wait_stopped(timeout=120), f"{context}: the pause point was not reached"
        proxy.cut()
        command.resume()
        outcome = command.finish(timeout=300)
    finally:
        proxy.stop()
    assert outcome.returncode == 75, f"{context}: not the retryable store error: {outcome.stderr[:2000]}"
    stderr = outcome.stderr.strip()
    assert stderr.startswith("error: ") and "object store" in stderr, stderr[:2000]
    assert "Traceback" not in stderr and "\n\n" not in stderr, stderr[:2000]
    assert s3_server.env()["AWS_SECRET_ACCESS_KEY"] not in outcome.stdout + outcome.stderr
    assert chunk_rows(fw.catalog, db, live=False) == before, f"{context}: something was registered"
    assert _s3_problems(fw, s3_root, db) == [], context
    if operation == "write":
        assert db_id(fw.catalog, db) is None, f"{context}: the write's new database was committed"
        assert len(list(s3_root.list())) == 1, f"{context}: the chunk put before the cut is not left as an orphan"
