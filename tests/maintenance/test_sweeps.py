"""The sweeps (`maintenance/sweeps.py`) against the real catalog and warehouse: what dead writes leave in a
database's folder (chunk files of tables and partitions their rolled-back transactions created, and the empty
folders they leave: a real killed write, at the `write.before_commit` kill point in a child process, and a real
failed one, plus folders the sweep must keep), a write in flight holding the sweep off, compaction's strays, and
dead bulk loads' staging."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from common_support import live_chunks
from iox_planner import storage
from iox_planner.catalog import locks
from iox_planner.catalog.store import Catalog
from iox_planner.errors import BadInputError
from iox_planner.ingest import bulk
from iox_planner.ingest.blocks import line_blocks
from iox_planner.ingest.write import write_line_blocks, write_line_protocol
from iox_planner.maintenance.persist import persist
from iox_planner.maintenance.sweeps import sweep_bulk_loads, sweep_compaction_strays, sweep_unreferenced

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


def test_the_unreferenced_file_sweep_waits_for_a_write_in_flight(catalog: Catalog, db: str,
                                                                  warehouse: Path) -> None:
    """A streamed write may hold uncommitted chunk files for longer than the grace period: while any write into
    the database is in flight (it holds the database's order row), the sweep leaves every file alone."""
    write_line_protocol(catalog, db, "m v=1 1")
    [chunk] = live_chunks(catalog, db)
    folder = (warehouse / chunk["path"]).parent
    stray = folder / f"{uuid.uuid4()}.parquet"  # as an in-flight write's chunk file looks: no row names it yet
    stray.write_bytes(b"PAR1")
    os.utime(stray, (1, 1))  # far older than any grace period
    with catalog.engine.connect() as conn:
        db_id = catalog.database_id(conn, db)
    with catalog.engine.begin() as in_flight:
        locks.lock_orders(in_flight, db_id)
        assert sweep_unreferenced(catalog, warehouse, db_id, grace_seconds=0) == []
        assert stray.exists()
    rel = stray.relative_to(warehouse).as_posix()
    assert sweep_unreferenced(catalog, warehouse, db_id, grace_seconds=0) == [rel]
    assert not stray.exists() and (warehouse / chunk["path"]).exists()


def test_strays_are_swept_and_nothing_else(catalog: Catalog, db: str, warehouse: Path) -> None:
    """A compaction killed before its swap leaves `<uuid>.compacted.parquet` (and maybe its `.tmp`); persist's
    sweep of the partition deletes exactly those, never a file the catalog names or another writer's file."""
    write_line_protocol(catalog, db, f"m,t=a f=1 {T0}")
    with catalog.engine.connect() as conn:
        pid, folder = conn.execute(sa.text(
            "SELECT c.partition_id, c.path FROM iox_ingester_chunk c JOIN iox_table t ON t.id = c.table_id "
            "JOIN iox_database d ON d.id = t.database_id WHERE d.name = :db").bindparams(db=db)).one()
    folder = warehouse / Path(folder).parent
    stray = folder / f"{uuid.uuid4()}.compacted.parquet"
    stray_tmp = folder / f".{uuid.uuid4()}.compacted.parquet.{uuid.uuid4().hex}.tmp"
    other = folder / f"{uuid.uuid4()}.parquet"  # e.g. a write's file before its commit: not ours to delete
    for p in (stray, stray_tmp, other):
        p.write_bytes(b"x")
    with catalog.engine.connect() as holder:
        assert locks.try_lock(holder, locks.compaction_key(pid))
        # A compaction holds the partition: its staged outputs are not strays.
        assert sweep_compaction_strays(catalog, warehouse, [pid]) == 0 and stray.exists()
        locks.unlock(holder, locks.compaction_key(pid))
    write_line_protocol(catalog, db, f"m,t=a f=2 {T0}")
    persist(catalog, db, warehouse=warehouse)
    assert not stray.exists() and not stray_tmp.exists() and other.exists()
    with catalog.engine.connect() as conn:
        named = set(conn.execute(sa.text("SELECT path FROM iox_parquet_file WHERE partition_id = :p")
                                 .bindparams(p=pid)).scalars())
    assert all((warehouse / p).exists() for p in named)


def test_a_live_load_is_never_swept_and_a_dead_one_is(catalog: Catalog, tmp_path: Path) -> None:
    load_id = "ab" * 16
    folder = tmp_path / storage.BULK_STAGING / load_id
    folder.mkdir(parents=True)
    (folder / "000000-000000-0000.parquet").write_bytes(b"x")
    moved = tmp_path / "1" / "2" / "3" / "0f0f0f0f-0000-0000-0000-000000000000.parquet"
    moved.parent.mkdir(parents=True)
    moved.write_bytes(b"x")
    outside = tmp_path / "keep.txt"
    outside.write_text("keep")
    (folder / "manifest.json").write_text(
        f'["1/2/3/{moved.name}", "../keep.txt", "/etc/passwd"]')
    past = time.time() - 3600
    os.utime(folder / "000000-000000-0000.parquet", (past, past))
    os.utime(folder / "manifest.json", (past, past))
    os.utime(folder, (past, past))
    assert sweep_bulk_loads(catalog, tmp_path, 7200) == []  # within the grace period
    with bulk._load_lock(catalog, load_id):  # a driver still running
        assert sweep_bulk_loads(catalog, tmp_path, 60) == []
    assert folder.exists() and moved.exists()
    assert sweep_bulk_loads(catalog, tmp_path, 60) == [load_id]
    assert not folder.exists() and not moved.exists() and outside.exists()
