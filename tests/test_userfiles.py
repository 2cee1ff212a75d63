"""Every file the product reads from a path a user names is a regular file: a FIFO nobody writes to (which blocked
the open forever), a device or a folder in its place is refused at once, in one paragraph naming what it is."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from common_support import assert_one_paragraph_error, run_cli
from iox_planner.errors import BadInputError
from iox_planner.ingest import blocks, bulk
from iox_planner.ingest.scenario import read_scenario
from iox_planner.planner.limits import read_sql_file
from iox_planner.runs.definitions import load_definitions


@pytest.fixture
def alarm() -> Iterator[None]:
    """Fail instead of hanging: a blocked open() is interrupted after 5 s."""
    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError("the read blocked")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(5)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _special(tmp_path: Path, kind: str, name: str) -> Path:
    """A FIFO, a folder or a character device where the reader expects the file `name`."""
    path = tmp_path / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")  # a link to a device: the open follows it, the check sees the device
    return path


def _read_definition_folder(path: Path) -> object:
    return load_definitions(path.parent)


READERS: dict[str, tuple[str, Callable[[Path], object]]] = {
    "scenario": ("s.yaml", read_scenario),
    "definition": ("def.yaml", _read_definition_folder),
    "sql file": ("q.sql", lambda p: read_sql_file(str(p))),
    "line protocol": ("in.lp", lambda p: blocks.open_input(str(p))),
    "bulk-load input": ("in.lp", lambda p: bulk.open_input(p, (0, 0, 0))),
}
KINDS = {"fifo": "a FIFO (named pipe)", "folder": "a folder", "device": "a character device"}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("reader", list(READERS))
def test_a_special_file_where_a_file_is_expected_is_refused_at_once(tmp_path: Path, alarm: None, reader: str,
                                                                    kind: str) -> None:
    name, read = READERS[reader]
    path = _special(tmp_path, kind, name)
    if reader == "bulk-load input" and kind == "device":
        expected = "it is a symlink"  # a bulk load's pinned files are opened without following links
    else:
        expected = f"it is {KINDS[kind]}, not a regular file"
    with pytest.raises(BadInputError, match=f"cannot read .*{re.escape(name)}.*: {re.escape(expected)}"):
        read(path)


def test_load_and_materialized_status_refuse_a_fifo_in_one_paragraph(tmp_path: Path) -> None:
    scenario = _special(tmp_path, "fifo", "s.yaml")
    (tmp_path / "defs").mkdir()
    _special(tmp_path / "defs", "fifo", "def.yaml")
    started = time.monotonic()
    result = run_cli("load", str(scenario))
    assert_one_paragraph_error(result, f"cannot read scenario file {scenario}: it is a FIFO (named pipe)")
    assert result.returncode == 2
    result = run_cli("materialized", "status", env={"IOX_MATERIALIZED_DIR": str(tmp_path / "defs")})
    assert_one_paragraph_error(result, "def.yaml: it is a FIFO (named pipe), not a regular file")
    assert result.returncode == 2
    assert time.monotonic() - started < 30  # both hung until killed
