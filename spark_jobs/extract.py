"""What the executor reads: the checks a chunk file passes before Spark opens it, and the chunks and
predicates below a dedup, as plain values."""

from __future__ import annotations

import os
from pathlib import Path

from iox_planner.errors import CatalogError
from iox_planner.model import Chunk
from iox_planner.objectstore import Root
from iox_planner.planner.nodes import DeduplicateExec, EmptyExec, FilterExec, ParquetExec, PlanNode, RecordBatchesExec
from iox_planner.planner.predicate import Conjunct


def checked_path(root: Root, chunk: Chunk) -> str:
    """The chunk's file in the root's path form, checked where that costs no request: a local file is checked
    before Spark opens it (Spark's own error names neither the file nor the chunk clearly); a file on a store is
    checked by the worker that reads it, which reads its footer once and names the chunk if it is missing or not
    Parquet (`store_read.OpenFile`), so a query costs no request per file on the driver."""
    if chunk.path is None:
        raise CatalogError(f"chunk {chunk.id} has no file (metadata only); it cannot be read")
    path = root.path(chunk.path)
    if root.is_local:
        check_file(Path(path), chunk.id)
    return path


def check_file(path: Path, chunk_id: str) -> None:
    """Fail before Spark does, with the local file and its chunk named."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CatalogError(f"chunk {chunk_id}: its file {path} is missing from the warehouse") from None
    if size < 12:
        raise CatalogError(f"chunk {chunk_id}: its file {path} is not a Parquet file ({size} bytes)")
    with open(path, "rb") as fh:
        head = fh.read(4)
        fh.seek(-4, os.SEEK_END)
        tail = fh.read(4)
    if head != b"PAR1" or tail != b"PAR1":
        raise CatalogError(f"chunk {chunk_id}: its file {path} is corrupt (no Parquet magic bytes)")


def group_inputs(node: PlanNode) -> tuple[list[Chunk], list[Conjunct]]:
    """The chunks under a dedup and the (key-only) conjuncts applied to them on the way, as values."""
    chunks: list[Chunk] = []
    conjuncts: list[Conjunct] = []
    for below in node.walk():
        if isinstance(below, FilterExec):
            conjuncts.extend(below.predicate)
        elif isinstance(below, ParquetExec):
            chunks.extend(below.files())
            conjuncts.extend(below.predicate or ())
        elif isinstance(below, RecordBatchesExec):
            chunks.extend(below.chunks)
        elif isinstance(below, (DeduplicateExec, EmptyExec)):
            raise CatalogError(f"the Spark runner cannot merge a {below.name} below a DeduplicateExec")
    return chunks, conjuncts
