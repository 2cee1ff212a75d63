"""Compaction's catalog side without Spark: the order-trap closure on catalog rows, the partition compaction lock,
and the sweep of stray compaction outputs (which persist runs too)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from iox_planner.catalog.store import Catalog, ChunkRow
from iox_planner.errors import BadInputError
from iox_planner.ingest.compact import CompactSettings, close_inputs, dry_run
from iox_planner.ingest.persist import persist, sweep_compaction_strays
from iox_planner.ingest.scenario import load_scenario, parse_scenario
from iox_planner.ingest.write import write_line_protocol
from iox_planner.model import ChunkKind

T0 = 1_704_067_200_000_000_000


def row(kind: ChunkKind, cid: int, order: int, lo: int, hi: int, level: int = 0) -> ChunkRow:
    return ChunkRow(kind, cid, None, "m", 1, "2024-01-01", 1, "file://", f"{cid}.parquet", lo, hi, 1, 1, ("time",),
                    {}, order, ("time",), level)


P, I = ChunkKind.PARQUET, ChunkKind.INGESTER


def test_closure_pulls_in_files_between_and_of_the_output_level_and_stops_on_ingester_chunks() -> None:
    a, b = row(P, 1, 1, 0, 10), row(P, 2, 5, 5, 20)
    between_far = row(P, 3, 3, 100, 200, level=2)  # between in order, but no time overlap: stays out
    between = row(P, 4, 4, 15, 30, level=2)  # between and overlapping: joins, and widens the range to 30
    same_level = row(P, 5, 9, 25, 40, level=1)  # an L1 overlapping the widened range: joins (outputs are L1)
    newer_l2 = row(P, 6, 8, 0, 5, level=2)  # newer than the seeds, but the L1 of order 9 joins: then it is between
    chosen = close_inputs([a, b], [a, b, between_far, between, same_level, newer_l2], level=1)
    assert not isinstance(chosen, str)
    assert [c.id for c in chosen] == [1, 4, 2, 6, 5]
    # Without that L1, a newer L2 stays out (it overrides the merged output as it overrode the inputs).
    chosen = close_inputs([a, b], [a, b, between_far, between, newer_l2], level=1)
    assert not isinstance(chosen, str) and [c.id for c in chosen] == [1, 4, 2]
    # Once the L1 of order 9 joined, the L2 of order 8 lies between the inputs' orders and overlaps: it joins too.
    touching = row(P, 5, 9, 18, 40, level=1)
    chosen = close_inputs([a, b], [a, b, touching, row(P, 7, 8, 38, 50, level=2)], level=1)
    assert not isinstance(chosen, str) and [c.id for c in chosen] == [1, 2, 7, 5]
    refused = close_inputs([a, b], [a, b, row(I, 1, 3, 9, 9)], level=1)
    assert isinstance(refused, str) and "ingester chunk I1 (order 3)" in refused
    assert not isinstance(close_inputs([a, b], [a, b, row(I, 1, 6, 9, 9)], level=1), str)


def test_the_compaction_lock_is_held_by_one_session_at_a_time(catalog: Catalog) -> None:
    pid = 987_654_321
    with catalog.engine.connect() as one, catalog.engine.connect() as two:
        assert catalog.try_lock_compaction(one, pid)
        assert not catalog.try_lock_compaction(two, pid)
        catalog.unlock_compaction(one, pid)
        assert catalog.try_lock_compaction(two, pid)
        catalog.unlock_compaction(two, pid)


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
        assert catalog.try_lock_compaction(holder, pid)
        # A compaction holds the partition: its staged outputs are not strays.
        assert sweep_compaction_strays(catalog, warehouse, [pid]) == 0 and stray.exists()
        catalog.unlock_compaction(holder, pid)
    write_line_protocol(catalog, db, f"m,t=a f=2 {T0}")
    persist(catalog, db, warehouse=warehouse)
    assert not stray.exists() and not stray_tmp.exists() and other.exists()
    with catalog.engine.connect() as conn:
        named = set(conn.execute(sa.text("SELECT path FROM iox_parquet_file WHERE partition_id = :p")
                                 .bindparams(p=pid)).scalars())
    assert all((warehouse / p).exists() for p in named)


def test_settings_from_env_refuse_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOX_COMPACT_MAX_ROWS", "0")
    with pytest.raises(BadInputError, match="IOX_COMPACT_MAX_ROWS"):
        CompactSettings.from_env()
    monkeypatch.setenv("IOX_COMPACT_MAX_ROWS", "1_000")
    assert CompactSettings.from_env().max_rows == 1000


def test_dry_run_reports_a_partition_waiting_for_persist(catalog: Catalog, db: str) -> None:
    load_scenario(catalog, parse_scenario({"chunks": [
        {"id": "F1", "kind": "parquet", "order": 1, "lines": f"m,t=a f=1 {T0}"},
        {"id": "I2", "kind": "ingester", "order": 2, "lines": f"m,t=a f=2 {T0}"},
        {"id": "F3", "kind": "parquet", "order": 3, "lines": f"m,t=a f=3 {T0}"},
    ]}), db)
    [item] = dry_run(catalog, db, settings=CompactSettings())
    assert "ingester chunk I2" in getattr(item, "reason")


def test_the_arrow_dedup_sorts_on_the_keys_given_and_takes_an_all_null_tag() -> None:
    """Tags are ranked by their sorted dictionary (NULL first), so the merged rows come out in key order; a tag
    whose values are all NULL has an empty dictionary (this broke a query once)."""
    import numpy as np
    import pyarrow as pa

    from iox_planner.ingest.dedup import deduplicate_table

    table = pa.table({"t": pa.array(["b", None, "a", "b", "a"]), "u": pa.array([None] * 5, pa.string()),
                      "time": [2, 1, 1, 1, 1], "f": [1.0, 2.0, 3.0, None, 4.0]})
    merged, _ = deduplicate_table(table, ["t", "u", "time"], np.arange(5))
    assert merged.to_pylist() == [
        {"t": None, "u": None, "time": 1, "f": 2.0}, {"t": "a", "u": None, "time": 1, "f": 4.0},
        {"t": "b", "u": None, "time": 1, "f": None}, {"t": "b", "u": None, "time": 2, "f": 1.0}]
    merged, _ = deduplicate_table(table, ["time", "t", "u"], np.arange(5))
    assert [(r["time"], r["t"]) for r in merged.to_pylist()] == [(1, None), (1, "a"), (1, "b"), (2, "b")]
