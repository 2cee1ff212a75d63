"""The output's folder swapped for a link to another folder while the result is written (`mv d d_real; ln -s
elsewhere d`), as the hostile pass of issue 22 did it. The real `iox-batch query --output` process (in-process and
through spark-submit) and the DAGs' commit step (`commit_driver.py`, in a process of its own) are stopped where
their private staging folder is ready and the write starts (IOX_FAULT_PAUSE_AT=publish.before_write), the folder
is swapped, and they are continued. Each must end with one paragraph (no internal error), publish nothing anywhere,
record no publication, leave nothing in the other folder and nothing beside the old output, which stays as it
was. An iox-batch output was published there first, so replacing it would have been allowed."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from fault_support import (DAY0, FULL, IOX, QUERY, FaultWorld, PausedCommand, batch, naive_answer, read_output)
from common_support import assert_one_paragraph_error
from test_fault_query import _in_process
from iox_planner.errors import BadInputError
from iox_planner.ingest.write import write_line_protocol

PAUSE = "publish.before_write"
SWAPPED = "was moved or replaced"
DRIVER = Path(__file__).resolve().parent / "commit_driver.py"
DAY = 86_400_000_000_000
ROLLUP = ("SELECT k, date_trunc('day', time) AS time, count(*) AS samples, max(v) AS vmax FROM m "
          "GROUP BY k, date_trunc('day', time)")


def _snapshot(path: Path) -> Any:
    """What is at `path`, to the inode: a file's inode and bytes, or a folder's inode and each file's."""
    def one(p: Path) -> tuple[int, str]:
        return p.lstat().st_ino, hashlib.sha256(p.read_bytes()).hexdigest()

    if not path.is_dir():
        return one(path)
    return path.lstat().st_ino, {str(p.relative_to(path)): one(p) for p in sorted(path.rglob("*")) if p.is_file()}


def _publications(fw: FaultWorld) -> int:
    with fw.catalog.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM iox_output_publication")).scalar_one())


def _swap(folder: Path, elsewhere: Path) -> Path:
    """`mv folder folder_real; ln -s elsewhere folder`; returns the real folder's new path."""
    real = folder.with_name(folder.name + "_real")
    folder.rename(real)
    folder.symlink_to(elsewhere, target_is_directory=True)
    return real


def _race(argv: list[str], env: dict[str, str], folder: Path, elsewhere: Path) -> tuple[Any, Path]:
    """Run `argv` until it pauses with its staging ready, swap `folder`, continue it to its end."""
    run = PausedCommand(argv, env)
    if not run.wait_stopped():
        outcome = run.finish()
        raise AssertionError(f"the command ended before {PAUSE}: {outcome.stderr[-3000:]}")
    real = _swap(folder, elsewhere)
    run.resume()
    return run.finish(), real


def _assert_nothing_published(outcome: Any, elsewhere: Path, real: Path, name: str, old: Any) -> None:
    assert outcome.returncode not in (0, 70), outcome.stderr[-3000:]
    assert "internal error" not in outcome.stderr, outcome.stderr[-3000:]
    assert_one_paragraph_error(outcome, SWAPPED)
    assert sorted(os.listdir(elsewhere)) == [], "something was written into the other folder"
    # No new output, staging folder, lock or set-aside copy: the old output alone, as it was.
    assert sorted(os.listdir(real)) == [name]
    assert _snapshot(real / name) == old


# CI runs one file format in process and the folder format through spark-submit (each race costs 30-45 s on
# CI's box); the full run (IOX_FAULT_POINTS >= 5) runs every pair.
_FULL_ONLY = pytest.mark.skipif(not FULL, reason="the other formats: full run only (IOX_FAULT_POINTS >= 5)")


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("fmt,runner", [
    ("csv", "in-process"),
    pytest.param("jsonl", "in-process", marks=_FULL_ONLY), pytest.param("parquet", "in-process", marks=_FULL_ONLY),
    ("parquet", "spark-submit")])
def test_query_output_folder_swapped_while_writing(fw: FaultWorld, spark: object, tmp_path: Path, fmt: str,
                                                   runner: str) -> None:
    db = f"race_{uuid.uuid4().hex[:10]}"
    for i in range(3):  # every NULL-able field of QUERY exists before the first query
        write_line_protocol(fw.catalog, db, batch(i))
    folder, elsewhere = tmp_path / "d", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    out = folder / f"result.{fmt}"
    assert _in_process(fw, db, fmt, out) == 0
    old = _snapshot(out)
    old_rows = read_output(out, fmt)
    write_line_protocol(fw.catalog, db, batch(3))  # the new answer differs from the old output
    recorded = _publications(fw)

    outcome, real = _race([IOX, "query", "--db", db, QUERY, "--format", fmt, "--output", str(out)],
                          fw.env(IOX_FAULT_PAUSE_AT=PAUSE, IOX_RUNNER=runner), folder, elsewhere)
    _assert_nothing_published(outcome, elsewhere, real, out.name, old)
    assert _publications(fw) == recorded, "a publication was recorded for what was not published"
    assert read_output(real / out.name, fmt) == old_rows


def _prepare(fw: FaultWorld, db: str, output: Path, fmt: str, register: bool, run_id: str) -> dict[str, Any]:
    """Plan a DAG run and execute its Spark job here (the shared session), as the commit task finds them; returns
    the commit's spec for commit_driver.py."""
    from iox_planner.output import OutputFormat
    from iox_planner.runs.planning import plan
    from iox_planner.runs.request import QueryRequest, RegisterAs
    from iox_planner.runs.settings import RunSettings
    from iox_planner.runs.staging import RunIdentity

    from iox_planner.catalog.publications import CatalogLedger
    from iox_planner.output.publish import publishing_as
    from spark_jobs.launch import InProcessLauncher

    r = {"db": db, "sql": ROLLUP if register else QUERY, "output": str(output), "format": fmt,
         "time_start": DAY0 if register else None, "time_end": DAY0 + DAY if register else None,
         "definition": "race_daily" if register else None, "register_table": "m_daily" if register else None,
         "register_tags": ["k"]}
    request = QueryRequest(db=db, sql=r["sql"], output=output, format=OutputFormat(fmt), time_start=r["time_start"],
                           time_end=r["time_end"], definition=r["definition"],
                           register_as=RegisterAs("m_daily", ("k",)) if register else None)
    identity = RunIdentity("race_dag", run_id)
    outcome = plan(request, identity, RunSettings.from_env())
    assert outcome.merge is None and len(outcome.jobs) == 1
    with publishing_as("race test spark job", CatalogLedger(fw.catalog)):
        # The run's job as the run task runs it; its report is the metrics file the commit step reads.
        InProcessLauncher().run(dataclasses.replace(outcome.jobs[0], warehouse=fw.warehouse))
    return {"request": r, "dag_id": identity.dag_id, "run_id": identity.run_id, "handle": outcome.handle()}


def _run_status(fw: FaultWorld, query_run: int) -> str:
    from iox_planner.catalog import runs

    found = runs.get_run(fw.catalog, query_run)
    assert found is not None
    return str(found["status"])


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("fmt,register", [("jsonl", False), ("parquet", False), ("jsonl", True)])
def test_commit_output_folder_swapped_while_publishing(fw: FaultWorld, spark: object, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch, fmt: str,
                                                       register: bool) -> None:
    """The commit step links (a file) or copies (a folder) the Spark job's result into its staging folder, or with
    `register_as` writes it from the job's Arrow file; the swap comes just before."""
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    monkeypatch.setenv("IOX_OUTPUT_ROOT", str(root))
    folder = root / "d"
    out = folder / ("h.parquet" if fmt == "parquet" else f"h.{fmt}")
    db = f"race_{uuid.uuid4().hex[:10]}"
    for i in range(3):  # every NULL-able field of QUERY exists before the first query
        write_line_protocol(fw.catalog, db, batch(i))
    first = subprocess.run([sys.executable, str(DRIVER), json.dumps(_prepare(fw, db, out, fmt, register, "run-1"))],
                           env=fw.env(), capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    old = _snapshot(out)
    registered = naive_answer(fw, db, "m_daily", ("k", "time")) if register else None
    write_line_protocol(fw.catalog, db, batch(3))
    spec = _prepare(fw, db, out, fmt, register, "run-2")
    recorded = _publications(fw)

    outcome, real = _race([sys.executable, str(DRIVER), json.dumps(spec)], fw.env(IOX_FAULT_PAUSE_AT=PAUSE), folder,
                          elsewhere)
    _assert_nothing_published(outcome, elsewhere, real, out.name, old)
    assert _publications(fw) == recorded, "a publication was recorded for what was not published"
    assert _run_status(fw, spec["handle"]["query_run"]) == "failed"
    if register:
        assert naive_answer(fw, db, "m_daily", ("k", "time")) == registered, "the registered interval changed"


class _Written(Exception):
    """Leaves a stage's block without publishing (nothing was written), carrying what the block found."""


def _stage_for_cluster(output: Path) -> Path:
    from iox_planner.output.publish import staged

    try:
        with staged(output, folder=True) as stage:
            raise _Written(stage.shared_result())
    except _Written as found:
        return Path(found.args[0])


def test_cluster_writers_get_a_name_only_where_nobody_else_can_repoint_it(tmp_path: Path) -> None:
    """A cluster's executors reach the staging folder by name: allowed below folders only this user and root can
    change (a sticky folder such as /tmp included), refused below one others may write in or own. Either way the
    staging folder and lock go with the block."""
    tmp_path.chmod(0o755)
    safe = tmp_path / "safe"
    safe.mkdir(mode=0o755)
    where = _stage_for_cluster(safe / "out.parquet")
    assert where.parent.parent == safe and where.parent.name.startswith(".out.parquet.")
    assert os.listdir(safe) == []

    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "mine").mkdir(mode=0o755)
    assert _stage_for_cluster(sticky / "mine" / "out.parquet").parent.parent == sticky / "mine"

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # others may write, not sticky: anyone could move `inner` and put a link in its place
    (shared / "inner").mkdir(mode=0o755)
    unsafe = [shared / "inner" / "out.parquet", shared / "out.parquet"]
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o755)
        os.chown(theirs, 65534, 65534)  # someone else's folder: its owner may change anything in it
        unsafe.append(theirs / "out.parquet")
    for output in unsafe:
        with pytest.raises(BadInputError, match="redirect the write") as refused:
            _stage_for_cluster(output)
        assert str(output.parent if output.parent.name == "theirs" else shared) in str(refused.value)
        assert [n for n in os.listdir(output.parent) if n.startswith(".")] == [], output


@pytest.mark.slow
@pytest.mark.spark
def test_fanout_part_folder_swapped_while_writing(fw: FaultWorld, tmp_path: Path) -> None:
    """A fan-out part job (`run_parts.py part`, a real process of its own) writes `parts/<k>` through its staging
    folder held open, published by a rename there (`output/publish.py` `staged`): `parts` swapped for a link while
    it writes receives nothing, and the job fails in one paragraph. (It wrote `parts/<k>` by name and removed
    whatever was there with `rmtree` before.)"""
    from iox_planner.catalog.store import CatalogSource
    from iox_planner.planner import plan_query
    from iox_planner.planner.serde import plan_to_json

    db = f"race_{uuid.uuid4().hex[:10]}"
    for i in range(3):  # every NULL-able field of QUERY exists
        write_line_protocol(fw.catalog, db, batch(i))
    plan_file = tmp_path / "part-0.json"
    plan_file.write_text(plan_to_json(plan_query(QUERY, CatalogSource(fw.catalog, db))))
    parts, elsewhere = tmp_path / "parts", tmp_path / "elsewhere"
    parts.mkdir()
    elsewhere.mkdir()
    argv = [sys.executable, str(Path(__file__).resolve().parents[2] / "spark_jobs" / "run_parts.py"), "part",
            "--plan", str(plan_file), "--warehouse", str(fw.warehouse), "--output", str(parts / "0"),
            "--report", str(tmp_path / "part-0.report.json")]
    outcome, real = _race(argv, fw.env(IOX_FAULT_PAUSE_AT=PAUSE, IOX_SPARK_MASTER="local[1]"), parts, elsewhere)
    assert outcome.returncode == BadInputError.exit_code, outcome.stderr[-3000:]
    assert [line for line in outcome.stderr.splitlines() if line.startswith("error: ")][-1].count(SWAPPED) == 1
    assert sorted(os.listdir(elsewhere)) == [], "part files were written into the other folder"
    assert sorted(os.listdir(real)) == [] and not (tmp_path / "part-0.report.json").exists()
