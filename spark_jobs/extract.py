"""What the executor reads: the checks a chunk file passes before Spark opens it, the chunks and predicates below
a dedup as plain values, and the distinct values of a few columns of a small file (the pass-through split)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from iox_planner.errors import CatalogError
from iox_planner.ingest.dedup import may_meet
from iox_planner.model import Chunk
from iox_planner.planner.nodes import DeduplicateExec, EmptyExec, FilterExec, ParquetExec, PlanNode, RecordBatchesExec
from iox_planner.planner.predicate import Conjunct


def check_file(path: Path, chunk_id: str) -> None:
    """Fail before Spark does, with the file and its chunk named (Spark's own error names neither clearly)."""
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


def read_distinct(path: Path, columns: Sequence[str], limit: int) -> dict[str, set[str | None] | None]:
    """Per column, the distinct values of one Parquet file's string column (None: NULL; a column the file lacks
    is all NULL), or None once a column has more than `limit` of them. Read column by column in batches, so
    memory holds one batch and the values found."""
    with pq.ParquetFile(path) as parquet:
        present = set(parquet.schema_arrow.names)
        found: dict[str, set[str | None] | None] = {}
        for name in columns:
            if name not in present:
                found[name] = {None} if parquet.metadata.num_rows else set()
                continue
            values: set[str | None] = set()
            for batch in parquet.iter_batches(batch_size=1 << 16, columns=[name]):
                values.update(pc.unique(batch.column(0).cast(pa.string())).to_pylist())
                if len(values) > limit:
                    break
            found[name] = values if len(values) <= limit else None
        return found


def share_meeting(path: Path, late_values: Mapping[str, Sequence[str | None]]) -> float:
    """The share of a Parquet file's rows that `dedup.may_meet` keeps for merging (reads only the listed columns)."""
    with pq.ParquetFile(path) as parquet:
        present = [c for c in late_values if c in parquet.schema_arrow.names]
        rows: int = parquet.metadata.num_rows
        if not rows:
            return 0.0
        table = parquet.read(columns=present) if present else pa.table({"_": pa.nulls(rows)})
    return float(may_meet(table, late_values).sum()) / rows
