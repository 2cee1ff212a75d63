"""Named kill points: narrow windows the fault-injection tests (tests/faults/) hit on purpose.

`IOX_FAULT_KILL_AT=<name>` makes the process SIGKILL its own process group (the command and, in-process, its Spark
JVM) when it reaches `kill_point(<name>)`, as a power cut there would. The variable is read once, at import: unset
(always, outside those tests) a kill point costs one comparison with None. Names in use: `write.before_commit`,
`persist.before_commit`, `bulk.after_tasks` and `bulk.before_commit` (`ingest/bulk.py`), `publish.before_rename`,
`publish.after_rename`, `publish.old_moved_aside`, and in the DAGs' commit step (`dags/iox_airflow/runs.py`)
`commit.before_commit`, `commit.after_commit`."""

from __future__ import annotations

import os
import signal

_KILL_AT = os.environ.get("IOX_FAULT_KILL_AT") or None


def kill_point(name: str) -> None:
    """Die here, at once and without cleanup, if IOX_FAULT_KILL_AT names this point."""
    if _KILL_AT is not None and _KILL_AT == name:
        os.killpg(os.getpgrp(), signal.SIGKILL)
