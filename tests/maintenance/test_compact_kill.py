"""A compaction killed with SIGKILL (its whole process group: Python and its Spark JVM) at random moments, then
rerun: the catalog is either as before or fully swapped, never in between; queries give the same rows; the rerun
finishes the work and sweeps the killed run's staged outputs. One kill point is exact: right after the Spark job
wrote the staged outputs, before the swap. `IOX_COMPACT_KILLS` sets how many kills run (default 2 in CI; the
issue's full run is 10 or more), `IOX_COMPACT_KILL_SEED` their seed."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from common_support import free_port, live_chunks
from iox_planner.catalog.store import Catalog
from iox_planner.maintenance.compact.run import compact
from iox_planner.maintenance.compact.settings import CompactSettings
from spark_support import load, run_jsonl
from spark_jobs.compact_job import spark_slice_runner

pytestmark = pytest.mark.spark

KILLS = int(os.environ.get("IOX_COMPACT_KILLS", "2"))
SEED = int(os.environ.get("IOX_COMPACT_KILL_SEED", "0"))
T0, S = 1_704_067_200_000_000_000, 1_000_000_000

SCRIPT = """
import os, signal, sys
from iox_planner.catalog.store import Catalog
from spark_jobs.session import shared_session
from iox_planner.maintenance.compact.run import compact
from iox_planner.maintenance.compact.settings import CompactSettings
from spark_jobs.compact_job import spark_slice_runner

def die():
    os.killpg(os.getpgid(0), signal.SIGKILL)

compact(Catalog(), sys.argv[1], spark_slice_runner(shared_session(), in_driver_rows=0),
        settings=CompactSettings(max_rows=40),
        after_slices=die if sys.argv[2] == "after-slices" else None)
print("finished")
"""


def scenario(rng: random.Random) -> list[dict[str, Any]]:
    """Three overlapping files in each of two days (rewrites of the same points with changed fields)."""
    chunks = []
    for order in range(1, 7):
        day = (order - 1) % 2
        lines = "\n".join(f"m,t=h{i % 3} f={rng.randint(0, 9)} {T0 + day * 86_400 * S + i * S}"
                          for i in range(rng.randint(20, 60)))
        chunks.append({"id": f"F{order}", "kind": "parquet", "order": order, "lines": lines})
    return chunks


def _rows(spark: Any, catalog: Catalog, db: str) -> list[str]:
    return sorted(repr(sorted(r.items())) for r in run_jsonl(spark, catalog, db, "SELECT * FROM m"))


def _state(catalog: Catalog, db: str) -> tuple[frozenset[int], frozenset[int]]:
    """(live L0 file ids, live L1 file ids)."""
    live = [c for c in live_chunks(catalog, db) if c["kind"] == "parquet"]
    return (frozenset(c["id"] for c in live if c["compaction_level"] == 0),
            frozenset(c["id"] for c in live if c["compaction_level"] == 1))


def _partition_files(catalog: Catalog, db: str, warehouse: Path) -> tuple[set[str], set[str]]:
    """(files in the database's partition folders, paths the catalog names, live or retired)."""
    with catalog.engine.connect() as conn:
        named = set(conn.execute(sa.text(
            "SELECT f.path FROM iox_parquet_file f JOIN iox_table t ON t.id = f.table_id "
            "JOIN iox_database d ON d.id = t.database_id WHERE d.name = :db").bindparams(db=db)).scalars())
        db_id = conn.execute(sa.text("SELECT id FROM iox_database WHERE name = :db").bindparams(db=db)).scalar_one()
    on_disk = {str(p.relative_to(warehouse)) for p in (warehouse / str(db_id)).rglob("*") if p.is_file()}
    return on_disk, named


@pytest.mark.parametrize("kill", range(KILLS), ids=lambda k: f"kill={k}")
def test_killed_compaction_then_rerun(spark: Any, catalog: Catalog, db: str, warehouse: Path, kill: int) -> None:
    rng = random.Random(SEED * 1000 + kill)
    load(catalog, db, scenario(rng))
    before_rows = _rows(spark, catalog, db)
    before = _state(catalog, db)
    point = "after-slices" if kill % 2 == 0 else "random"
    moment = "after the Spark job, before the swap"
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, db, point], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=os.environ.copy())
    if point == "random":
        # Somewhere in start-up, planning, the Spark job or the swap (a whole run takes 10 to 40 s here).
        wait = rng.uniform(2.0, 30.0)
        moment = f"{wait:.1f} s after start"
        try:
            proc.wait(timeout=wait)
            moment += " (it had finished)"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=600)
    finished = "finished" in out
    assert proc.returncode in (0, -signal.SIGKILL), err[-2000:]
    after = _state(catalog, db)
    # Atomic: as before, or every L0 file replaced by L1 files; never some of it.
    swapped = after[0] == frozenset() and after[1]
    assert after == before or swapped, (point, before, after)
    assert _rows(spark, catalog, db) == before_rows
    if point == "after-slices":
        assert not finished and after == before
        on_disk, named = _partition_files(catalog, db, warehouse)
        assert [p for p in on_disk - named if p.endswith(".compacted.parquet")], "the kill left no staged output"
    on_disk, named = _partition_files(catalog, db, warehouse)
    strays = len(on_disk - named)
    # The rerun finishes the work and sweeps the killed run's strays (no other compactor runs: the lock is free).
    compact(catalog, db, spark_slice_runner(spark, in_driver_rows=0), warehouse=warehouse,
            settings=CompactSettings(max_rows=40))
    final = _state(catalog, db)
    assert final[0] == frozenset() and final[1]
    assert _rows(spark, catalog, db) == before_rows
    on_disk, named = _partition_files(catalog, db, warehouse)
    assert on_disk == named, on_disk ^ named
    print(f"kill {kill}: {moment}; catalog {'swapped' if after != before else 'as before'}; rows equal; "
          f"{strays} stray file(s) left by the kill, swept by the rerun, which compacted")


def test_the_spark_submit_job_exits_75_when_the_catalog_is_unreachable(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A real spark-submit of `run_compact.py` against a catalog URL where no Postgres listens (a port just freed):
    exit 75, the retryable status every other entry point gives a lost catalog, so the DAG's retries are meant;
    one `error: ` paragraph, no traceback, no report."""
    from iox_planner.spark.conf import spark_env
    from iox_planner.spark.jobs import CompactJob
    from iox_planner.spark.launch import SubmitLauncher

    port = free_port()
    monkeypatch.setenv("IOX_CATALOG_URL", f"postgresql+psycopg2://iox@127.0.0.1:{port}/iox")
    monkeypatch.setenv("IOX_SPARK_MASTER", "local[1]")
    report = tmp_path / "report.json"
    command = SubmitLauncher().command(CompactJob(report=report, targets=(("somedb", (1,)),)))
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **spark_env()}, timeout=300)
    output = done.stdout + done.stderr
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert done.returncode == 75, output[-3000:]
    assert len(errors) == 1 and "cannot reach the catalog" in errors[0] and f":{port}/" in errors[0], output[-3000:]
    assert "Traceback" not in output and not report.exists()
