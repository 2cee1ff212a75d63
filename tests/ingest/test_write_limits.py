"""The catalog limits of a write (catalog/limits.py): tables per database, columns per table, partitions per write.
Each entry path is refused whole one past a limit, with the catalog's rows and the warehouse's files as they were
(read directly, not through the code under test), and accepted exactly at it; what the database already holds
counts; two writers racing to a limit (real processes) never both pass; and adding columns or partitions costs
the same catalog statements and linear time however many."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pytest
import sqlalchemy as sa

from common_support import assert_one_paragraph_error, catalog_counts, run_cli, tree_digest
from iox_planner.catalog.store import Catalog
from iox_planner.errors import BadInputError
from iox_planner.ingest import bulk
from iox_planner.ingest.register import register_interval
from iox_planner.ingest.scenario import load_scenario, parse_scenario
from iox_planner.ingest.write import write_line_protocol
from iox_planner.timeutil import NS_PER_DAY

DAY0 = 1_704_067_200_000_000_000  # 2024-01-01T00:00:00Z
LIMITS = {"IOX_DB_MAX_TABLES": "3", "IOX_TABLE_MAX_COLUMNS": "4", "IOX_WRITE_MAX_PARTITIONS": "3"}


@pytest.fixture
def limits(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for name, value in LIMITS.items():
        monkeypatch.setenv(name, value)
    return dict(LIMITS)


def lines_tables(n: int, day: int = 0) -> str:
    """n tables, one line each (2 columns: a field and time)."""
    return "".join(f"m{i} f=1 {DAY0 + day * NS_PER_DAY + i}\n" for i in range(n))


def lines_columns(n: int) -> str:
    """One table with n columns: n - 2 tags, one field, time."""
    return "".join(f"m,k{i}=v f=1 {DAY0 + i}\n" for i in range(n - 2))


def lines_days(n: int) -> str:
    """One table over n days (3 columns)."""
    return "".join(f"m,h=a f=1 {DAY0 + i * NS_PER_DAY}\n" for i in range(n))


SHAPES = {  # limit kind -> (lines exactly at LIMITS, the setting named in the refusal)
    "tables": (lines_tables, "IOX_DB_MAX_TABLES"),
    "columns": (lines_columns, "IOX_TABLE_MAX_COLUMNS"),
    "partitions": (lines_days, "IOX_WRITE_MAX_PARTITIONS"),
}
AT = {"tables": 3, "columns": 4, "partitions": 3}


class Snapshot:
    """The catalog's row counts and the warehouse's files, read straight from Postgres and the disk."""

    def __init__(self, catalog: Catalog, warehouse: Path) -> None:
        self.catalog, self.warehouse = catalog, warehouse
        self.before = self.take()

    def take(self) -> tuple[dict[str, int], int, dict[str, str]]:
        with self.catalog.engine.connect() as conn:
            events = int(conn.execute(sa.text("SELECT count(*) FROM iox_write_event")).scalar_one())
        return catalog_counts(self.catalog), events, tree_digest(self.warehouse)

    def unchanged(self, *, files_only: bool = False) -> None:
        after = self.take()
        assert after[0] == self.before[0], "catalog rows changed"
        assert after[1] == self.before[1], "a write event was logged"
        if files_only:
            after_files = {k: v for k, v in after[2].items() if v != "dir"}
            assert after_files == {k: v for k, v in self.before[2].items() if v != "dir"}, "the warehouse changed"
        else:
            assert after[2] == self.before[2], "the warehouse changed"


# --- the entry paths ----------------------------------------------------------------------------------------------

def via_stream(catalog: Catalog, db: str, text: str, tmp: Path) -> None:
    write_line_protocol(catalog, db, text)


def via_bulk(catalog: Catalog, db: str, text: str, tmp: Path) -> None:
    """The bulk load's driver with its tasks run in this process (`local_runner`), two files of several ranges."""
    folder = tmp / f"bulk-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    lines = text.splitlines(keepends=True)
    half = max(1, len(lines) // 2)
    (folder / "a.lp").write_text("".join(lines[:half]))
    if lines[half:]:
        (folder / "b.lp").write_text("".join(lines[half:]))
    bulk.bulk_write(catalog, db, str(folder), bulk.local_runner, target_bytes=64)


def via_scenario(catalog: Catalog, db: str, text: str, tmp: Path) -> None:
    lines = text.splitlines(keepends=True)
    chunks = [{"id": f"C{i}", "kind": "ingester" if i % 2 else "parquet", "lines": line}
              for i, line in enumerate(lines)]
    load_scenario(catalog, parse_scenario({"db": db, "chunks": chunks}, "limits.yaml"), db)


PATHS: dict[str, Callable[[Catalog, str, str, Path], None]] = {
    "stream": via_stream, "bulk": via_bulk, "scenario": via_scenario}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("kind", sorted(SHAPES))
def test_at_the_limit_accepted_one_over_refused_whole(
        path: str, kind: str, limits: dict[str, str], catalog: Catalog, warehouse: Path, db: str,
        tmp_path: Path) -> None:
    make, setting = SHAPES[kind]
    write = PATHS[path]
    snap = Snapshot(catalog, warehouse)
    with pytest.raises(BadInputError) as refused:
        write(catalog, db, make(AT[kind] + 1), tmp_path)
    message = str(refused.value)
    assert setting in message and "nothing was written" in message, message
    assert f"{AT[kind] + 1:,}" in message and f"at most {AT[kind]:,}" in message, message
    snap.unchanged()
    write(catalog, db, make(AT[kind]), tmp_path)  # exactly at the limit
    assert catalog_counts(catalog) != snap.before[0]


def test_register_as_refused_whole_and_accepted_at_the_limit(
        limits: dict[str, str], catalog: Catalog, warehouse: Path, db: str) -> None:
    def result(days: int, fields: int) -> pa.Table:
        times = [DAY0 + d * NS_PER_DAY for d in range(days)]
        cols: dict[str, Any] = {"host": ["a"] * days, "time": pa.array(times, pa.timestamp("ns"))}
        for i in range(fields):
            cols[f"v{i}"] = [1.0] * days
        return pa.table(cols)

    interval = (DAY0, DAY0 + 10 * NS_PER_DAY)
    snap = Snapshot(catalog, warehouse)
    for days, fields, setting in ((4, 1, "IOX_WRITE_MAX_PARTITIONS"), (1, 3, "IOX_TABLE_MAX_COLUMNS")):
        with pytest.raises(BadInputError, match=setting):
            register_interval(catalog, db, "rollup", result(days, fields), tags=["host"], interval=interval)
        snap.unchanged()
    register_interval(catalog, db, "rollup", result(3, 2), tags=["host"], interval=interval)
    assert catalog_counts(catalog)["iox_parquet_file"] == snap.before[0]["iox_parquet_file"] + 3


def test_register_as_counts_the_database_tables(limits: dict[str, str], catalog: Catalog, warehouse: Path,
                                                db: str) -> None:
    write_line_protocol(catalog, db, lines_tables(3))
    snap = Snapshot(catalog, warehouse)
    data = pa.table({"host": ["a"], "time": pa.array([DAY0], pa.timestamp("ns")), "v": [1.0]})
    with pytest.raises(BadInputError, match="3 it already has . 1 new"):
        register_interval(catalog, db, "rollup", data, tags=["host"], interval=(DAY0, DAY0 + NS_PER_DAY))
    snap.unchanged()


@pytest.mark.parametrize("kind", ["tables", "columns"])
def test_what_the_database_holds_counts(kind: str, limits: dict[str, str], catalog: Catalog, warehouse: Path,
                                        db: str) -> None:
    if kind == "tables":
        first, second = lines_tables(2), lines_tables(4)  # m0, m1 again, then m2 and m3: 4 tables in all
        counts = "2 it already has + 2 new"
    else:
        first = lines_columns(3)  # k0, f, time
        second = f"m,k1=v,k2=v f=1 {DAY0}\n"  # k1 and k2 are new: 5 columns
        counts = "3 it already has + 2 new"
    write_line_protocol(catalog, db, first)
    snap = Snapshot(catalog, warehouse)
    with pytest.raises(BadInputError) as refused:
        write_line_protocol(catalog, db, second)
    assert counts in str(refused.value) and "the catalog counts" in str(refused.value), str(refused.value)
    snap.unchanged()


def test_a_dropped_table_does_not_count(limits: dict[str, str], catalog: Catalog, db: str) -> None:
    from iox_planner.catalog.drops import drop_table

    write_line_protocol(catalog, db, lines_tables(3))
    drop_table(catalog, db, "m0")
    write_line_protocol(catalog, db, "new f=1 1\n")


def test_cli_write_refusal_is_one_paragraph(catalog: Catalog, warehouse: Path, db: str) -> None:
    snap = Snapshot(catalog, warehouse)
    result = run_cli("write", "--db", db, "-", stdin=lines_days(4), env={"IOX_WRITE_MAX_PARTITIONS": "3"})
    assert result.returncode == 2
    assert_one_paragraph_error(result, "IOX_WRITE_MAX_PARTITIONS", "4 partitions")
    snap.unchanged()


def test_stream_write_stops_storing_past_a_limit_and_keeps_nothing(
        monkeypatch: pytest.MonkeyPatch, catalog: Catalog, warehouse: Path, db: str) -> None:
    """Full chunks of an early day are stored while reading (IOX_WRITE_CHUNK_ROWS); a later line passing the
    partition limit rolls them back with everything else, and the count covers the whole input."""
    monkeypatch.setenv("IOX_WRITE_MAX_PARTITIONS", "2")
    monkeypatch.setenv("IOX_WRITE_CHUNK_ROWS", "10")
    text = "".join(f"m,h=a f={i} {DAY0 + i}\n" for i in range(50)) + lines_days(6)
    snap = Snapshot(catalog, warehouse)
    with pytest.raises(BadInputError, match="touches 6 partitions"):
        write_line_protocol(catalog, db, text)
    # Files only: the folders of the chunks it had stored stay, empty, for the sweep (README: Storage), as after
    # any write that rolled back.
    snap.unchanged(files_only=True)


# --- concurrent writers -------------------------------------------------------------------------------------------

def _stopped(pid: int) -> bool:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2] in "Tt"


def _waiting_on_a_lock(catalog: Catalog) -> bool:
    with catalog.engine.connect() as conn:
        return bool(conn.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )).scalar_one())


def test_two_racing_writers_never_both_pass(catalog_url: str, catalog: Catalog, db: str, tmp_path: Path) -> None:
    """Writer A passes its check and stops just before its COMMIT (IOX_FAULT_PAUSE_AT); writer B, which would
    also fit alone, starts then. B must wait for A's order lock and count A's table once A commits: refused."""
    env = {**os.environ, "IOX_DB_MAX_TABLES": "2"}
    write_line_protocol(catalog, db, "base f=1 1\n")
    exe = str(Path(sys.executable).parent / "iox-batch")
    (tmp_path / "a.lp").write_text("a f=1 1\n")
    a = subprocess.Popen([exe, "write", "--db", db, str(tmp_path / "a.lp")], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         env={**env, "IOX_FAULT_PAUSE_AT": "write.before_commit"})
    try:
        deadline = time.monotonic() + 120
        while not _stopped(a.pid):
            assert a.poll() is None, a.stderr.read() if a.stderr else ""
            assert time.monotonic() < deadline, "writer A never reached its pause point"
            time.sleep(0.05)
        (tmp_path / "b.lp").write_text("b f=1 1\n")
        b = subprocess.Popen([exe, "write", "--db", db, str(tmp_path / "b.lp")], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        # B must be waiting on A's lock (a catalog session waiting for a lock) before A goes on to commit.
        while not _waiting_on_a_lock(catalog):
            assert b.poll() is None, f"writer B finished while A held its lock: {b.communicate()}"
            assert time.monotonic() < deadline + 120, "writer B never waited for A"
            time.sleep(0.05)
        os.killpg(a.pid, signal.SIGCONT)
        a_out, a_err = a.communicate(timeout=120)
        b_out, b_err = b.communicate(timeout=120)
    finally:
        if a.poll() is None:
            os.killpg(a.pid, signal.SIGKILL)
    assert a.returncode == 0, a_err
    assert b.returncode == 2 and "IOX_DB_MAX_TABLES" in b_err and "2 it already has + 1 new" in b_err, b_err
    with catalog.engine.connect() as conn:
        names = set(conn.execute(sa.text(
            "SELECT t.name FROM iox_table t JOIN iox_database d ON d.id = t.database_id "
            "WHERE d.name = :db AND t.dropped_at IS NULL").bindparams(db=db)).scalars())
    assert names == {"base", "a"}


# --- cost: statements and time ------------------------------------------------------------------------------------

class Statements:
    """Counts the statements the catalog's engine sends (executemany batches count as one each)."""

    def __init__(self, catalog: Catalog) -> None:
        self.count = 0
        self.engine = catalog.engine
        sa.event.listen(self.engine, "before_cursor_execute", self._seen)

    def _seen(self, *args: Any) -> None:
        self.count += 1

    def close(self) -> None:
        sa.event.remove(self.engine, "before_cursor_execute", self._seen)


@pytest.fixture
def statements(catalog: Catalog) -> Iterator[Statements]:
    counter = Statements(catalog)
    yield counter
    counter.close()


@pytest.mark.parametrize("shape", ["columns", "partitions", "tables"])
def test_catalog_statements_do_not_grow_with_the_write(shape: str, monkeypatch: pytest.MonkeyPatch,
                                                       catalog: Catalog, statements: Statements) -> None:
    for name in LIMITS:
        monkeypatch.setenv(name, "100000")
    make = SHAPES[shape][0]
    counts = []
    for n in (20, 400):
        before = statements.count
        write_line_protocol(catalog, f"t_{uuid.uuid4().hex[:12]}", make(n))
        counts.append(statements.count - before)
    # A few more for 20x the tables, columns or days (SQLAlchemy sends a batch per 1,000 rows), never one per item.
    assert counts[1] <= counts[0] + 6, counts


def _cpu(fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(2):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


@pytest.mark.parametrize("path", ["vectorized", "exact"])
def test_columns_cost_linear_time(path: str) -> None:
    """Building one table from N lines that each bring a new tag key (the vectorized path, and the exact path's
    `points_to_table`): CPU time per column at 8N within 3x of that at N (quadratic would be about 8x). CPU time
    of this process, so a loaded machine slows both sizes alike."""
    from iox_planner.ingest import files
    from iox_planner.ingest.blocks import text_blocks
    from iox_planner.ingest.lineprotocol import StreamParser, parse
    from iox_planner.ingest.lineprotocol.vectorized import parse_block

    def build(n: int) -> Callable[[], object]:
        text = lines_columns(n + 2)
        if path == "vectorized":
            block = next(iter(text_blocks(text, "t")))

            def run() -> object:
                pieces = parse_block(block.arrow(), StreamParser(default_time=0))
                assert pieces is not None and pieces[0].table.num_columns == n + 3
                return pieces
            return run
        points = parse(text, default_time=0).points
        columns = files.chunk_columns(points)
        return lambda: files.points_to_table(points, columns)

    small, large = 300, 2400
    per_small = _cpu(build(small)) / small
    per_large = _cpu(build(large)) / large
    assert per_large < 3 * per_small, (per_small, per_large)


def test_scatter_places_values() -> None:
    from iox_planner.ingest.arrow_np import scatter, spread_strings

    got = scatter(5, np.array([3, 0]), pa.array([1.5, 2.5]))
    assert got.to_pylist() == [2.5, None, None, 1.5, None]
    assert spread_strings(4, np.array([1, 2]), ["é", "b"]).to_pylist() == [None, "é", "b", None]
    assert spread_strings(2, np.array([0, 1]), ["x", "y"]).to_pylist() == ["x", "y"]


@pytest.mark.spark
def test_bulk_load_on_spark_refused_whole(spark: object, monkeypatch: pytest.MonkeyPatch, catalog: Catalog,
                                          warehouse: Path, db: str, tmp_path: Path) -> None:
    """`write --spark` on the shared session: a load over the partition limit, and one whose files together pass
    the column limit, are refused whole (its staging folder gone too); at the limit it loads."""
    from spark_support import cli

    monkeypatch.setenv("IOX_WRITE_MAX_PARTITIONS", "3")
    monkeypatch.setenv("IOX_TABLE_MAX_COLUMNS", "4")
    (tmp_path / "days").mkdir()
    (tmp_path / "days" / "a.lp").write_text(lines_days(4))
    (tmp_path / "cols").mkdir()
    (tmp_path / "cols" / "a.lp").write_text(lines_columns(3))
    (tmp_path / "cols" / "b.lp").write_text(f"m,k7=v,k8=v f=1 {DAY0}\n")
    snap = Snapshot(catalog, warehouse)
    for folder, needles in (("days", ("IOX_WRITE_MAX_PARTITIONS", "touches 4 partitions")),
                            ("cols", ("IOX_TABLE_MAX_COLUMNS", "5 columns"))):
        done = cli("write", "--spark", "--db", db, str(tmp_path / folder))
        assert done.returncode == 2, done.stderr
        assert all(n in done.stderr for n in needles), done.stderr
        snap.unchanged()
    monkeypatch.setenv("IOX_TABLE_MAX_COLUMNS", "5")
    assert cli("write", "--spark", "--db", db, str(tmp_path / "cols")).returncode == 0
