"""Compaction on an `s3://` warehouse, against the real S3 API server of the suite (`tests/s3_support.py`): the
files a compaction leaves hold exactly the independent oracle's rows (`fuzz_support.Scenario.rows`), and the same
rows as the same compaction of a local warehouse; merged by Spark's Python workers (each reading the store itself)
or in the driver. The store cut mid-compaction ends in the retryable error with nothing registered; a compaction
killed at a kill point leaves only objects no catalog row names; no Parquet file lands on the local disk.

CI runs a few sampled cases (`common_support.sampled`); IOX_TEST_ALL=1 runs them all."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

import fuzz_support as fz
from common_support import catalog_counts, free_port, live_chunks, run_cli, sampled
from iox_planner.catalog.store import Catalog
from iox_planner.errors import StoreUnavailableError
from iox_planner.maintenance.compact.run import compact
from iox_planner.maintenance.compact.settings import CompactSettings
from iox_planner.maintenance.compact.slices import SliceResult, SliceTask, compact_slice
from iox_planner.objectstore import Root, local_root, parse_root
from s3_support import CuttableProxy, local_parquet_files
from spark_jobs.compact_job import spark_slice_runner
from spark_support import load
from test_compact import oracle_rows, random_scenario

pytestmark = pytest.mark.spark

COLD = CompactSettings(cold_seconds=0, target_rows=4, max_rows=3)
"""Everything rewritten (cold), in several time slices (a tiny row budget)."""


def parquet_only(sc: fz.Scenario) -> fz.Scenario:
    """The scenario with every chunk a Parquet file: a cold compaction then leaves compacted files only, whose rows
    are the whole table's."""
    return fz.Scenario(tuple(fz.ChunkSpec(c.id, "parquet", c.order, c.points) for c in sc.chunks))


def object_rows(root: Root, chunks: Sequence[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The rows of live files, read straight from their objects (no planner, no Spark, no code under test)."""
    out = []
    for c in chunks:
        table = pq.read_table(pa.BufferReader(root.read_bytes(c["path"])))
        for r in table.to_pylist():
            out.append((r.get("t1"), r.get("t2"), fz._norm(r.get("f")), r.get("g"), r.get("s"), r["time"]))
    return sorted(out, key=repr)


def named_paths(catalog: Catalog) -> set[str]:
    """Every path a catalog row names, live or retired."""
    with catalog.engine.connect() as conn:
        return {p for t in ("iox_parquet_file", "iox_ingester_chunk")
                for p in conn.execute(sa.text(f"SELECT path FROM {t}")).scalars()}


def stored(root: Root) -> set[str]:
    return {o.rel for o in root.list()}


def in_driver(tasks: Sequence[SliceTask], root: Root) -> list[SliceResult]:
    return [compact_slice(t, root.uri) for t in tasks]


CASES = sampled([(seed, "spark" if seed % 2 == 0 else "driver") for seed in range(8)], 2)


@pytest.mark.parametrize("seed,where", CASES, ids=lambda c: str(c))
def test_compaction_on_the_store_gives_the_oracles_rows_and_the_local_ones(
        spark: Any, catalog: Catalog, db: str, tmp_path: Path, s3_warehouse: str, monkeypatch: pytest.MonkeyPatch,
        seed: int, where: str) -> None:
    sc = parquet_only(random_scenario(random.Random(seed)))
    root = parse_root(s3_warehouse)
    local = local_root(tmp_path / "wh")
    local_db = f"{db}_local"
    load(catalog, db, sc.entries())
    runner = spark_slice_runner(spark, in_driver_rows=0) if where == "spark" else in_driver
    report = compact(catalog, db, runner, warehouse=root, settings=COLD)
    assert report.totals()["files_out"] > 0, report.totals()
    chunks = live_chunks(catalog, db)
    assert chunks and all(c["kind"] == "parquet" and c["compaction_level"] > 0 for c in chunks), chunks
    assert any(c["path"].endswith(".compacted.parquet") for c in chunks)
    assert object_rows(root, chunks) == oracle_rows(sc), sc.describe()
    # Every input object is still there (retired files go only after the grace period); every output is one.
    assert {c["path"] for c in chunks} <= stored(root)

    # The same scenario, the same compaction, on a local warehouse: the same files' rows, slice by slice.
    monkeypatch.setenv("IOX_WAREHOUSE", local.uri)
    load(catalog, local_db, sc.entries())
    compact(catalog, local_db, in_driver, warehouse=local, settings=COLD)
    here = live_chunks(catalog, local_db)
    assert [(c["min_time"], c["max_time"], c["row_count"], c["chunk_order"]) for c in here] == \
           [(c["min_time"], c["max_time"], c["row_count"], c["chunk_order"]) for c in chunks]
    assert object_rows(local, here) == object_rows(root, chunks)


def test_no_parquet_file_on_the_local_disk(spark: Any, catalog: Catalog, db: str, s3_warehouse: str,
                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    """Loaded, then compacted by Spark's workers (a file shared by several slices is split through scratch Arrow
    files, never Parquet): nothing `*.parquet` appears in this worker's temporary folders or Spark's."""
    places = [tmp_path_factory.getbasetemp(), *Path(tempfile.gettempdir()).glob("spark-*"),
              *Path(tempfile.gettempdir()).glob("iox-*")]
    before = set(local_parquet_files(*places))
    sc = parquet_only(random_scenario(random.Random(3)))
    load(catalog, db, sc.entries())
    compact(catalog, db, spark_slice_runner(spark, in_driver_rows=0), settings=COLD)
    assert [c for c in live_chunks(catalog, db) if c["compaction_level"] > 0]
    places = [tmp_path_factory.getbasetemp(), *Path(tempfile.gettempdir()).glob("spark-*"),
              *Path(tempfile.gettempdir()).glob("iox-*")]
    assert set(local_parquet_files(*places)) - before == set()


def test_the_store_cut_mid_compaction_is_the_retryable_error_and_registers_nothing(
        catalog: Catalog, db: str, s3_warehouse: str, s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    sc = parquet_only(random_scenario(random.Random(5)))
    load(catalog, db, sc.entries())
    before = (live_chunks(catalog, db), catalog_counts(catalog))
    proxy = CuttableProxy(s3_server.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)  # this process's filesystem goes through the proxy
    root = parse_root(s3_warehouse)
    outputs: list[str] = []

    def cut_after_the_first_slice(tasks: Sequence[SliceTask], warehouse: Root) -> list[SliceResult]:
        assert len(tasks) > 1, "one slice: nothing to cut between"
        first = compact_slice(tasks[0], warehouse.uri)
        outputs.append(first.output)
        proxy.cut()
        return [first, *(compact_slice(t, warehouse.uri) for t in tasks[1:])]

    try:
        with pytest.raises(StoreUnavailableError) as raised:
            compact(catalog, db, cut_after_the_first_slice, warehouse=root, settings=COLD)
        assert raised.value.exit_code == 75
        assert "the object store did not answer" in str(raised.value) and s3_warehouse in str(raised.value)
        assert "Traceback" not in str(raised.value) and "SECRET" not in str(raised.value).upper()
        assert (live_chunks(catalog, db), catalog_counts(catalog)) == before, "a cut compaction registered"
    finally:
        proxy.restore()
    # What the first slice put is no row's: the sweep's to remove after the grace period.
    left = stored(root) - named_paths(catalog)
    assert left <= set(outputs) and all(p.endswith(".compacted.parquet") for p in left), left
    # The store back, the same compaction finishes the work.
    compact(catalog, db, in_driver, warehouse=root, settings=COLD)
    chunks = live_chunks(catalog, db)
    assert object_rows(root, chunks) == oracle_rows(sc)
    proxy.stop()


KILL_SCRIPT = """
import sys
from iox_planner.catalog.store import Catalog
from iox_planner.maintenance.compact.run import compact
from iox_planner.maintenance.compact.settings import CompactSettings
from iox_planner.maintenance.compact.slices import compact_slice

compact(Catalog(), sys.argv[1], lambda tasks, root: [compact_slice(t, root.uri) for t in tasks],
        settings=CompactSettings(cold_seconds=0, target_rows=4, max_rows=3))
print("finished")
"""


@pytest.mark.parametrize("point", sampled(["compact.before_swap", "compact.before_commit"], 1))
def test_a_compaction_killed_on_the_store_leaves_only_unreferenced_objects(catalog: Catalog, db: str,
                                                                          s3_warehouse: str, point: str) -> None:
    sc = parquet_only(random_scenario(random.Random(11)))
    load(catalog, db, sc.entries())
    root = parse_root(s3_warehouse)
    before = (live_chunks(catalog, db), catalog_counts(catalog), stored(root))
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, db], env={**os.environ, "IOX_FAULT_KILL_AT": point},
                          capture_output=True, text=True, timeout=300, start_new_session=True)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr[-2000:]
    assert (live_chunks(catalog, db), catalog_counts(catalog)) == before[:2], "a killed compaction registered"
    left = stored(root) - before[2]
    assert left, f"nothing was put before {point}"
    assert not left & named_paths(catalog) and all(p.endswith(".compacted.parquet") for p in left), left
    # A rerun compacts, and leaves the killed run's objects to the sweep (no row names them).
    compact(catalog, db, in_driver, warehouse=root, settings=COLD)
    assert object_rows(root, live_chunks(catalog, db)) == oracle_rows(sc)
    assert not left & named_paths(catalog)


def test_the_cli_compacts_on_the_store_and_exits_75_when_it_is_gone(catalog: Catalog, db: str,
                                                                     s3_warehouse: str) -> None:
    """`iox-batch compact` as a user runs it (few rows: merged in its own process, no JVM): with the store gone,
    exit 75 and one `error:` paragraph naming the warehouse, nothing registered; with it back, the work done."""
    sc = parquet_only(random_scenario(random.Random(13)))
    load(catalog, db, sc.entries())
    before = live_chunks(catalog, db)
    cold = {"IOX_COMPACT_COLD_SECONDS": "0"}  # everything rewritten: the files then hold the oracle's rows
    gone = {**cold, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    done = run_cli("compact", "--db", db, env=gone)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 75, done.stderr[-2000:]
    assert len(errors) == 1 and s3_warehouse in errors[0] and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert live_chunks(catalog, db) == before
    done = run_cli("compact", "--db", db, env=cold)
    assert done.returncode == 0, done.stderr[-2000:]
    after = live_chunks(catalog, db)
    assert after and all(c["compaction_level"] > 0 for c in after), after
    assert object_rows(parse_root(s3_warehouse), after) == oracle_rows(sc)
