"""`iox-batch write` and `iox-batch persist` killed with SIGKILL at seeded random points (uniform over the
command's own measured duration) and at the named points of the narrow windows (files written, transaction not
committed). After each kill: every live chunk's file reads, a write is all or nothing, the answer is unchanged
(persist) or either before or after the write, and rerunning the command gives the tally's answer. Leftover
files are swept by persist's grace-period sweep."""

from __future__ import annotations

import uuid

import pytest

from fault_support import (report, KEYS, POINTS, FaultWorld, Tally, assert_clean_failure, batch, catalog_problems, chunk_rows,
                      naive_answer, replay, rng_for, rows_of_write, run_and_kill, unreferenced_files)
from iox_planner.maintenance.persist import persist
from iox_planner.ingest.write import write_line_protocol

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
