"""Compaction's catalog side without Spark: the order-trap closure on catalog rows, settings, the dry run, and
promotions with the real slice code run in this process."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pytest
import sqlalchemy as sa

from common_support import assert_one_paragraph_error, run_cli
from iox_planner.catalog.store import Catalog, ChunkRow
from iox_planner.errors import BadInputError
from iox_planner.ingest.scenario import load_scenario, parse_scenario
from iox_planner.maintenance.compact.plan import PartitionPlan, close_inputs, dry_run
from iox_planner.maintenance.compact.report import describe_plan
from iox_planner.maintenance.compact.run import compact
from iox_planner.maintenance.compact.settings import CompactSettings
from iox_planner.objectstore import Root
from iox_planner.maintenance.compact.slices import SliceResult, SliceTask, bundles, compact_slice
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


def test_settings_from_env_refuse_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOX_COMPACT_MAX_ROWS", "0")
    with pytest.raises(BadInputError, match="IOX_COMPACT_MAX_ROWS"):
        CompactSettings.from_env()
    monkeypatch.setenv("IOX_COMPACT_MAX_ROWS", "1_000")
    assert CompactSettings.from_env().max_rows == 1000


@pytest.mark.parametrize("partition", ["2024-02-30", "2023-02-29", "2024-04-31", "2024-13-01", "2024-00-10",
                                       "2024-01-00", "0000-01-01", "2024-1-01", "20240101", "2024-W01-1",
                                       "\u0662\u0660\u0662\u0664-01-01", "2024-01-01 ", "2024-01-01T00"])
def test_a_partition_must_be_a_calendar_day(catalog: Catalog, db: str, warehouse: Path, partition: str) -> None:
    """Checked by the library (the CLI, the spark-submit job and the DAG's batches all go through it), before
    anything is locked or read: one paragraph, nothing changed."""
    load_scenario(catalog, parse_scenario({"chunks": [
        {"id": "F1", "kind": "parquet", "order": 1, "lines": f"m,t=a f=1 {T0}"},
        {"id": "F2", "kind": "parquet", "order": 2, "lines": f"m,t=a f=2 {T0}"}]}), db)
    with pytest.raises(BadInputError, match="--partition .* is not a (UTC calendar day|partition key)") as err:
        dry_run(catalog, db, partition=partition)
    assert "\n" not in str(err.value)
    with pytest.raises(BadInputError, match="--partition"):
        compact(catalog, db, _in_process, partition=partition, warehouse=warehouse, settings=CompactSettings())
    assert sorted(_files(catalog, db)) == ["F1", "F2"] and all(lv == 0 for _, _, lv in _files(catalog, db).values())


def test_a_real_day_is_a_partition_even_the_29th_of_february(catalog: Catalog, db: str) -> None:
    leap = 1_709_164_800_000_000_000  # 2024-02-29T00:00:00Z
    load_scenario(catalog, parse_scenario({"chunks": [
        {"id": "F1", "kind": "parquet", "order": 1, "lines": f"m,t=a f=1 {leap}"},
        {"id": "F2", "kind": "parquet", "order": 2, "lines": f"m,t=a f=2 {leap}"}]}), db)
    [plan] = dry_run(catalog, db, partition="2024-02-29", settings=CompactSettings())
    assert isinstance(plan, PartitionPlan) and plan.partition == "2024-02-29"
    assert dry_run(catalog, db, partition="2024-02-28", settings=CompactSettings()) == []


def test_the_cli_refuses_a_day_that_does_not_exist(catalog: Catalog, db: str) -> None:
    load_scenario(catalog, parse_scenario({"chunks": [
        {"id": "F1", "kind": "parquet", "order": 1, "lines": f"m,t=a f=1 {T0}"}]}), db)
    for extra in (["--dry-run"], []):
        result = run_cli("compact", "--db", db, "--partition", "2024-02-30", *extra)
        assert_one_paragraph_error(result, "2024-02-30", "calendar day")


def test_dry_run_reports_a_partition_waiting_for_persist(catalog: Catalog, db: str) -> None:
    load_scenario(catalog, parse_scenario({"chunks": [
        {"id": "F1", "kind": "parquet", "order": 1, "lines": f"m,t=a f=1 {T0}"},
        {"id": "I2", "kind": "ingester", "order": 2, "lines": f"m,t=a f=2 {T0}"},
        {"id": "F3", "kind": "parquet", "order": 3, "lines": f"m,t=a f=3 {T0}"},
    ]}), db)
    [item] = dry_run(catalog, db, settings=CompactSettings())
    assert "ingester chunk I2" in getattr(item, "reason")


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


def _in_process(tasks: Sequence[SliceTask], root: Root) -> list[SliceResult]:
    """The slices merged by the real slice code in this process (no Spark: the catalog side is under test)."""
    return [compact_slice(t, root.uri) for t in tasks]


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

    def no_spark(tasks: Sequence[SliceTask], root: Root) -> list[SliceResult]:
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

    def no_spark(tasks: Sequence[SliceTask], root: Root) -> list[SliceResult]:
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


def _task(index: int, rows: int) -> SliceTask:
    return SliceTask(1, index, index * 10, index * 10 + 9, (), (), ("time",), f"{index}.parquet", rows)


@pytest.mark.parametrize("rows, count, expected", [
    ([100] * 12, 2, [6, 6]),  # equal slices: equal runs
    ([100] * 12, 5, [2, 3, 2, 3, 2]),  # 240 rows each: 200 or 300
    ([900, 100, 100, 100, 100, 100, 100, 100, 100, 100], 2, [1, 9]),  # one large slice runs alone
    ([100, 100, 100], 3, [1, 1, 1]),  # a core each: no bundling
    ([100, 100, 100], 8, [1, 1, 1]),
    ([0, 0, 0, 0], 2, [2, 2]),  # no estimate: counted as one row each
])
def test_slices_are_bundled_into_consecutive_runs_of_about_equal_rows(rows: list[int], count: int,
                                                                       expected: list[int]) -> None:
    tasks = [_task(i, r) for i, r in enumerate(rows)]
    runs = bundles(tasks, count)
    assert [len(r) for r in runs] == expected
    assert [t for r in runs for t in r] == tasks  # every slice once, in order
