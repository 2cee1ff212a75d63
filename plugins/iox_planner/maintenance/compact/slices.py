"""One slice of a compaction: the plain-values task that crosses into a Spark Python worker, the merge it runs
there (read each input's rows of the slice, the one Arrow IOx dedup, put the output once under its fresh name) and
the result it hands back to the driver; and slices bundled into fewer worker tasks (`bundles`), each reading a
file once for all of its slices (`compact_slices`).

The warehouse crosses into the workers as its URI text (a local folder or `s3://BUCKET/PREFIX`, never a
credential): each worker builds its own filesystem from its own environment (`objectstore.Root`) and reads inputs
and puts outputs through it. On a store nothing is renamed: an output is one object under a fresh key, which the
swap's transaction alone makes a chunk."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from iox_planner import storage
from iox_planner.ingest import files as chunk_files
from iox_planner.maintenance.compact.plan import PartitionPlan, overlaps
from iox_planner.model import TIME, ColumnType
from iox_planner.objectstore import Root, store_errors
from iox_planner.slicing import Span, rows_within


@dataclass(frozen=True)
class SliceTask:
    """Plain values only: a task crosses into Spark's Python workers."""

    partition_id: int
    index: int
    lo: int
    hi: int
    inputs: tuple[tuple[str, int], ...]  # (path relative to the warehouse, chunk order)
    columns: tuple[tuple[str, str], ...]  # (name, ColumnType value)
    sort_key: tuple[str, ...]
    output: str  # relative path to write
    rows: int = 0
    """The slice's estimated input rows (`slicing.rows_within`): what `bundles` balances."""


@dataclass(frozen=True)
class SliceResult:
    partition_id: int
    index: int
    output: str
    rows_in: int
    rows_out: int
    min_time: int | None
    max_time: int | None
    file_size: int
    tag_ranges: Mapping[str, tuple[str, str]]


def slice_tasks(plan: PartitionPlan) -> list[SliceTask]:
    cols = tuple((n, t.value) for n, t in plan.columns.items())
    # A slice reads only the inputs overlapping it: the others hold no row of it (and, with several rewrite
    # groups, belong to another group).
    spans = [Span(c.min_time, c.max_time, c.row_count) for c in plan.inputs]
    return [SliceTask(plan.partition_id, i, lo, hi,
                      tuple((c.path, c.order) for c in plan.inputs if overlaps(c, lo, hi)), cols,
                      plan.sort_key, storage.compacted_path(plan.db_id, plan.table_id, plan.partition_id),
                      rows_within(spans, lo, hi))
            for i, (lo, hi) in enumerate(plan.slices)]


def bundles(tasks: Sequence[SliceTask], count: int) -> list[list[SliceTask]]:
    """`tasks` cut into at most `count` runs of consecutive tasks of about equal estimated rows, each run one
    worker task (`compact_slices`). A Spark task costs about 40 ms of CPU (the JVM's scheduling, the Python
    worker's round trip) whatever it does, as much as merging 50 k rows: a compaction of many small slices (one per
    rewrite group) spent more on that than on merging. Slices stay whole (a run holds one slice in memory at a
    time, so the row budget holds) and consecutive (a partition's slices of one rewrite group, in time order)."""
    if count >= len(tasks):
        return [[t] for t in tasks]
    weights = [max(1, t.rows) for t in tasks]
    total = sum(weights)
    out: list[list[SliceTask]] = [[]]
    filled = 0
    for task, weight in zip(tasks, weights):
        # The next run starts where this task's middle passes the runs' equal share so far.
        if out[-1] and len(out) < count and (filled + weight / 2) * count > total * len(out):
            out.append([])
        out[-1].append(task)
        filled += weight
    return out


def compact_slices(tasks: Sequence[SliceTask], root: str) -> list[SliceResult]:
    """A bundle's slices (`bundles`), one after the other, each input decoded once for all of them.

    A file is sorted on its sort key, tags first, so each of its row groups spans about the file's whole time range
    and a Parquet filter on a slice's range prunes none of them: a file overlapping k slices read slice by slice is
    decoded k times (a day re-written in one file, cut into 9 slices, was decoded 9 times). Such a file is read once
    here, its rows split by slice into scratch Arrow files (`_split_input`), and each slice then reads its piece.
    The pieces go to disk, not memory, because the row budget holds one slice at a time: a file's pieces for the
    later slices would each about fill it where the slices were cut by the budget. The scratch folder (in the
    system's temporary folder) is removed when the bundle ends, a piece as soon as its slice is merged, and a killed
    task's by the next bundle that splits a file on that machine (`sweep_scratch`).

    Only where it pays (`_decodes_saved`): a round trip through a scratch file costs about one more decode
    (measured: 4 M rows split in 0.56 s against 1.2 s read slice by slice for 4 slices, the same 0.5 s for 2), so a
    file whose row groups would be decoded at most twice each, or whose row groups each fall in one slice (the
    filter then prunes the others), is read slice by slice as before. Slices of one file in other bundles (tasks
    running at once) read it again: one decode per bundle, at most one per core."""
    warehouse = Root(root)
    shared = {path: users for path, users in _readers(tasks).items()
              if len(users) > 1 and _decodes_saved(warehouse, path, [(tasks[i].lo, tasks[i].hi) for i in users])}
    if not shared:
        return [compact_slice(task, root) for task in tasks]
    import tempfile

    results = []
    sweep_scratch(Path(tempfile.gettempdir()))
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-") as scratch:
        pieces: dict[tuple[str, int], Path | None] = {}
        for i, task in enumerate(tasks):
            for n, (path, users) in enumerate(shared.items()):
                if users[0] == i:  # split before its first slice, one folder per file
                    # Its own table's tags: a bundle may hold slices of several tables (one call, `run.compact`).
                    split = _split_input(warehouse, path, [(tasks[j].lo, tasks[j].hi) for j in users],
                                         _tags(task), Path(scratch) / str(n))
                    pieces.update({(path, j): piece for j, piece in zip(users, split)})
            mine = {path: pieces.pop((path, i)) for path, _ in task.inputs if (path, i) in pieces}
            try:
                results.append(compact_slice(task, root, mine))
            finally:
                for piece in mine.values():
                    if piece is not None:
                        piece.unlink()
    return results


SCRATCH_PREFIX = "iox-compact-"
"""A task's scratch folder in the system's temporary folder: `iox-compact-<pid of the task's process>-<random>`."""


def sweep_scratch(folder: Path) -> list[Path]:
    """Delete the scratch folders in `folder` of processes that are gone (a task killed mid-bundle never removed
    its own), and return them. Only this machine's processes are asked: on a shared temporary folder a live pid of
    another machine's keeps its folder, which costs disk, never a running task its pieces."""
    import re
    import shutil

    gone = []
    for entry in folder.glob(f"{SCRATCH_PREFIX}*"):
        match = re.fullmatch(rf"{re.escape(SCRATCH_PREFIX)}([0-9]+)-.*", entry.name)
        if not match or not entry.is_dir():
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(entry, ignore_errors=True)
            gone.append(entry)
        except (PermissionError, OverflowError):  # alive (another user's) or no pid at all: not ours to judge
            continue
    return gone


def compact_slice(task: SliceTask, root: str, pieces: Mapping[str, Path | None] | None = None) -> SliceResult:
    """Read each input's rows of `[lo, hi]` (a Parquet filter, not the whole file; or its piece, `pieces`: the
    scratch file `compact_slices` split it into, None for no row), merge them with the one Arrow IOx dedup, sort on
    the sort key and put the output once (`storage.put_parquet`: locally aside, then into place; on a store one
    object). An empty slice writes nothing. Tags are read
    dictionary encoded, as Parquet stores them: the merge then sorts and moves integer indices, not strings (a
    third less time for the merge of a TSBS slice)."""
    import pyarrow.compute as pc

    warehouse = Root(root)
    columns = {n: ColumnType(t) for n, t in task.columns}
    tags = _tags(task)
    pieces = pieces or {}
    parts = []
    rows_in = 0
    for path, order in task.inputs:
        if path in pieces:
            piece = pieces[path]
            if piece is None:  # the file has no row in this slice
                continue
            table = _read_piece(piece)
        else:
            table = _read_slice(warehouse, path, task.lo, task.hi, tags)
        rows_in += table.num_rows
        parts.append((order, table))
    if not parts:  # a slice of a rewrite group's gap: no input overlaps it
        return SliceResult(task.partition_id, task.index, task.output, 0, 0, None, None, 0, {})
    # The sort key holds every tag and time (output_sort_key): the dedup's output is already sorted on it. Tags
    # stay dictionary encoded into the writer, which writes Parquet dictionaries from them as they are; the file
    # leaves Arrow's schema out so it reads back as plain strings, like every other file.
    # Each row keeps the order of its key's newest write: the inputs' own, or their file order (a file of one write).
    merged = chunk_files.deduplicate(parts, columns, sort_key=task.sort_key, keep_dictionary=True, write_orders=True)
    if merged.num_rows == 0:
        return SliceResult(task.partition_id, task.index, task.output, rows_in, 0, None, None, 0, {})
    size = storage.put_parquet(warehouse, task.output, merged, metadata={"iox.kind": "parquet"},
                               store_schema=False)
    mm = pc.min_max(merged[TIME]).as_py()
    return SliceResult(task.partition_id, task.index, task.output, rows_in, merged.num_rows, mm["min"], mm["max"],
                       size, chunk_files.tag_ranges(merged, columns))


def _tags(task: SliceTask) -> list[str]:
    return [n for n, t in task.columns if ColumnType(t) is ColumnType.TAG]


def _readers(tasks: Sequence[SliceTask]) -> dict[str, list[int]]:
    """Each input path -> the indices of the tasks reading it, in order."""
    out: dict[str, list[int]] = {}
    for i, task in enumerate(tasks):
        for path, _ in task.inputs:
            out.setdefault(path, []).append(i)
    return out


def _time_ranges(meta: Any, field: int) -> list[tuple[int, int] | None]:
    """Each row group's time range from the file's footer; None for a row group without time statistics."""
    out: list[tuple[int, int] | None] = []
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(field).statistics if field >= 0 else None
        out.append((stats.min, stats.max) if stats is not None and stats.has_min_max else None)
    return out


def _open(warehouse: Root, rel: str) -> Any:
    """The input file `rel` as `pq.ParquetFile`, read through the warehouse's filesystem (on a store, ranged GETs of
    the footer and of the column chunks read); a store's failure is the retryable error."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(warehouse.path(rel), filesystem=warehouse.filesystem())


def _decodes_saved(warehouse: Root, rel: str, ranges: Sequence[tuple[int, int]]) -> bool:
    """Whether reading the file once and splitting it beats a filtered read per range: its row groups (those
    overlapping some range) would be decoded more than twice each on average by the filtered reads."""
    with store_errors(warehouse, "read", rel), _open(warehouse, rel) as pf:
        groups = _time_ranges(pf.metadata, pf.schema_arrow.get_field_index(TIME))
    decodes = touched = 0
    for span in groups:
        hits = len(ranges) if span is None else sum(1 for lo, hi in ranges if span[0] <= hi and span[1] >= lo)
        decodes += hits
        touched += hits > 0
    return decodes > 2 * touched


def _split_input(warehouse: Root, rel: str, ranges: Sequence[tuple[int, int]], tags: Sequence[str],
                 scratch: Path) -> list[Path | None]:
    """The file's rows split by the disjoint time ranges `ranges`, in one pass over the row groups overlapping
    them: for each range the scratch Arrow file holding its rows in file order (so each piece stays sorted on the
    sort key, and "last write wins" within the file stays as it was), or None when it has no row. Tags stay
    dictionary encoded (each batch its own dictionary: an Arrow stream, which allows that)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    order = sorted(range(len(ranges)), key=lambda k: ranges[k][0])
    los = np.array([ranges[k][0] for k in order], dtype=np.int64)
    his = np.array([ranges[k][1] for k in order], dtype=np.int64)
    scratch.mkdir()
    writers: dict[int, Any] = {}
    try:
        with store_errors(warehouse, "read", rel), _open(warehouse, rel) as pf:
            held = set(pf.schema_arrow.names)
            field = pf.schema_arrow.get_field_index(TIME)
            groups = [i for i, span in enumerate(_time_ranges(pf.metadata, field))
                      if span is None or (span[0] <= his[-1] and span[1] >= los[0])]
            reader = pq.ParquetFile(warehouse.path(rel), filesystem=warehouse.filesystem(), metadata=pf.metadata,
                                    read_dictionary=[t for t in tags if t in held])
            for batch in reader.iter_batches(row_groups=groups):
                times = batch.column(TIME).to_numpy()
                slot = np.searchsorted(los, times, side="right") - 1
                inside = slot >= 0
                inside[inside] = times[inside] <= his[slot[inside]]
                for k in np.unique(slot[inside]):
                    rows = batch.filter(pa.array(inside & (slot == k)))
                    if k not in writers:
                        writers[k] = pa.ipc.new_stream(scratch / f"{order[k]}.arrow", rows.schema)
                    writers[k].write_batch(rows)
    finally:
        for writer in writers.values():
            writer.close()
    pieces: list[Path | None] = [None] * len(ranges)
    for k in writers:
        pieces[order[k]] = scratch / f"{order[k]}.arrow"
    return pieces


def _read_piece(piece: Path) -> Any:
    """A scratch file of `_split_input`, memory mapped (uncompressed Arrow: no copy, no decode)."""
    import pyarrow as pa

    return pa.ipc.open_stream(pa.memory_map(str(piece))).read_all()


def _read_slice(warehouse: Root, rel: str, lo: int, hi: int, tags: Sequence[str]) -> Any:
    """The file's rows with time in `[lo, hi]`. When the file's own statistics (its footer, not the catalog) put
    every row group inside the slice, it is read whole, without the row filter (a tenth of a slice's read time);
    otherwise, or when a row group lacks time statistics, the filter decides row by row."""
    import pyarrow.parquet as pq

    with store_errors(warehouse, "read", rel):
        with _open(warehouse, rel) as pf:
            spans = _time_ranges(pf.metadata, pf.schema_arrow.get_field_index(TIME))
            if spans and all(span is not None and lo <= span[0] and span[1] <= hi for span in spans):
                # Only the tags the file has: ParquetFile (unlike read_table) fails on a name it lacks.
                held = set(pf.schema_arrow.names)
                return pq.ParquetFile(warehouse.path(rel), filesystem=warehouse.filesystem(), metadata=pf.metadata,
                                      read_dictionary=[t for t in tags if t in held]).read()
        return pq.read_table(warehouse.path(rel), filesystem=warehouse.filesystem(),
                             filters=[(TIME, ">=", lo), (TIME, "<=", hi)], read_dictionary=tags)


SliceRunner = Callable[[Sequence[SliceTask], Root], Sequence[SliceResult]]
"""Runs `compact_slices` over every task of a call (one Spark job: `spark_jobs/compact_job.py`, the slices bundled
into about one Spark task per core) and returns the results."""
