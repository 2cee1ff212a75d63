"""Chunk files read through the warehouse's own filesystem (pyarrow's), inside Spark's Python workers.

Spark's Parquet reader needs Hadoop's S3 connector to read an `s3://` warehouse; these readers need only pyarrow,
so a chunk file is read the same way wherever Spark runs its tasks (in-process, spark-submit, a standalone
cluster, the Connect server). The warehouse travels as its URI text (`objectstore.Root`); each worker builds its
own filesystem from its own AWS_* environment, so no credential crosses a process boundary.

A file is opened with the size the catalog recorded, so the store sees no HEAD: one ranged GET reads its footer
and the pruned row groups' column chunks follow (only the columns asked for, only the row groups whose statistics
the time bounds do not rule out). A file the store lacks, or that is not Parquet, fails naming its chunk; a store
that does not answer fails with the retryable `StoreUnavailableError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Literal, Mapping, Sequence

from iox_planner.errors import CatalogError
from iox_planner.model import CHUNK_ORDER, ORDER_SHIFT, TIME, WRITE_ORDER, WRITE_SEQ, Chunk, ChunkKind, ColumnType
from iox_planner.objectstore import Root, parse_root, store_errors

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as pads

ARROW_TYPE_NAMES: Mapping[str, str] = {
    ColumnType.TAG.value: "string",
    ColumnType.FLOAT.value: "double",
    ColumnType.INTEGER.value: "int64",
    ColumnType.UNSIGNED.value: "decimal128(20, 0)",
    ColumnType.BOOLEAN.value: "bool",
    ColumnType.STRING.value: "string",
    ColumnType.TIME.value: "int64",
}
"""The Arrow type a column of each catalog type leaves a worker as: Spark's type for it (model.SPARK_SQL_TYPES;
unsigned as DECIMAL(20, 0), time as int64 nanoseconds)."""


def arrow_type(ctype: str) -> "pa.DataType":
    import pyarrow as pa

    name = ARROW_TYPE_NAMES[ctype]
    return pa.decimal128(20, 0) if name.startswith("decimal") else pa.type_for_alias(name)


@dataclass(frozen=True)
class FileRef:
    """One chunk file as a worker reads it: the chunk's id (for messages), its path under the warehouse, its order,
    whether it is an ingester chunk (rows carry their write position), and its size (None: unknown)."""

    chunk: str
    rel: str
    order: int
    ingester: bool
    size: int | None

    def to_json(self) -> list[Any]:
        return [self.chunk, self.rel, self.order, self.ingester, self.size]

    @staticmethod
    def from_json(item: Sequence[Any]) -> FileRef:
        chunk, rel, order, ingester, size = item
        return FileRef(str(chunk), str(rel), int(order), bool(ingester), None if size is None else int(size))


def file_refs(chunks: Sequence[Chunk]) -> list[FileRef]:
    """The chunks' files; a chunk without one (metadata only) is a catalog error."""
    refs = []
    for chunk in chunks:
        if chunk.path is None:
            raise CatalogError(f"chunk {chunk.id} has no file (metadata only); it cannot be read")
        refs.append(FileRef(chunk.id, chunk.path, chunk.order, chunk.kind is ChunkKind.INGESTER,
                            chunk.file_size))
    return refs


def time_filter(bounds: Sequence[int | None]) -> "pads.Expression | None":
    """Inclusive time bounds as a dataset filter: rows outside are dropped and row groups whose `time` statistics
    lie outside are never fetched."""
    import pyarrow.dataset as pads

    low, high = bounds
    found = None
    if low is not None:
        found = pads.field(TIME) >= low
    if high is not None:
        upper = pads.field(TIME) <= high
        found = upper if found is None else found & upper
    return found


class OpenFile:
    """One chunk file opened for reading: its footer read once (`names`), then its rows (`read`)."""

    def __init__(self, root: Root, ref: FileRef, dictionary: Sequence[str] = ()) -> None:
        import pyarrow.dataset as pads

        self.root, self.ref = root, ref
        self.where = root.uri_of(ref.rel)
        self.format = pads.ParquetFileFormat(
            read_options=pads.ParquetReadOptions(dictionary_columns=list(dictionary)))
        self.fragment = self.format.make_fragment(root.path(ref.rel), root.filesystem(), file_size=ref.size)
        with self.failures():
            self.names = set(self.fragment.physical_schema.names)

    def failures(self) -> "_FileFailures":
        return _FileFailures(self)

    def batches(self, columns: Sequence[str], bounds: Sequence[int | None],
                batch_size: int = 131_072) -> Iterator["pa.RecordBatch"]:
        """The file's rows with those of `columns` it has (in that order), inside `bounds`."""
        wanted = [c for c in columns if c in self.names]
        with self.failures():
            yield from self.fragment.to_batches(columns=wanted, filter=time_filter(bounds), batch_size=batch_size,
                                                use_threads=True)

    def table(self, columns: Sequence[str], bounds: Sequence[int | None]) -> "pa.Table":
        wanted = [c for c in columns if c in self.names]
        with self.failures():
            return self.fragment.to_table(columns=wanted, filter=time_filter(bounds), use_threads=True)


_MISSING = ("NO_SUCH_KEY", "NoSuchKey", "RESOURCE_NOT_FOUND")
"""How pyarrow's S3 filesystem words a GET of a key the store does not hold (an OSError, not FileNotFoundError)."""
_CORRUPT = ("deserialize thrift", "magic bytes", "Parquet file size")
"""How the Parquet reader words a footer that is not one (some of these come as OSError)."""


def _detail(text: str) -> str:
    """The reader's own reason, without the path it repeats (the message names the file already)."""
    line = text.strip().splitlines()[0] if text.strip() else "no detail"
    return line.rsplit("': ", 1)[-1][:200]


class _FileFailures:
    """A file's read failures in the user's terms: the store not answering is retryable (`store_errors`); a file
    the warehouse lacks, or that is not Parquet, is the catalog's problem, naming the chunk and the file."""

    def __init__(self, opened: OpenFile) -> None:
        self.opened = opened
        self.store = store_errors(opened.root, "read", opened.ref.rel)

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> Literal[False]:
        import pyarrow as pa

        if exc is None:
            return False
        ref, where, text = self.opened.ref, self.opened.where, str(exc)
        if isinstance(exc, FileNotFoundError) or any(sign in text for sign in _MISSING):
            raise CatalogError(f"chunk {ref.chunk}: its file {where} is missing from the warehouse") from None
        if isinstance(exc, pa.ArrowInvalid) or any(sign in text for sign in _CORRUPT):
            raise CatalogError(f"chunk {ref.chunk}: its file {where} is corrupt (not a readable Parquet file: "
                               f"{_detail(text)})") from None
        self.store.__exit__(kind, exc, tb)
        return False


def typed_batch(batch: "pa.RecordBatch", ref: FileRef, columns: Sequence[str],
                types: Mapping[str, str]) -> "pa.RecordBatch":
    """`batch` of `ref`'s file as `columns` with Spark's types: a column the file lacks NULL, the virtual columns
    (`__chunk_order`, `__write_order`) computed from the chunk's order (and an ingester row's write position), as
    `transform.chunk_order_column` and `write_order_column` do for Spark's own reader."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = batch.num_rows
    present = set(batch.schema.names)
    arrays = []
    for name in columns:
        if name == CHUNK_ORDER:
            base = pa.scalar(ref.order << ORDER_SHIFT, pa.int64())
            arrays.append(pc.add(batch.column(WRITE_SEQ).cast(pa.int64()), base) if ref.ingester
                          else pa.repeat(base, rows))
        elif name == WRITE_ORDER:
            own = pa.scalar(ref.order, pa.int64())
            arrays.append(batch.column(name).cast(pa.int64()).fill_null(own)
                          if name in present and not ref.ingester else pa.repeat(own, rows))
        else:
            target = pa.int64() if name == TIME else arrow_type(types.get(name, ColumnType.STRING.value))
            if name in present:
                column = batch.column(name)
                if pa.types.is_dictionary(column.type):
                    column = column.dictionary_decode()
                arrays.append(column if column.type == target else column.cast(target))
            else:
                arrays.append(pa.nulls(rows, target))
    return pa.RecordBatch.from_arrays(arrays, names=list(columns))


def read_files(batches: Iterator["pa.RecordBatch"], root_uri: str, tasks: Sequence[Sequence[Sequence[Any]]],
               columns: Sequence[str], types: Mapping[str, str],
               bounds: Sequence[int | None]) -> Iterator["pa.RecordBatch"]:
    """The body of a scan's `mapInArrow`: for each task id in `batches` (column `id`, an index into `tasks`), the
    rows of that task's files, as `columns` with Spark's types."""
    root = parse_root(root_uri, what="the warehouse")
    stored = [c for c in columns if c not in (CHUNK_ORDER, WRITE_ORDER)]
    for batch in batches:
        for task in batch.column("id").to_pylist():
            for item in tasks[task]:
                ref = FileRef.from_json(item)
                opened = OpenFile(root, ref)
                read = list(stored)
                if CHUNK_ORDER in columns and ref.ingester:
                    read.append(WRITE_SEQ)
                if WRITE_ORDER in columns and not ref.ingester:
                    read.append(WRITE_ORDER)
                for part in opened.batches(read, bounds):
                    yield typed_batch(part, ref, columns, types)


def spread(refs: Sequence[FileRef], slots: int) -> list[list[FileRef]]:
    """`refs` in at most `slots` tasks of about equal bytes (largest first into the lightest task): a task per file
    would cost Spark's per-task overhead on many small files, one task for all would leave cores idle."""
    count = max(1, min(slots, len(refs)))
    tasks: list[list[FileRef]] = [[] for _ in range(count)]
    loads = [0] * count
    for ref in sorted(refs, key=lambda r: -(r.size or 0)):
        lightest = loads.index(min(loads))
        tasks[lightest].append(ref)
        loads[lightest] += ref.size or 1
    return [t for t in tasks if t]
