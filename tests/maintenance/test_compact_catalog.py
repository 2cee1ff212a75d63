"""Compaction's catalog side without Spark: the order-trap closure on catalog rows, the partition compaction lock,
and the sweep of stray compaction outputs (which persist runs too)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Sequence

import pytest
import sqlalchemy as sa

from iox_planner.catalog.store import Catalog, ChunkRow
from iox_planner.errors import BadInputError
from iox_planner.ingest.compact import (CompactSettings, PartitionPlan, SliceResult, SliceTask, close_inputs, compact,
                                        compact_slice, describe_plan, dry_run)
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


def test_the_arrow_dedup_treats_a_repeated_dictionary_value_as_one_tag() -> None:
    """A dictionary may hold a value twice (`unify_dictionaries` leaves a single chunk's as it is): the two rows
    below are one key, the later write wins, and the merged row sorts as its value does."""
    import numpy as np
    import pyarrow as pa

    from iox_planner.ingest.dedup import deduplicate_table

    host = pa.DictionaryArray.from_arrays(pa.array([0, 2, 1], pa.int32()), pa.array(["b", "a", "b"]))
    table = pa.table({"host": host, "time": [5, 5, 5], "v": [1, 2, 3]})
    merged, order = deduplicate_table(table, ["host", "time"], np.array([10, 30, 20]))
    assert [(r["host"], r["v"]) for r in merged.to_pylist()] == [("a", 3), ("b", 2)]
    assert order.tolist() == [20, 30]


# --- promotion: L0 files overlapping nothing become L1 in place ----------------------------------------------------

H = 3_600_000_000_000  # one hour in ns


def _hours_with_late_writes(catalog: Catalog, db: str) -> None:
    """Hourly files F0..F5 (orders 1..6) and late writes L1x, L4x (orders 7, 8) of hours 1 and 4: the shape of a
    day where two hours were rewritten. Hours 2 and 3 lie between the rewritten hours in time AND in order."""
    chunks = [{"id": f"F{h}", "kind": "parquet", "order": h + 1,
               "lines": f"m,t=a f={h} {T0 + h * H}\nm,t=b f={h} {T0 + h * H + H // 2}"} for h in range(6)]
    chunks += [{"id": "L1x", "kind": "parquet", "order": 7, "lines": f"m,t=a f=100 {T0 + 1 * H}"},
               {"id": "L4x", "kind": "parquet", "order": 8, "lines": f"m,t=b f=400 {T0 + 4 * H + H // 2}"},
               {"id": "I9", "kind": "ingester", "order": 9, "lines": f"m,t=c f=9 {T0 + 2 * H}"}]
    load_scenario(catalog, parse_scenario({"chunks": chunks}), db)


def _files(catalog: Catalog, db: str) -> dict[str, tuple[str, int, int]]:
    """Live Parquet files by label: (path, order, level), read straight from the catalog table."""
    with catalog.engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT f.label, f.id, f.path, f.chunk_order, f.compaction_level FROM iox_parquet_file f "
            "JOIN iox_table t ON t.id = f.table_id JOIN iox_database d ON d.id = t.database_id "
            "WHERE d.name = :db AND f.to_delete IS NULL").bindparams(db=db)).all()
    return {r.label or f"P{r.id}": (r.path, r.chunk_order, r.compaction_level) for r in rows}


def _in_process(tasks: Sequence[SliceTask], root: Path) -> list[SliceResult]:
    """The slices merged by the real slice code in this process (no Spark: the catalog side is under test)."""
    return [compact_slice(t, str(root)) for t in tasks]


def test_files_overlapping_nothing_are_promoted_in_place_and_the_rest_rewritten(catalog: Catalog, db: str,
                                                                               warehouse: Path) -> None:
    _hours_with_late_writes(catalog, db)
    before = _files(catalog, db)
    [plan] = dry_run(catalog, db, settings=CompactSettings())
    assert isinstance(plan, PartitionPlan)
    # Two independent rewrite groups; hours 2 and 3 (orders between) are not pulled in: they overlap neither.
    assert sorted(c.display_id for c in plan.inputs) == ["F1", "F4", "L1x", "L4x"]
    assert sorted(c.display_id for c in plan.promoted) == ["F0", "F2", "F3", "F5"]
    text = "\n".join(describe_plan(plan))
    assert "promote F2 L0 -> L1" in text and "overlaps no other file" in text and "overlaps another file" in text
    assert _files(catalog, db) == before  # the dry run changed nothing
    on_disk_before = set(warehouse.rglob("*.parquet"))

    report = compact(catalog, db, _in_process, warehouse=warehouse, settings=CompactSettings())
    t = report.totals()
    assert (t["files_in"], t["files_out"], t["rows_in"], t["rows_out"]) == (4, 2, 6, 4)
    assert (t["files_promoted"], t["rows_promoted"]) == (4, 8)
    after = _files(catalog, db)
    for label in ("F0", "F2", "F3", "F5"):  # same file, same order, now L1
        assert after[label] == (before[label][0], before[label][1], 1), label
    for label in ("F1", "F4", "L1x", "L4x"):
        assert label not in after
    new = {k: v for k, v in after.items() if k not in before}
    # Each group's output takes its own group's newest order (7 for hour 1, 8 for hour 4).
    assert sorted((v[1], v[2]) for v in new.values()) == [(7, 1), (8, 1)]
    written = set(warehouse.rglob("*.parquet")) - on_disk_before
    assert {warehouse / v[0] for v in new.values()} == written  # the two outputs: promotion wrote no file
    # The level invariant, checked on the catalog's own ranges.
    with catalog.engine.connect() as conn:
        ranges = sorted(conn.execute(sa.text(
            "SELECT f.min_time, f.max_time FROM iox_parquet_file f JOIN iox_table t ON t.id = f.table_id "
            "JOIN iox_database d ON d.id = t.database_id WHERE d.name = :db AND f.to_delete IS NULL "
            "AND f.compaction_level = 1").bindparams(db=db)).all())
    assert len(ranges) == 6 and all(a[1] < b[0] for a, b in zip(ranges, ranges[1:]))
    assert not compact(catalog, db, _in_process, warehouse=warehouse, settings=CompactSettings()).outcomes


def test_a_partition_needing_only_promotions_runs_no_spark_job(catalog: Catalog, db: str, warehouse: Path) -> None:
    load_scenario(catalog, parse_scenario({"chunks": [
        {"id": "F1", "kind": "parquet", "order": 1, "lines": f"m,t=a f=1 {T0}"},
        {"id": "F2", "kind": "parquet", "order": 2, "lines": f"m,t=a f=2 {T0 + H}"},
    ]}), db)
    before = _files(catalog, db)

    def no_spark(tasks: Sequence[SliceTask], root: Path) -> list[SliceResult]:
        assert not tasks, "a promotion started a Spark job"
        return []

    report = compact(catalog, db, no_spark, warehouse=warehouse, settings=CompactSettings())
    assert report.totals()["files_promoted"] == 2 and report.totals()["files_in"] == 0
    assert _files(catalog, db) == {k: (p, o, 1) for k, (p, o, _) in before.items()}


def test_a_promoted_file_retired_meanwhile_makes_the_swap_skip(catalog: Catalog, db: str, warehouse: Path) -> None:
    """A persist or compaction that retires a file to promote between planning and the swap (here: the file is
    retired by hand after the slices ran): the swap changes nothing, neither promotions nor the rewrite."""
    _hours_with_late_writes(catalog, db)
    before = _files(catalog, db)
    staged = set(warehouse.rglob("*.compacted.parquet"))  # the warehouse is the worker's: earlier tests' outputs

    def retire_f2() -> None:
        with catalog.engine.begin() as conn:
            conn.execute(sa.text("UPDATE iox_parquet_file SET to_delete = now() WHERE label = 'F2' AND table_id IN "
                                 "(SELECT t.id FROM iox_table t JOIN iox_database d ON d.id = t.database_id "
                                 "WHERE d.name = :db)").bindparams(db=db))

    report = compact(catalog, db, _in_process, warehouse=warehouse, settings=CompactSettings(),
                     after_slices=retire_f2)
    assert not report.compacted and "F2" in (report.outcomes[0].skipped or "")
    del before["F2"]
    assert _files(catalog, db) == before  # every other file as it was: still L0, still live
    assert set(warehouse.rglob("*.compacted.parquet")) == staged  # this run's staged outputs were removed


def test_a_promotions_only_run_promotes_and_leaves_the_rewrite_waiting(catalog: Catalog, db: str,
                                                                      warehouse: Path) -> None:
    """`compact(rewrites=False)` (the DAG's batch without Spark, when a persist made a rewrite needed since the
    batch was planned): the files overlapping nothing become L1, the files to rewrite stay as they were, the
    report says the rewrite waits; a later run with rewrites does the rest."""
    _hours_with_late_writes(catalog, db)
    before = _files(catalog, db)

    def no_spark(tasks: Sequence[SliceTask], root: Path) -> list[SliceResult]:
        assert not tasks, "a promotions-only run planned a rewrite"
        return []

    report = compact(catalog, db, no_spark, warehouse=warehouse, settings=CompactSettings(), rewrites=False)
    [outcome] = report.outcomes
    assert outcome.skipped is None and outcome.waits and "promotions only" in outcome.waits
    assert (outcome.files_in, outcome.files_promoted) == (0, 4)
    after = _files(catalog, db)
    assert after == {k: (p, o, 1 if k in ("F0", "F2", "F3", "F5") else lvl) for k, (p, o, lvl) in before.items()}
    rest = compact(catalog, db, _in_process, warehouse=warehouse, settings=CompactSettings())
    assert rest.totals()["files_in"] == 4 and rest.totals()["files_promoted"] == 0


def test_a_trapped_rewrite_waits_and_its_promotions_go_ahead(catalog: Catalog, db: str, warehouse: Path) -> None:
    """F1 and F3 overlap with ingester chunk I2 between their orders (the trap): they wait, while F4, which
    overlaps nothing, is promoted; the dry run and the report both say the rewrite waits and why."""
    load_scenario(catalog, parse_scenario({"chunks": [
        {"id": "F1", "kind": "parquet", "order": 1, "lines": f"m,t=a f=1 {T0}"},
        {"id": "I2", "kind": "ingester", "order": 2, "lines": f"m,t=a f=2 {T0}"},
        {"id": "F3", "kind": "parquet", "order": 3, "lines": f"m,t=a f=3 {T0}"},
        {"id": "F4", "kind": "parquet", "order": 4, "lines": f"m,t=a f=4 {T0 + H}"},
    ]}), db)
    before = _files(catalog, db)
    [plan] = dry_run(catalog, db, settings=CompactSettings())
    assert isinstance(plan, PartitionPlan) and not plan.inputs and [c.display_id for c in plan.promoted] == ["F4"]
    assert "the rewrite waits: ingester chunk I2" in "\n".join(describe_plan(plan))
    report = compact(catalog, db, _in_process, warehouse=warehouse, settings=CompactSettings())
    [outcome] = report.outcomes
    assert outcome.skipped is None and "ingester chunk I2" in (outcome.waits or "") and outcome.files_promoted == 1
    assert _files(catalog, db) == {**before, "F4": (before["F4"][0], 4, 1)}
