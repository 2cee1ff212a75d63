"""The warehouse layout, owned here alone: where each file goes and what it is named, the file-name patterns the
sweeps match, atomic file writes, files staged until their catalog transaction commits (`Staged`), and whether
the catalog names a file.

    <db id>/<table id>/<partition id>/<uuid>.parquet            a chunk: write, persist, bulk load, registration
    <db id>/<table id>/<partition id>/<uuid>.compacted.parquet  a compaction's output (staged, then swapped in)
    <folder>/.<name>.<32 hex digits>.tmp                        a file being written (`write_parquet_atomic`,
                                                                `write_json_atomic`)
    _bulk/<load id>/                                            a bulk load's staging folder (id: 32 hex digits):
                                                                its tasks' chunks and its manifest (a local warehouse)
    _loads/<load id>/<uuid>.parquet                             a bulk load's chunk on an object store: put once by
                                                                its task under the key its catalog row then names

Paths are built from catalog ids (or a load's fresh id), never from names, and are relative to the warehouse root.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.engine import Connection

from iox_planner.catalog.schema import ingester_chunks, parquet_files
from iox_planner.catalog.store import Catalog
from iox_planner.model import WRITE_ORDER
from iox_planner.objectstore import Root, local_root

# --- names and patterns -------------------------------------------------------------------------------------------

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_TEMP = r"\.[0-9a-f]{32}\.tmp"  # what `temp_path` appends
_UUID_NAME = re.compile(_UUID)

ID_NAME = re.compile(r"[0-9]+")
"""A database, table or partition folder: a catalog id."""
CHUNK_FILE = re.compile(rf"{_UUID}\.parquet")
CHUNK_TEMP = re.compile(rf"\.{_UUID}\.parquet{_TEMP}")
CHUNK_PATH = re.compile(rf"[0-9]+/[0-9]+/[0-9]+/{_UUID}\.parquet")
"""A chunk's whole relative path, as `chunk_path` builds it."""

COMPACTED_SUFFIX = ".compacted.parquet"
"""Compaction names its outputs `<uuid>.compacted.parquet`, so a sweep knows a stray one from a write's or a
persist's file in flight (which it must never touch)."""
COMPACTED_FILE = re.compile(rf"\.?{_UUID}\.compacted\.parquet({_TEMP})?")
"""A compaction output, or its temporary."""

BULK_STAGING = "_bulk"
"""The warehouse folder holding bulk loads' staging folders (never a database id: those are digits)."""
BULK_LOAD_ID = re.compile(r"[0-9a-f]{32}")
BULK_MANIFEST = "manifest.json"
"""In a load's staging folder: the chunk paths the load moves its files to, written before the first move."""
BULK_LOADS = "_loads"
"""On an object store, the warehouse folder of bulk loads' chunks, one folder per load: a task cannot know the
catalog ids a chunk's usual path is built from, and a store cannot rename, so the chunk stays at the key its task
put it under and its catalog row names that key. Kept apart from `_bulk` (local staging, removed whole once its
load is dead): these keys are chunks, live once their load commits; one no row names is a killed or failed load's
orphan, which only the sweep of unreferenced objects removes, after the grace period."""
BULK_CHUNK_PATH = re.compile(rf"{BULK_LOADS}/[0-9a-f]{{32}}/{_UUID}\.parquet")
"""A bulk load's chunk on an object store, as `bulk_load_folder` and `bulk_chunk_name` build it."""


def partition_folder(db_id: int, table_id: int, partition_id: int) -> str:
    """`<db id>/<table id>/<partition id>`: every file of the partition lies directly in it."""
    return f"{db_id}/{table_id}/{partition_id}"


def chunk_path(db_id: int, table_id: int, partition_id: int) -> str:
    """`<db id>/<table id>/<partition id>/<uuid>.parquet`: built from catalog ids, never from names."""
    return f"{partition_folder(db_id, table_id, partition_id)}/{uuid.uuid4()}.parquet"


def compacted_path(db_id: int, table_id: int, partition_id: int) -> str:
    """A fresh compaction output's path: `<uuid>.compacted.parquet` in the partition's folder."""
    return f"{partition_folder(db_id, table_id, partition_id)}/{uuid.uuid4()}{COMPACTED_SUFFIX}"


def object_id(rel: str) -> str:
    """The catalog's `object_id` of a file: the uuid its name starts with."""
    return rel.rpartition("/")[2].split(".")[0]  # string operations: a sweep asks this of every file it lists


def new_load_id() -> str:
    return uuid.uuid4().hex


def bulk_staging(root: Path, load_id: str) -> Path:
    """A bulk load's staging folder."""
    return root / BULK_STAGING / load_id


def bulk_load_folder(load_id: str) -> str:
    """`_loads/<load id>`: where a load's tasks put its chunks on an object store (relative to the warehouse)."""
    return f"{BULK_LOADS}/{load_id}"


def bulk_chunk_name() -> str:
    """A fresh name for a bulk load's chunk on an object store, in its load's folder: `<uuid>.parquet`."""
    return f"{uuid.uuid4()}.parquet"


def bulk_staged_name(file_index: int, range_index: int, n: int) -> str:
    """The `n`th chunk a bulk load's task stages for one byte range of one input file, in the load's staging
    folder: unique within the load, and in input order when sorted."""
    return f"{file_index:06d}-{range_index:06d}-{n:04d}.parquet"


def temp_path(path: Path) -> Path:
    """Where `path` is written before it is renamed into place: hidden, beside it, unique."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")


# --- writing files ------------------------------------------------------------------------------------------------


def _parquet_writer_options(table: pa.Table, dictionary: Sequence[str] | None) -> dict[str, object]:
    """The one way chunk files are encoded. `dictionary`: the columns to dictionary-encode; by default the string
    columns (tags, string fields) and `__write_order` (a merged file's per-row write orders: a few distinct values)
    only. Tried on float or integer columns of measurements (nearly all values distinct) a dictionary falls back to
    plain after filling a dictionary page, which made the write about 3x slower and the file larger."""
    names = set(table.column_names)  # a set: a list would make a wide table's write quadratic
    if dictionary is None:
        dictionary = [f.name for f in table.schema if pa.types.is_string(f.type) or f.name == WRITE_ORDER
                      or pa.types.is_large_string(f.type) or pa.types.is_dictionary(f.type)]
    return {"compression": "zstd", "use_dictionary": [c for c in dictionary if c in names]}


def _encode_parquet(table: pa.Table, sink: object, metadata: Mapping[str, str] | None,
                    dictionary: Sequence[str] | None, store_schema: bool) -> None:
    if metadata:
        existing = table.schema.metadata or {}
        table = table.replace_schema_metadata({**existing, **{k.encode(): v.encode() for k, v in metadata.items()}})
    with pq.ParquetWriter(sink, table.schema, store_schema=store_schema,
                          **_parquet_writer_options(table, dictionary)) as writer:
        writer.write_table(table)
        if metadata and not store_schema:  # otherwise the schema's metadata carries it
            writer.add_key_value_metadata(dict(metadata))


def write_parquet_atomic(table: pa.Table, path: Path, *, metadata: Mapping[str, str] | None = None,
                         dictionary: Sequence[str] | None = None, store_schema: bool = True,
                         fsync: bool = True) -> int:
    """A local file: write aside, fsync, then rename into place. Returns the file size. `store_schema=False`
    leaves Arrow's own schema out of the file: readers then take the types from the Parquet schema, so a table
    holding dictionary-encoded strings is read back as plain strings (the file is the same Parquet either way).
    `fsync=False`: the caller syncs the file before anything relies on it (`Staged.write_parquet`, whose
    transaction syncs its files together before the COMMIT)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        _encode_parquet(table, tmp, metadata, dictionary, store_schema)
        if fsync:
            _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path.stat().st_size


def put_parquet(root: Root, rel: str, table: pa.Table, *, metadata: Mapping[str, str] | None = None,
                dictionary: Sequence[str] | None = None, store_schema: bool = True, fsync: bool = True) -> int:
    """`table` as the Parquet file `rel` under `root`, encoded as every chunk file is, put once: on a local
    folder `write_parquet_atomic`; on a store one object written whole under its final (fresh) name, which no
    reader finds before a catalog row names it. Returns the file size."""
    if root.is_local:
        return write_parquet_atomic(table, root.local_path / rel, metadata=metadata, dictionary=dictionary,
                                    store_schema=store_schema, fsync=fsync)
    sink = pa.BufferOutputStream()
    _encode_parquet(table, sink, metadata, dictionary, store_schema)
    return root.put_bytes(sink.getvalue().to_pybytes(), rel)


def _fsync(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def fsync_all(paths: Sequence[Path]) -> None:
    """fsync many files at once: from a few threads, so the file system commits them together (one journal
    commit for many files) instead of one after another."""
    if len(paths) < 2:
        for path in paths:
            _fsync(path)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(16, len(paths))) as pool:
        list(pool.map(_fsync, paths))


def write_json_atomic(data: object, path: Path) -> None:
    """`data` as JSON at `path`, written aside and renamed into place: a reader (a caller waiting for a Spark job's
    report, the `iox_compact` run summing its batches') finds the whole of it or nothing."""
    tmp = temp_path(path)
    try:
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def warehouse_of(given: Root | Path | None) -> Root:
    """The warehouse a command works in: `given` (a test's or a caller's folder or root), else IOX_WAREHOUSE."""
    if given is None:
        from iox_planner.config import warehouse_root

        return warehouse_root()
    return local_root(given) if isinstance(given, Path) else given


@dataclass
class Staged:
    """Files written during a command under `root` (the warehouse, local or on a store), removed if the catalog
    transaction does not commit."""

    root: Root
    rels: list[str] = field(default_factory=list)
    """Every file put so far, relative to the root."""

    unsynced: list[Path] = field(default_factory=list)
    """Local files written by `write_parquet` and not yet synced to disk: `sync` (and the transaction's COMMIT)
    does. A store's put is durable when it returns."""

    def add(self, rel: str) -> None:
        """Count a file the caller puts itself as staged (removed on rollback)."""
        self.rels.append(rel)

    def rollback(self) -> None:
        for rel in self.rels:
            with contextlib.suppress(Exception):  # a store gone away keeps the orphan: the sweep takes it later
                self.root.delete(rel)

    def write_parquet(self, table: pa.Table, rel: str, **options: object) -> int:
        """`put_parquet` to `rel` under the root, staged, a local file's fsync left to `sync`; the file size."""
        self.rels.append(rel)
        size = put_parquet(self.root, rel, table, fsync=False, **options)  # type: ignore[arg-type]
        if self.root.is_local:
            self.unsynced.append(self.root.local_path / rel)
        return size

    def sync(self) -> None:
        """fsync every local file `write_parquet` wrote, all at once: before a COMMIT makes a catalog row name
        them."""
        fsync_all(self.unsynced)
        self.unsynced = []

    @contextlib.contextmanager
    def transaction(self, catalog: Catalog, conn: Connection | None = None) -> Iterator[Connection]:
        """`catalog.engine.begin()` that removes the staged files when the transaction rolls back. An error from
        the COMMIT itself leaves them: the connection may have dropped after Postgres committed, and a file a
        committed row names must never go. If it did not commit, they are files no row names, which the
        grace-period sweep (`maintenance/sweeps.py` `sweep_unreferenced`) removes. `conn`: run the transaction on
        this connection (one that holds a session lock the transaction relies on) instead of a fresh one."""
        with contextlib.ExitStack() as stack:
            if conn is None:
                conn = stack.enter_context(catalog.engine.connect())
            trans = conn.begin()
            try:
                yield conn
            except BaseException:
                with contextlib.suppress(Exception):  # a dead connection cannot roll back, nor commit
                    trans.rollback()
                self.rollback()
                raise
            try:
                self.sync()
            except BaseException:
                with contextlib.suppress(Exception):
                    trans.rollback()
                self.rollback()
                raise
            trans.commit()


# --- what the catalog names ---------------------------------------------------------------------------------------


NAMED_BATCH = 1000
"""How many paths one catalog lookup asks about (`named_paths`): a sweep of a large warehouse costs a query per
this many candidate files, never one per file."""


def named_paths(catalog: Catalog, rels: Sequence[str]) -> set[str]:
    """Those of `rels` a catalog row, live or retired, names: one statement per `NAMED_BATCH` paths, each on a
    connection of its own, so a row committed a moment ago counts (the sweeps ask just before deleting). Asked by
    `object_id`, the uuid every file's name starts with (`object_id`; unique and indexed, where `path` is not):
    a name without one is never a row's. A catalog error propagates: the caller keeps every file it could not ask
    about."""
    found: set[str] = set()
    for start in range(0, len(rels), NAMED_BATCH):
        batch = set(rels[start:start + NAMED_BATCH])
        ids = sorted({object_id(rel) for rel in batch if _UUID_NAME.fullmatch(object_id(rel))})
        if not ids:
            continue
        wanted = sa.bindparam("ids", ids, type_=pg.ARRAY(pg.UUID(as_uuid=False)))
        query = sa.union_all(*(sa.select(ct.c.path).where(ct.c.object_id == sa.any_(wanted))
                               for ct in (parquet_files, ingester_chunks)))
        with catalog.engine.connect() as conn:
            found.update(path for path in conn.execute(query).scalars() if path in batch)
    return found


def partition_paths(conn: Connection, partition_id: int) -> set[str]:
    """Every path the catalog names in one partition, live or retired."""
    found: set[str] = set()
    for ct in (parquet_files, ingester_chunks):
        found.update(conn.execute(sa.select(ct.c.path).where(ct.c.partition_id == partition_id)).scalars())
    return found
