"""Named kill points: narrow windows the fault-injection tests (tests/faults/, tests/airflow/test_airflow_faults.py)
hit on purpose.

`IOX_FAULT_KILL_AT=<name>` makes the process SIGKILL its own process group (the command and, in-process, its Spark
JVM) when it reaches `kill_point(<name>)`, as a power cut there would. `IOX_FAULT_PAUSE_AT=<name>[,<name>...]`
makes it stop itself at each of those points (SIGSTOP) until the test continues it (SIGCONT): the test learns
exactly when a step starts (its parent sees the stop with waitpid), may change the world meanwhile (stop Postgres
inside an open transaction, say), and then kills at a measured moment after that point.
Both variables are read once, at import: unset (always, outside those tests) a kill point costs two comparisons
with None. Names in use: `write.before_commit`, `write.chunk_put` (after each chunk file's put), `persist.before_put`,
`persist.before_commit`, `persist.before_sweeps`, `bulk.after_tasks` and
`bulk.before_commit` (`ingest/bulk.py`), `compact.before_swap` and `compact.before_commit`
(`maintenance/compact/`), `publish.before_write` (the output's folder is checked and held open,
its private staging folder made: the writer, Spark or the commit step, is about to fill it), `publish.before_rename`,
`publish.after_rename`, `publish.old_moved_aside`, on an object store (`output/store.py`) `publish.store_before_put`
(a text result's one request), `publish.store_before_manifest` and `publish.store_after_manifest`, and in the runs' commit step (`runs/commit.py`)
`commit.start`, `commit.before_commit`, `commit.after_commit`."""

from __future__ import annotations

import os
import signal

from iox_planner.config import FAULT_KILL_AT, FAULT_PAUSE_AT

_KILL_AT = FAULT_KILL_AT.read() or None
_PAUSE_AT = frozenset(FAULT_PAUSE_AT.read()) or None


def kill_point(name: str) -> None:
    """Die here, at once and without cleanup, if IOX_FAULT_KILL_AT names this point; stop here until continued if
    IOX_FAULT_PAUSE_AT names it (a comma-separated list: the process stops at each in turn)."""
    if _PAUSE_AT is not None and name in _PAUSE_AT:
        os.kill(os.getpid(), signal.SIGSTOP)
    if _KILL_AT is not None and _KILL_AT == name:
        os.killpg(os.getpgrp(), signal.SIGKILL)
