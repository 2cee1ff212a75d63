"""`iox-batch query --output` (csv and jsonl files, parquet folders) killed with SIGKILL: at the named points of
publication's narrow windows, then at seeded random points over the command's measured duration. An older output
is always in place first. After each kill the path holds the complete old output, the complete new one, or
nothing (only possible while a folder is swapped); rerunning the same command publishes exactly the tally's
answer and removes what the killed run left next to the output."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from fault_support import (report, FULL, QUERY_POINTS, QUERY, FaultWorld, Outcome, Tally, assert_clean_failure, batch, hidden_siblings,
                           read_output, replay, rng_for, run_and_kill)
from iox_planner.ingest.write import write_line_protocol

pytestmark = [pytest.mark.slow, pytest.mark.spark]

FORMATS = ("csv", "parquet", "jsonl")


def _in_process(fw: FaultWorld, db: str, fmt: str, out: Path) -> int:
    """The same command in this process (the shared SparkSession: no JVM start), publishing into this world's
    ledger."""
    from iox_planner.catalog.publications import CatalogLedger
    from iox_planner.cli.main import main
    from iox_planner.output.publish import publishing_as

    with publishing_as("fault test rerun", CatalogLedger(fw.catalog)):
        return main(["query", "--db", db, QUERY, "--format", fmt, "--output", str(out)])


def _killed_run(fw: FaultWorld, db: str, fmt: str, out: Path, delay: float | None, **env: str) -> Outcome:
    return run_and_kill(["query", "--db", db, QUERY, "--format", fmt, "--output", str(out)], fw.env(**env), delay)


class Scenario:
    """One database and one output per format; `step` publishes the current answer (the old output), writes one
    more batch, and returns the old and new expected rows."""

    def __init__(self, fw: FaultWorld, folder: Path) -> None:
        self.fw = fw
        self.db = f"q_{uuid.uuid4().hex[:10]}"
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.tally = Tally()
        self.next = 0
        for _ in range(3):  # every NULL-able field exists before the first query
            self._write()

    def _write(self) -> None:
        write_line_protocol(self.fw.catalog, self.db, batch(self.next))
        self.tally.apply(self.next)
        self.next += 1

    def out(self, fmt: str) -> Path:
        return self.folder / f"result.{fmt}"

    def step(self, fmt: str) -> tuple[list[Any], list[Any]]:
        assert _in_process(self.fw, self.db, fmt, self.out(fmt)) == 0
        old = self.tally.rows()
        assert read_output(self.out(fmt), fmt) == old
        self._write()
        return old, self.tally.rows()

    def check_after_kill(self, fmt: str, outcome: Outcome, old: list[Any], new: list[Any], context: str) -> str:
        assert_clean_failure(outcome, context)
        out = self.out(fmt)
        # Only the output itself is visible; hidden siblings are the staging a rerun cleans up.
        visible = {p.name for p in self.folder.iterdir() if not p.name.startswith(".")}
        assert visible <= {self.out(f).name for f in FORMATS}, f"{context}: {visible}"
        if not out.exists():
            assert fmt == "parquet", f"{context}: a file output vanished"
            state = "nothing"
        else:
            got = read_output(out, fmt)
            assert got in (old, new), f"{context}: a partial output is visible at {out}"
            state = "old" if got == old else "new"
        assert _in_process(self.fw, self.db, fmt, out) == 0, f"{context}: the rerun failed"
        assert read_output(out, fmt) == new, f"{context}: the rerun's answer"
        assert hidden_siblings(out) == [], f"{context}: the rerun left the killed run's files: {hidden_siblings(out)}"
        return state


def _named_kill(fw: FaultWorld, tmp_path: Path, fmt: str, point: str, want: str) -> float:
    sc = Scenario(fw, tmp_path)
    old, new = sc.step(fmt)
    context = replay(f"query --format {fmt}", point)
    outcome = _killed_run(fw, sc.db, fmt, sc.out(fmt), None, IOX_FAULT_KILL_AT=point)
    assert outcome.returncode == -9, f"{context}: the kill point was not reached: {outcome.stderr[-2000:]}"
    assert hidden_siblings(sc.out(fmt)), f"{context}: the killed run should have left its staging behind"
    assert sc.check_after_kill(fmt, outcome, old, new, context) == want, context
    return outcome.seconds


@pytest.mark.skipif(not FULL, reason="CI samples publish.after_rename only (in the random-points test)")
@pytest.mark.parametrize("fmt,point,want", [
    ("csv", "publish.before_rename", "old"),
    ("parquet", "publish.old_moved_aside", "nothing"),
    ("parquet", "publish.after_rename", "new"),
])
def test_query_killed_inside_publication(fw: FaultWorld, spark: object, tmp_path: Path, fmt: str, point: str,
                                         want: str) -> None:
    """Killed anywhere inside publication, a run left hidden staged copies nothing removed."""
    _named_kill(fw, tmp_path, fmt, point, want)


def test_query_killed_at_random_points(fw: FaultWorld, spark: object, tmp_path: Path) -> None:
    """First the named point just after the rename (regression: killed after its rename but before its record, a
    run left an output its own rerun refused as "not written by iox-batch"). That run went through the whole
    command, so it also measures the duration the random points are drawn over."""
    duration = _named_kill(fw, tmp_path / "named", "jsonl", "publish.after_rename", "new")
    rng = rng_for("query")
    sc = Scenario(fw, tmp_path / "random")
    states: dict[str, int] = {}
    for point in range(QUERY_POINTS):
        fmt = FORMATS[point % len(FORMATS)]
        old, new = sc.step(fmt)
        delay = rng.uniform(0, duration * 1.1)
        context = replay(f"query --format {fmt}", f"{point} (SIGKILL after {delay:.3f} s of {duration:.3f} s)")
        outcome = _killed_run(fw, sc.db, fmt, sc.out(fmt), delay)
        state = sc.check_after_kill(fmt, outcome, old, new, context)
        states[state] = states.get(state, 0) + 1
    report(f"query --output: {QUERY_POINTS} random kill points, outputs found {states}, 0 partial outputs")
