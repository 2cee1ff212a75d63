"""A bulk load's registration and its advisory lock: the driver (`bulk.bulk_write`) run with the in-process range
runner on the real catalog, its lock's session killed between staging and registration."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pytest
import sqlalchemy as sa

from common_support import catalog_counts
from iox_planner import storage
from iox_planner.catalog import locks
from iox_planner.catalog.store import Catalog
from iox_planner.errors import CatalogUnavailableError
from iox_planner.ingest import bulk
from iox_planner.maintenance.sweeps import sweep_unreferenced

T0 = 1_704_153_590_000_000_000  # ten seconds before a midnight: two partitions


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _terminate_lock_holder(catalog: Catalog, load_id: str) -> None:
    """End the session holding load `load_id`'s lock (`pg_terminate_backend`), as a dropped connection would."""
    key = locks.bulk_load_key(load_id)
    with catalog.engine.connect() as conn:
        holder = conn.execute(sa.text(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid::bigint = :hi "
            "AND objid::bigint = :lo AND objsubid = 1").bindparams(hi=key >> 32, lo=key & 0xFFFF_FFFF)).scalar_one()
        assert conn.execute(sa.text("SELECT pg_terminate_backend(:p, 10000)").bindparams(p=holder)).scalar()


@pytest.mark.parametrize("sweep", [True, False], ids=["swept", "not-swept"])
def test_a_lost_lock_session_fails_the_load_and_registers_nothing(catalog: Catalog, db: str, warehouse: Path,
                                                                  tmp_path: Path, sweep: bool) -> None:
    """The lock's session dies while the tasks run. Swept: a sweep then takes the free lock and removes the staged
    chunks. Not swept: the chunks are still there, but nothing kept a sweep off them. Either way the load must fail
    with the retryable error before registering anything, not name files that may be gone."""
    source = tmp_path / "in.lp"
    source.write_text("".join(f"m,host=h{k % 3} f={k}i {T0 + k * 1_000_000_000}\n" for k in range(20)))
    before = (catalog_counts(catalog), _files(warehouse))
    staged: list[str] = []

    def runner(ranges: Sequence[bulk.Range], params: bulk.TaskParams) -> list[bulk.RangeResult]:
        results = bulk.local_runner(ranges, params)
        staged.extend(p.name for p in Path(params.staging).glob("*.parquet"))
        _terminate_lock_holder(catalog, Path(params.staging).name)
        if sweep:
            removed = sweep_unreferenced(catalog, warehouse, 0, -1)
            assert f"{storage.BULK_STAGING}/{Path(params.staging).name}" in removed
            assert not Path(params.staging).exists()
        return results

    with pytest.raises(CatalogUnavailableError, match="lock was lost"):
        bulk.bulk_write(catalog, db, str(source), runner, target_bytes=200, warehouse=warehouse)
    assert len(staged) >= 2, "the tasks staged nothing: the scenario did not happen"
    assert catalog_counts(catalog) == before[0], "a load whose lock was lost registered something"
    assert _files(warehouse) == before[1], "the failed load left files"


def test_a_load_whose_lock_holds_registers(catalog: Catalog, db: str, warehouse: Path, tmp_path: Path) -> None:
    """The same load with its lock's session alive registers every row (the check does not refuse a live lock)."""
    source = tmp_path / "in.lp"
    source.write_text("".join(f"m,host=h{k % 3} f={k}i {T0 + k * 1_000_000_000}\n" for k in range(20)))
    result = bulk.bulk_write(catalog, db, str(source), bulk.local_runner, target_bytes=200, warehouse=warehouse)
    assert result.rows == 20
    assert {c.partition for c in result.chunks} == {"2024-01-01", "2024-01-02"}
