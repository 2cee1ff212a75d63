"""Compaction requests (what a persist asks the `iox_compact` DAG to compact): the asset event's extra is checked
like any input, and a requested run plans exactly the partitions named, in the databases the DAG compacts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common_support import live_chunks
from iox_planner.catalog.store import Catalog
from iox_planner.errors import BadInputError
from iox_planner.ingest.scenario import load_scenario, parse_scenario
from iox_planner.maintenance.compact.batches import parse_requests, plan_batches, request_extra

T0 = 1_704_067_200_000_000_000
DAY = 86_400 * 10**9


def test_requests_merge_and_round_trip() -> None:
    extras = [request_extra({"a": [3, 1, 3], "b": [2], "c": []}), {"targets": {"a": [2]}}]
    assert parse_requests(extras) == {"a": [1, 2, 3], "b": [2]}
    assert parse_requests([]) == {}


@pytest.mark.parametrize("extra", [
    None, [], "targets", {}, {"targets": []}, {"targets": {"a": "1"}}, {"targets": {"a": [0]}},
    {"targets": {"a": [1.0]}}, {"targets": {"a": [True]}}, {"targets": {"a": ["1"]}},
    {"targets": {"bad name;": [1]}}, {"targets": {"x" * 65: [1]}}, {"targets": {"a": list(range(1, 10_002))}},
])
def test_a_malformed_request_is_refused_whole(extra: Any) -> None:
    with pytest.raises(BadInputError):
        parse_requests([request_extra({"ok": [1]}), extra])


def _partition_ids(catalog: Catalog, db: str) -> dict[str, int]:
    return {c["partition_key"]: c["partition_id"] for c in live_chunks(catalog, db)}


def _planned(batches: Any, db: str) -> list[int]:
    """The partition ids of `db` the batches name."""
    return sorted(p for batch in batches.spark for name, pids in batch.targets if name == db for p in pids)


def test_a_requested_run_plans_only_the_partitions_named(catalog: Catalog, db: str, tmp_path: Path) -> None:
    # Two days, each with two overlapping files: both need a rewrite, only one is requested.
    load_scenario(catalog, parse_scenario({"chunks": [
        {"id": "A", "kind": "parquet", "order": 1, "lines": f"m,t=a f=1 {T0}"},
        {"id": "B", "kind": "parquet", "order": 2, "lines": f"m,t=a f=2 {T0}"},
        {"id": "C", "kind": "parquet", "order": 3, "lines": f"m,t=a f=1 {T0 + DAY}"},
        {"id": "D", "kind": "parquet", "order": 4, "lines": f"m,t=a f=2 {T0 + DAY}"},
    ]}), db)
    ids = _partition_ids(catalog, db)
    assert _planned(plan_batches([db], 4, tmp_path / "all"), db) == sorted(ids.values())
    assert _planned(plan_batches([db], 4, tmp_path / "one", only={db: [ids["2024-01-02"]]}), db) == [
        ids["2024-01-02"]]
    # A database the DAG does not compact, or one that no longer exists, is not widened into.
    assert plan_batches(["other"], 4, tmp_path / "x", only={db: [ids["2024-01-02"]]}).spark == []
    assert plan_batches([], 4, tmp_path / "y", only={"gone": [1]}).spark == []
