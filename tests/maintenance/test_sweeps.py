"""Persist's sweep of what dead writes leave in a database's warehouse folder: chunk files of tables and
partitions their rolled-back transactions created, and the empty folders they leave. A real killed write (the
`write.before_commit` kill point, in a child process) and a real failed one, plus folders the sweep must keep."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import live_chunks
from iox_planner.catalog.store import Catalog
from iox_planner.errors import BadInputError
from iox_planner.ingest.blocks import line_blocks
from iox_planner.ingest.persist import sweep_unreferenced
from iox_planner.ingest.write import write_line_blocks, write_line_protocol

T0 = 1_704_067_200_000_000_000
DAY = 86_400_000_000_000


def _tree(folder: Path) -> tuple[set[str], set[str]]:
    """(folders, files) under `folder`, relative to it."""
    dirs, files = set(), set()
    for p in folder.rglob("*"):
        (dirs if p.is_dir() else files).add(p.relative_to(folder).as_posix())
    return dirs, files


def _age(paths: list[Path]) -> None:
    past = time.time() - 7200
    for p in paths:
        os.utime(p, (past, past), follow_symlinks=False)


def test_the_sweep_removes_dead_writes_files_and_empty_old_folders_only(catalog: Catalog, db: str,
                                                                         warehouse: Path) -> None:
    write_line_protocol(catalog, db, f"m v=1 {T0}")
    [chunk] = live_chunks(catalog, db)
    db_id = int(chunk["path"].split("/")[0])
    folder = warehouse / str(db_id)
    live_dirs, live_files = _tree(folder)

    # Killed with its transaction open: a new table's chunk and a new partition of `m` stay, in folders of ids
    # that were never committed.
    exe = Path(sys.executable).parent / "iox-batch"
    killed = subprocess.run([str(exe), "write", "--db", db, "-"], input=f"n,h=a v=1 {T0}\nm v=2 {T0 + DAY}\n",
                            env={**os.environ, "IOX_FAULT_KILL_AT": "write.before_commit"}, capture_output=True,
                            text=True, timeout=120, start_new_session=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    # Failed on a late bad line after a chunk was written: its files go with the rollback, its folders stay.
    lines = "".join(f"f{k},h=a v={k} {T0 + 3 * DAY}\n" for k in range(4)) + "f3,h=a v=oops 1\n"
    with pytest.raises(BadInputError):
        write_line_blocks(catalog, db, line_blocks(io.BytesIO(lines.encode()), "in", block_bytes=24), chunk_rows=1)
    dirs, files = _tree(folder)
    killed_files = files - live_files
    assert len(killed_files) == 2, files
    dead_dirs = dirs - live_dirs
    assert len({d for d in dead_dirs if "/" not in d}) >= 2, f"no folder of a new table was left: {dead_dirs}"
    assert any(not any((folder / d).iterdir()) for d in dead_dirs), f"no empty folder was left: {dead_dirs}"

    # Folders the sweep must keep however old: one holding something not ours, one not named by an id, and the
    # live partition's; and an empty one younger than the grace period (a writer may have just made it).
    table_id = chunk["path"].split("/")[1]
    (folder / table_id / "999999991").mkdir()
    (folder / table_id / "999999991" / "notes.txt").write_text("not a chunk")
    (folder / "x").mkdir()
    keep_old = [folder / table_id / "999999991" / "notes.txt", folder / table_id / "999999991", folder / "x"]

    assert sweep_unreferenced(catalog, warehouse, db_id, grace_seconds=3600) == []
    assert _tree(folder)[0] == dirs | {f"{table_id}/999999991", "x"}, "removed within the grace period"

    _age([folder / p for p in sorted(dirs | files, key=len, reverse=True)] + keep_old + [folder])
    (folder / table_id / "999999992").mkdir()  # young: kept
    swept = sweep_unreferenced(catalog, warehouse, db_id, grace_seconds=3600)
    assert sorted(swept) == sorted(f"{db_id}/{f}" for f in killed_files)
    after_dirs, after_files = _tree(folder)
    assert after_files == live_files | {f"{table_id}/999999991/notes.txt"}
    assert after_dirs == live_dirs | {f"{table_id}/999999991", f"{table_id}/999999992", "x"}
    assert folder.is_dir()
