"""Persist against the real Postgres catalog and a real warehouse folder: the merge (last non-null value wins,
NULL tag equals NULL tag), the partition sort key, the swap racing a write, the grace period, and refusals."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common_support import catalog_counts, live_chunks, read_rows, warehouse_files
from iox_planner.catalog.store import Catalog
from iox_planner.errors import CatalogError
from iox_planner.ingest.scenario import load_scenario, parse_scenario
from iox_planner.ingest.write import write_line_protocol
from iox_planner.maintenance.persist import persist
from iox_planner.maintenance.sweeps import collect_garbage

T0 = 1_704_067_200_000_000_000  # 2024-01-01T00:00:00Z


def write(catalog: Catalog, db: str, text: str) -> object:
    return write_line_protocol(catalog, db, text)


def persisted_rows(catalog: Catalog, db: str, warehouse: Path, table: str) -> list[dict[str, object]]:
    files = [c for c in live_chunks(catalog, db) if c["kind"] == "parquet" and c["table_name"] == table]
    assert len(files) == 1, files
    return read_rows(warehouse / files[0]["path"])


def test_persist_merges_columns_last_non_null_wins(catalog: Catalog, db: str, warehouse: Path) -> None:
    write(catalog, db, f"m,host=A f1=2 {T0}")
    write(catalog, db, f"m,host=A f2=3 {T0}")
    write(catalog, db, f"m,host=A f1=5 {T0}\nm,host=A f1=6 {T0}")  # within one chunk, the later write wins
    (result,) = persist(catalog, db)
    assert (result.chunks_in, result.rows_in, result.rows_out) == (3, 4, 1)
    # The file keeps the order of the key's newest write (the third write: order 3), for changes reads.
    assert persisted_rows(catalog, db, warehouse, "m") == [
        {"host": "A", "f1": 6.0, "f2": 3.0, "time": T0, "__write_order": 3}]


def test_persist_null_tag_equals_null_tag_and_1ns_apart_stays(catalog: Catalog, db: str, warehouse: Path) -> None:
    write(catalog, db, "\n".join([
        f"m,host=a v=1 {T0}",
        f"m v=2 {T0}",
        f"m,region=x v=4 {T0}",
        f"m v=3 {T0}",
        f"m,host=a v=5 {T0 + 1}",
    ]))
    write(catalog, db, f"m,host=a w=true {T0}")
    persist(catalog, db)
    rows = persisted_rows(catalog, db, warehouse, "m")
    # Sort key: host has 1 distinct value, region 1: ties by name -> host, region, time; NULLs first.
    assert rows == [
        {"host": None, "region": None, "v": 3.0, "w": None, "time": T0, "__write_order": 1},
        {"host": None, "region": "x", "v": 4.0, "w": None, "time": T0, "__write_order": 1},
        {"host": "a", "region": None, "v": 1.0, "w": True, "time": T0, "__write_order": 2},
        {"host": "a", "region": None, "v": 5.0, "w": None, "time": T0 + 1, "__write_order": 1},
    ]


def test_persist_sorts_on_partition_sort_key_and_fixes_it(catalog: Catalog, db: str, warehouse: Path) -> None:
    write(catalog, db, "\n".join([
        f"m,city=SF,state=CA v=1 {T0 + 3}",
        f"m,city=LA,state=CA v=2 {T0 + 1}",
        f"m,city=Boston,state=MA v=3 {T0 + 2}",
    ]))
    persist(catalog, db)
    (file,) = [c for c in live_chunks(catalog, db) if c["kind"] == "parquet"]
    assert file["sort_key"] == ["state", "city", "time"]  # state: 2 distinct values, city: 3
    assert [(r["state"], r["city"]) for r in read_rows(warehouse / file["path"])] == [
        ("CA", "LA"), ("CA", "SF"), ("MA", "Boston")]
    # A tag that appears later goes just before time; the fixed part stays even if counts change.
    write(catalog, db, "\n".join(f"m,city=C{i},state=S{i},zone=z v=1 {T0 + 10 + i}" for i in range(5)))
    persist(catalog, db)
    files = [c for c in live_chunks(catalog, db) if c["kind"] == "parquet"]
    assert files[-1]["sort_key"] == ["state", "city", "zone", "time"]


def test_persisted_tags_read_back_as_plain_strings(catalog: Catalog, db: str, warehouse: Path) -> None:
    """Persist merges tags dictionary-encoded; its file must still read back as every other file does (the
    Parquet dictionary is an encoding, not Arrow's dictionary type), with rows sorted on the key."""
    write(catalog, db, f"m,host=b,dc=x v=1 {T0}\nm,host=a,dc=x v=2 {T0}")
    write(catalog, db, f"m,host=a v=3 {T0}\nm,host=c,dc=y v=4 {T0 + 1}")
    persist(catalog, db)
    (file,) = [c for c in live_chunks(catalog, db) if c["kind"] == "parquet"]
    schema = pq.read_schema(warehouse / file["path"])
    assert schema.field("host").type == pa.string() and schema.field("dc").type == pa.string()
    assert file["sort_key"] == ["dc", "host", "time"]  # dc: 2 distinct values (and NULL), host: 3
    assert [(r["dc"], r["host"], r["v"]) for r in read_rows(warehouse / file["path"])] == [
        (None, "a", 3.0), ("x", "a", 2.0), ("x", "b", 1.0), ("y", "c", 4.0)]


def test_persist_swaps_atomically_and_keeps_a_racing_write(catalog: Catalog, db: str, warehouse: Path) -> None:
    write(catalog, db, f"m,t=a v=1 {T0}")
    write(catalog, db, f"m,t=b v=2 {T0}")

    def racing_write() -> None:
        # Lands after persist read its chunk list, before it commits: in its own transaction and connection.
        write(catalog, db, f"m,t=c v=3 {T0}")

    (result,) = persist(catalog, db, after_read=racing_write)
    assert result.chunks_in == 2
    live = live_chunks(catalog, db)
    assert [(c["kind"], c["row_count"]) for c in live] == [("parquet", 2), ("ingester", 1)]
    assert read_rows(warehouse / live[1]["path"], drop=("__seq",)) == [{"t": "c", "v": 3.0, "time": T0}]
    # The persisted file is older than the racing write: it takes the highest order of what it merged.
    assert live[0]["chunk_order"] < live[1]["chunk_order"]


def test_retired_chunks_are_deleted_only_after_the_grace_period(catalog: Catalog, db: str, warehouse: Path) -> None:
    write(catalog, db, f"m,t=a v=1 {T0}")
    (chunk,) = live_chunks(catalog, db)
    persist(catalog, db)
    assert (warehouse / chunk["path"]).exists(), "retired file must survive the grace period"
    collect_garbage(catalog, warehouse, grace_seconds=0.0)
    assert not (warehouse / chunk["path"]).exists()
    (file,) = live_chunks(catalog, db)
    assert (warehouse / file["path"]).exists()


def test_persist_refuses_an_ingester_chunk_older_than_a_file(catalog: Catalog, db: str, warehouse: Path) -> None:
    scenario = parse_scenario({"chunks": [
        {"id": "I1", "kind": "ingester", "order": 1, "lines": f"m,t=a v=1 {T0}"},
        {"id": "F2", "kind": "parquet", "order": 2, "lines": f"m,t=a v=2 {T0}"},
    ]})
    load_scenario(catalog, scenario, db)
    before_files, before_rows = warehouse_files(warehouse), catalog_counts(catalog)
    with pytest.raises(CatalogError, match="I1.*older than Parquet file F2"):
        persist(catalog, db)
    assert warehouse_files(warehouse) == before_files
    assert catalog_counts(catalog) == before_rows


def test_persist_unknown_database_and_table(catalog: Catalog, db: str) -> None:
    with pytest.raises(CatalogError, match="does not exist"):
        persist(catalog, db)
    write(catalog, db, f"m,t=a v=1 {T0}")
    with pytest.raises(CatalogError, match="table 'nope' does not exist.*tables: m"):
        persist(catalog, db, table="nope")
