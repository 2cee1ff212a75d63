"""`iox_bulk_load` with real Airflow (`dag.test()`), real spark-submit and a real catalog: a folder under
IOX_BULK_LOAD_ROOT is loaded (the rows equal the test's tally); a folder that leaves the root (`..`, a symlink out,
an absolute path elsewhere) fails the `check` task, with nothing read and nothing registered."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from airflow_support import DagRunner
from common_support import catalog_counts

from iox_planner.runs.settings import RunSettings
from iox_planner.catalog.store import Catalog
from iox_planner.errors import BadInputError
from iox_planner.ingest.bulk import resolve_source

pytestmark = pytest.mark.airflow

T0 = 1704153590 * 10**9  # ten seconds before midnight


def _settings(root: Path) -> RunSettings:
    return RunSettings.from_env({"IOX_BULK_LOAD_ROOT": str(root)})


def test_the_folder_must_resolve_inside_the_root(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "jan").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.lp").write_text("m f=1 1\n")
    (root / "out").symlink_to(outside)
    (root / "jan" / "a.lp").write_text("m f=1 1\n")
    settings = _settings(root)
    assert resolve_source("jan", settings.bulk_load_root) == (root / "jan").resolve()
    assert resolve_source(str(root / "jan" / "a.lp"), settings.bulk_load_root) == (root / "jan" / "a.lp").resolve()
    for hostile, needle in (("../outside", "'..'"), ("jan/../../outside", "'..'"), (str(outside), "not inside"),
                            ("out", "not inside"), ("out/secret.lp", "not inside"), ("/etc", "not inside"),
                            (str(root), "not inside"), (".", "not inside"), ("missing", "does not exist"),
                            ("jan\0x", "NUL"), ("", "empty")):
        with pytest.raises(BadInputError, match=needle):
            resolve_source(hostile, settings.bulk_load_root)
    with pytest.raises(BadInputError, match="filesystem root"):
        _settings(Path("/"))


def test_iox_bulk_load_loads_a_folder_and_refuses_one_outside_the_root(
        dag_runner: DagRunner, catalog: Catalog, db: str, tmp_path: Path) -> None:
    root = tmp_path / "bulk"
    folder = root / "2024-01"
    folder.mkdir(parents=True)
    want: dict[tuple[str, int], float] = {}
    for n, name in enumerate(("a.lp", "b.lp")):
        lines = []
        for i in range(40):
            host, t, v = f"h{i % 3}", T0 + (i % 20) * 10**9, float(n * 100 + i)
            lines.append(f"cpu,host={host} usage={v} {t}")
            want[(host, t)] = v  # later lines and files win
        (folder / name).write_text("\n".join(lines) + "\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.lp").write_text("cpu,host=evil usage=1 1\n")
    env = {"IOX_BULK_LOAD_ROOT": str(root), "IOX_BULK_RANGE_BYTES": "4096"}

    before = catalog_counts(catalog)
    refused = dag_runner.run([{"dag_id": "iox_bulk_load", "conf": {"db": db, "folder": "../outside"}}], env=env)
    assert refused[0]["state"] == "failed"
    assert refused[0]["tasks"]["check"] == "failed" and refused[0]["tasks"].get("load") != "success"
    assert "'..'" in refused[0]["log"]
    assert catalog_counts(catalog) == before

    [done] = dag_runner.run([{"dag_id": "iox_bulk_load", "conf": {"db": db, "folder": "2024-01"}}], env=env)
    assert done["state"] == "success", done["log"][-4000:]
    assert done["tasks"] == {"check": "success", "load": "success", "summary": "success"}, done["tasks"]
    warehouse = Path(os.environ["IOX_WAREHOUSE"])
    with catalog.engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT c.path, c.chunk_order FROM iox_ingester_chunk c JOIN iox_table t ON t.id = c.table_id "
            "JOIN iox_database d ON d.id = t.database_id WHERE d.name = :db").bindparams(db=db)).all()
    assert len(rows) >= 4  # two files, two days each
    # Read back naively: every row in (chunk order, write position) order, the last one of each key wins.
    got: dict[tuple[str, int], float] = {}
    for r in sorted(rows, key=lambda r: r.chunk_order):
        for row in sorted(pq.read_table(warehouse / r.path).to_pylist(), key=lambda x: x["__seq"]):
            got[(row["host"], row["time"])] = row["usage"]
    assert got == want
