"""The warehouse layout (`storage.py`): the names it builds match the patterns the sweeps go by (and only their
own), an atomic write, and whether the catalog names a file."""

from __future__ import annotations

import uuid
from pathlib import Path

import sqlalchemy as sa

from common_support import live_chunks
from iox_planner import storage
from iox_planner.catalog.store import Catalog
from iox_planner.ingest.write import write_line_protocol


def test_each_name_matches_its_own_pattern_only() -> None:
    chunk = storage.chunk_path(7, 42, 1234)
    compacted = storage.compacted_path(7, 42, 1234)
    assert chunk.startswith("7/42/1234/") and compacted.startswith("7/42/1234/")
    assert storage.CHUNK_PATH.fullmatch(chunk) and not storage.CHUNK_PATH.fullmatch(compacted)
    chunk_name, compacted_name = Path(chunk).name, Path(compacted).name
    assert storage.CHUNK_FILE.fullmatch(chunk_name) and not storage.COMPACTED_FILE.fullmatch(chunk_name)
    assert storage.COMPACTED_FILE.fullmatch(compacted_name) and not storage.CHUNK_FILE.fullmatch(compacted_name)
    chunk_temp = storage.temp_path(Path(chunk)).name
    assert storage.CHUNK_TEMP.fullmatch(chunk_temp) and not storage.CHUNK_FILE.fullmatch(chunk_temp)
    assert storage.COMPACTED_FILE.fullmatch(storage.temp_path(Path(compacted)).name)
    assert not storage.CHUNK_TEMP.fullmatch(storage.temp_path(Path(compacted)).name)
    for rel in (chunk, compacted):
        assert str(uuid.UUID(storage.object_id(rel))) == storage.object_id(rel)
    load = storage.new_load_id()
    assert storage.BULK_LOAD_ID.fullmatch(load)
    assert storage.bulk_staging(Path("/w"), load) == Path("/w/_bulk") / load
    for hostile in ("../1/2/" + chunk_name, "1/2/3/../" + chunk_name, "/1/2/3/" + chunk_name, "a/2/3/" + chunk_name,
                    chunk + "/x", chunk.upper()):
        assert not storage.CHUNK_PATH.fullmatch(hostile), hostile


def test_a_file_written_without_arrow_schema_reads_back_plain_with_its_metadata(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    plain = pa.table({"host": pa.array(["b", None, "a"]), "n": pa.array([1, 2, 3], pa.uint64()),
                      "time": pa.array([1, 2, 3], pa.int64())})
    encoded = plain.set_column(0, "host", plain["host"].dictionary_encode())
    path = tmp_path / "x.parquet"
    storage.write_parquet_atomic(encoded, path, metadata={"iox.kind": "parquet"}, store_schema=False)
    back = pq.read_table(path)
    assert back.equals(plain.replace_schema_metadata({"iox.kind": "parquet"}))
    assert pq.read_metadata(path).metadata == {b"iox.kind": b"parquet"}
    assert [p.name for p in tmp_path.iterdir()] == ["x.parquet"]  # no temporary left beside it


def test_a_file_is_named_while_a_row_names_it_and_the_catalog_is_asked_in_batches(catalog: Catalog, db: str) -> None:
    write_line_protocol(catalog, db, "m v=1 1")
    [chunk] = live_chunks(catalog, db)
    ids = [int(p) for p in chunk["path"].split("/")[:3]]
    unnamed = [storage.chunk_path(*ids) for _ in range(2 * storage.NAMED_BATCH + 1)]
    statements: list[str] = []

    def count(conn: object, cursor: object, statement: str, *rest: object) -> None:
        if "path" in statement:
            statements.append(statement)

    sa.event.listen(catalog.engine, "before_cursor_execute", count)
    try:
        # The row's own uuid in another folder, and a temporary's name (no uuid first), are not the row's file.
        elsewhere = f"{ids[0]}/{ids[1]}/{ids[2] + 1}/{chunk['path'].rsplit('/', 1)[1]}"
        temporary = storage.temp_path(Path(chunk["path"])).as_posix()
        assert storage.named_paths(catalog, [*unnamed, elsewhere, temporary, chunk["path"]]) == {chunk["path"]}
    finally:
        sa.event.remove(catalog.engine, "before_cursor_execute", count)
    assert len(statements) == 3, "one statement per batch of paths, never one per path"
    assert storage.named_paths(catalog, []) == set()
    assert str(chunk["object_id"]) == storage.object_id(chunk["path"]), "the lookup by object_id relies on it"
    with catalog.engine.connect() as conn:
        assert chunk["path"] in storage.partition_paths(conn, chunk["partition_id"])
