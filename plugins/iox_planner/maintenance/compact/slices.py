"""One slice of a compaction: the plain-values task that crosses into a Spark Python worker, the merge it runs
there (read each input's rows of the slice, the one Arrow IOx dedup, write the output aside, then into place) and
the result it hands back to the driver; and slices bundled into fewer worker tasks (`bundles`, `compact_slices`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from iox_planner import storage
from iox_planner.ingest import files as chunk_files
from iox_planner.maintenance.compact.plan import PartitionPlan, overlaps
from iox_planner.model import TIME, ColumnType
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
    """A bundle's slices (`bundles`), one after the other. A file overlapping several of them is read by each
    (filtered to its range), not once for all: holding its rows for the later slices beside the current one's would
    break the row budget where the slices were cut by it (each then about fills it), and slices cut for parallelism
    mostly fall into different tasks, which run at once."""
    return [compact_slice(task, root) for task in tasks]


def compact_slice(task: SliceTask, root: str) -> SliceResult:
    """Read each input's rows of `[lo, hi]` (a Parquet filter, not the whole file), merge them with the one Arrow
    IOx dedup, sort on the sort key and write the output aside, then into place. An empty slice writes nothing.
    Tags are read dictionary encoded, as Parquet stores them: the merge then sorts and moves integer indices, not
    strings (a third less time for the merge of a TSBS slice)."""
    import pyarrow.compute as pc

    columns = {n: ColumnType(t) for n, t in task.columns}
    tags = [n for n, t in columns.items() if t is ColumnType.TAG]
    parts = []
    rows_in = 0
    for path, order in task.inputs:
        table = _read_slice(Path(root) / path, task.lo, task.hi, tags)
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
    size = storage.write_parquet_atomic(merged, Path(root) / task.output, metadata={"iox.kind": "parquet"},
                                        store_schema=False)
    mm = pc.min_max(merged[TIME]).as_py()
    return SliceResult(task.partition_id, task.index, task.output, rows_in, merged.num_rows, mm["min"], mm["max"],
                       size, chunk_files.tag_ranges(merged, columns))


def _read_slice(path: Path, lo: int, hi: int, tags: Sequence[str]) -> Any:
    """The file's rows with time in `[lo, hi]`. When the file's own statistics (its footer, not the catalog) put
    every row group inside the slice, it is read whole, without the row filter (a tenth of a slice's read time);
    otherwise, or when a row group lacks time statistics, the filter decides row by row."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as pf:
        meta = pf.metadata
        field = pf.schema_arrow.get_field_index(TIME)
        inside = field >= 0 and meta.num_row_groups > 0
        for i in range(meta.num_row_groups):
            if not inside:
                break
            stats = meta.row_group(i).column(field).statistics
            inside = (stats is not None and stats.has_min_max and lo <= stats.min and stats.max <= hi)
        if inside:
            # Only the tags the file has: ParquetFile (unlike read_table) fails on a name it lacks.
            held = set(pf.schema_arrow.names)
            return pq.ParquetFile(path, metadata=meta, read_dictionary=[t for t in tags if t in held]).read()
    return pq.read_table(path, filters=[(TIME, ">=", lo), (TIME, "<=", hi)], read_dictionary=tags)


SliceRunner = Callable[[Sequence[SliceTask], Path], Sequence[SliceResult]]
"""Runs `compact_slice` over every task of a call (one Spark job: `spark_jobs/compact_job.py`, the slices bundled
into about one Spark task per core) and returns the results."""
