"""The writers against an `s3://` warehouse on the suite's real S3 API server (moto's standalone server, spoken to
over HTTP by pyarrow): the same line protocol written, persisted, loaded from a scenario and registered as a table
gives the same catalog rows (apart from ids and paths) and the same file contents as with a local warehouse; no
Parquet file lands on the local disk; every file is put once under its final key (no copy, no rename); drops
delete a database's objects at once and a table's after the grace period; and the CLI writes and shows with
IOX_WAREHOUSE=s3://..."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common_support import live_chunks, run_cli
from iox_planner.catalog.drops import drop_database, drop_table
from iox_planner.catalog.store import Catalog
from iox_planner.ingest.register import register_interval
from iox_planner.ingest.scenario import load_scenario, read_scenario
from iox_planner.ingest.write import write_line_protocol
from iox_planner.maintenance.persist import persist
from iox_planner.maintenance.sweeps import collect_garbage
from iox_planner.objectstore import Root, local_root, parse_root

T0 = 1_704_067_200_000_000_000
DAY = 86_400_000_000_000

WRITES = [
    "".join(f"cpu,host=h{k % 3},region=r{k % 2} usage={k * 1.5},idle={100 - k}i {T0 + k * 1_000_000_000}\n"
            for k in range(40)),
    # overwrites some keys, adds a field, a new day and a second table
    "".join(f"cpu,host=h{k % 3},region=r{k % 2} usage={k * 2.5},note=\"n{k}\" {T0 + k * 1_000_000_000}\n"
            for k in range(0, 40, 3)) + f"cpu,host=h9 usage=1 {T0 + DAY}\nmem,host=h1 free=7i {T0}\n",
]

SCENARIO = """db: ignored
chunks:
  - id: C1
    kind: parquet
    lines: |
      h2o,state=CA,city=SF min_temp=68.4,max_temp=85.7,area=500u 600
      h2o,state=MA,city=Boston min_temp=65.40,max_temp=82.67 400
  - id: C2
    kind: ingester
    lines: |
      h2o,state=CA,city=SF min_temp=70.1 600
      h2o,state=MA,city=Bedford max_temp=88.75,area=742u 600
"""

# Columns of a chunk row that differ between two warehouses by construction (ids, the fresh UUID names, times).
_PER_WAREHOUSE = {"id", "object_id", "path", "table_id", "partition_id", "created_at", "to_delete"}


def _all_chunks(catalog: Catalog, db: str) -> list[dict[str, Any]]:
    """Every chunk row of the database, live or retired, in a stable order."""
    import sqlalchemy as sa

    out = []
    with catalog.engine.connect() as conn:
        for kind, table in (("parquet", "iox_parquet_file"), ("ingester", "iox_ingester_chunk")):
            rows = conn.execute(sa.text(
                f"SELECT c.*, t.name AS table_name, p.partition_key, c.to_delete IS NOT NULL AS retired "
                f"FROM {table} c JOIN iox_table t ON t.id = c.table_id JOIN iox_database d ON d.id = t.database_id "
                "JOIN iox_partition p ON p.id = c.partition_id WHERE d.name = :db").bindparams(db=db)).mappings()
            out.extend({**r, "kind": kind} for r in rows)
    out.sort(key=lambda r: (r["chunk_order"], r["kind"], r["table_name"], r["partition_key"], r["min_time"]))
    return out


def _comparable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in _PER_WAREHOUSE}


def _read(root: Root, rel: str) -> pa.Table:
    if root.is_local:
        return pq.read_table(root.local_path / rel)
    return pq.read_table(root.path(rel), filesystem=root.filesystem())


def _build(catalog: Catalog, db: str, root: Root) -> None:
    """Every writer of this part, one after another, into `db` in `root`."""
    for lines in WRITES:
        write_line_protocol(catalog, db, lines, warehouse=root)
    persist(catalog, db, warehouse=root)
    write_line_protocol(catalog, db, f"cpu,host=h0,region=r0 usage=99 {T0}\n", warehouse=root)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        fh.write(SCENARIO)
    try:
        load_scenario(catalog, read_scenario(fh.name), db=f"{db}_s", warehouse=root)
    finally:
        os.unlink(fh.name)
    rollup = pa.table({"time": pa.array([T0, T0 + 60_000_000_000, T0 + DAY], pa.int64()),
                       "host": ["h0", "h1", "h0"], "mean": [1.5, 2.5, 3.5]})
    register_interval(catalog, db, "cpu_rollup", rollup, tags=["host"], interval=(T0, T0 + 2 * DAY), warehouse=root)


ROOT = Path(__file__).resolve().parents[2]


def _local_parquet(folders: list[Path], skip: set[Path]) -> set[Path]:
    """Every file with `.parquet` in its name (a temporary too) under `folders`, not descending into `skip`."""
    found: set[Path] = set()
    for folder in folders:
        for dirpath, dirnames, names in os.walk(folder):
            dirnames[:] = [d for d in dirnames if Path(dirpath, d) not in skip]
            found.update(Path(dirpath) / n for n in names if ".parquet" in n)
    return found


def _everything_under(root: Root, rel: str) -> list[str]:
    """Every key under the prefix, pyarrow's empty folder markers included (which `Root.list` leaves out)."""
    import pyarrow.fs as pafs

    found = root.filesystem().get_file_info(pafs.FileSelector(root.path(rel), recursive=True, allow_not_found=True))
    return [item.path for item in found]


@pytest.fixture
def s3_root(s3_warehouse: str) -> Root:
    return parse_root(s3_warehouse)


def test_every_writer_gives_the_same_rows_and_files_on_a_store_as_on_a_local_folder(
        catalog: Catalog, tmp_path: Path, s3_root: Root, s3_server: Any) -> None:
    local = local_root(tmp_path / "lake")
    db = f"t_{uuid.uuid4().hex[:10]}"
    # No Parquet file (nor a temporary of one) appears in the cwd, the project or this test's own folder; in the
    # temporary folder, which other processes write to meanwhile, none bears an s3 file's name.
    watched = [Path.cwd(), ROOT, tmp_path]
    skip = {ROOT / ".venv", ROOT / ".git"}
    before = _local_parquet(watched, skip)
    _build(catalog, f"{db}_local", local)
    assert _local_parquet(watched, skip) - before, "the local leg wrote no Parquet file: the watch proves nothing"
    before = _local_parquet(watched, skip)
    start = len(s3_server.requests())
    _build(catalog, f"{db}_s3", s3_root)
    assert _local_parquet(watched, skip) == before, "an s3 warehouse put a Parquet file on the local disk"
    s3_names = {str(r["object_id"]) for suffix in ("", "_s") for r in _all_chunks(catalog, f"{db}_s3{suffix}")}
    assert s3_names
    in_temp = [p for p in _local_parquet([Path(tempfile.gettempdir())], skip) if any(n in p.name for n in s3_names)]
    assert in_temp == [], "an s3 warehouse's file was written to the temporary folder"

    for suffix in ("", "_s"):
        on_disk = _all_chunks(catalog, f"{db}_local{suffix}")
        on_store = _all_chunks(catalog, f"{db}_s3{suffix}")
        assert [_comparable(r) for r in on_store] == [_comparable(r) for r in on_disk]
        assert any(r["retired"] for r in on_disk) or suffix, "the persist retired nothing: no persist was tested"
        # Every writer names a file after its row's object_id: what the sweeps' catalog lookup goes by.
        assert all(str(r["object_id"]) == Path(r["path"]).name.split(".")[0] for r in on_disk + on_store)
        for disk_row, store_row in zip(on_disk, on_store):
            assert _read(s3_root, store_row["path"]).equals(_read(local, disk_row["path"]), check_metadata=True)
            assert s3_root.info(store_row["path"]).size == store_row["file_size"]

    # Put once: each file's bytes go to its final key once (one PUT, or one part of an upload), nothing is put
    # under another name and copied or renamed there (a copy is a PUT too), nothing deleted.
    requests = s3_server.requests()[start:]
    puts = [path for method, path, status in requests if method == "PUT" and status == 200]
    prefix = "/" + s3_root.base + "/"
    names = [p.split("?")[0] for p in puts if p.startswith(prefix)]
    files = [prefix + r["path"] for suffix in ("", "_s") for r in _all_chunks(catalog, f"{db}_s3{suffix}")]
    assert sorted(names) == sorted(files), "a file was put under a name no catalog row has, or put twice"
    assert not [r for r in requests if r[0] == "DELETE"], "a writer deleted an object"


def test_drops_on_a_store_delete_the_database_at_once_and_a_table_after_the_grace_period(
        catalog: Catalog, s3_root: Root) -> None:
    db = f"t_{uuid.uuid4().hex[:10]}"
    write_line_protocol(catalog, db, WRITES[0] + f"gone,host=a v=1 {T0}\n", warehouse=s3_root)
    [gone] = [c for c in live_chunks(catalog, db) if c["table_name"] == "gone"]
    drop_table(catalog, db, "gone")
    assert s3_root.exists(gone["path"]), "a table's file went before the grace period"
    collect_garbage(catalog, s3_root, grace_seconds=3600)
    assert s3_root.exists(gone["path"])
    time.sleep(1.1)  # the retirement's timestamp strictly behind: a zero grace period takes it
    collect_garbage(catalog, s3_root, grace_seconds=0)
    assert not s3_root.exists(gone["path"])

    [kept] = live_chunks(catalog, db)
    db_id = kept["path"].split("/")[0]
    other = f"t_{uuid.uuid4().hex[:10]}"
    write_line_protocol(catalog, other, WRITES[0], warehouse=s3_root)
    before_other = sorted(o.rel for o in s3_root.list() if not o.rel.startswith(f"{db_id}/"))
    assert [o.rel for o in s3_root.list(db_id)] == [kept["path"]]
    notes: list[str] = []
    drop_database(catalog, db, s3_root, warn=notes.append)
    assert notes == [] and _everything_under(s3_root, db_id) == [], "the drop left objects (or folder markers)"
    assert sorted(o.rel for o in s3_root.list()) == before_other, "a drop touched another database's objects"


def test_the_cli_writes_and_shows_with_an_s3_warehouse(s3_warehouse: str, catalog: Catalog, tmp_path: Path,
                                                       s3_server: Any) -> None:
    db = f"t_{uuid.uuid4().hex[:10]}"
    env = {"IOX_WAREHOUSE": s3_warehouse, **s3_server.env()}
    wrote = run_cli("write", "--db", db, "-", stdin=WRITES[0], env=env)
    assert wrote.returncode == 0, wrote.stderr
    assert "40 rows" in wrote.stdout
    shown = run_cli("show", "--db", db, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "cpu" in shown.stdout
    [chunk] = live_chunks(catalog, db)
    root = parse_root(s3_warehouse)
    assert _read(root, chunk["path"]).num_rows == 40
    assert not Path("s3:").exists() and not (tmp_path / "s3:").exists(), "the URI was taken for a local folder"
    persisted = run_cli("persist", "--db", db, env=env)
    assert persisted.returncode == 0, persisted.stderr
    assert "warning" not in persisted.stderr, persisted.stderr
    dropped = run_cli("drop", "--db", db, "--yes", env=env)
    assert dropped.returncode == 0 and "warning" not in dropped.stderr, dropped.stderr
    assert list(root.list(chunk["path"].split("/")[0])) == []
    for result in (wrote, shown, persisted, dropped):
        assert s3_server.env()["AWS_SECRET_ACCESS_KEY"] not in result.stdout + result.stderr


def test_a_store_drop_that_fails_is_a_warning_and_the_sweep_takes_the_leftovers(
        catalog: Catalog, s3_warehouse: str, s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from s3_support import CuttableProxy

    from iox_planner.maintenance.sweeps import sweep_dropped_databases

    root = parse_root(s3_warehouse)
    db = f"t_{uuid.uuid4().hex[:10]}"
    write_line_protocol(catalog, db, WRITES[0], warehouse=root)
    [chunk] = live_chunks(catalog, db)
    db_id = chunk["path"].split("/")[0]
    proxy = CuttableProxy(s3_server.port)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        proxy.cut()
        notes: list[str] = []
        drop_database(catalog, db, root, warn=notes.append)
        [note] = notes
        assert "is dropped" in note and "sweep" in note and s3_server.env()["AWS_SECRET_ACCESS_KEY"] not in note
        proxy.restore()
    finally:
        proxy.stop()
        monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    assert [o.rel for o in root.list(db_id)] == [chunk["path"]], "the cut store lost the object anyway"
    assert int(db_id) in sweep_dropped_databases(catalog, root)
    assert _everything_under(root, db_id) == []
    assert int(db_id) not in sweep_dropped_databases(catalog, root), "the swept database's prefix is still listed"


def test_retention_expiry_on_a_store_deletes_the_expired_objects_after_the_grace_period(
        catalog: Catalog, s3_root: Root) -> None:
    from iox_planner.catalog.retention import create_database
    from iox_planner.maintenance.sweeps import expire_databases
    from iox_planner.timeutil import now_ns

    db = f"t_{uuid.uuid4().hex[:10]}"
    with catalog.engine.begin() as conn:
        create_database(conn, db, 7 * DAY)
    recent = now_ns() - DAY
    write_line_protocol(catalog, db, f"m,h=a v=1 {T0}\nm,h=a v=2 {recent}\n", warehouse=s3_root)
    old, new = sorted(live_chunks(catalog, db), key=lambda c: c["min_time"])
    done = expire_databases(catalog, s3_root, 3600, only=[db])
    assert [(name, part.partition, count) for name, part, count in done] == [(db, old["partition_key"], 1)]
    assert [c["path"] for c in live_chunks(catalog, db)] == [new["path"]]
    assert s3_root.exists(old["path"]), "an expired file went before the grace period"
    time.sleep(1.1)
    expire_databases(catalog, s3_root, 0, only=[db])
    assert not s3_root.exists(old["path"]) and s3_root.exists(new["path"])
