"""Compaction: which partitions need it, the plan of each (inputs, level, time slices), one slice's merge (run in
Spark's Python workers) and the catalog swap. The Spark side is `spark_jobs/compact_job.py`; this module has no
pyspark.

Levels, as in IOx: persist writes L0 files (may overlap anything). Hot compaction promotes a partition's L0 files
that overlap no other file to L1 in place (a catalog update of the level: same file, order and rows) and rewrites
the other L0 files (with the L1 files they overlap) into L1 files, in independent groups; L1 files never overlap
each other; cold compaction rewrites the L1 files
of a partition quiet for `IOX_COMPACT_COLD_SECONDS` into L2 files of about `IOX_COMPACT_TARGET_ROWS` rows.

Exactness: the inputs are merged with PRODUCT.md's dedup (`files.deduplicate`), cut by time (`slicing.time_slices`,
the planner's rule; rows of different nanoseconds are never duplicates, so slices merge alone) and every output
takes the newest input's order. That is only right when no chunk left outside has an order between the inputs'
orders and a time range overlapping them (the merge would lift old input rows above it): such a file is pulled
into the compaction, such an ingester chunk (persist's job, never ours) makes the partition's rewrite wait;
its promotions, which give no row a new order, go ahead alone (`plan_partition` says why that is exact).

Atomicity: one partition's outputs are staged as `<uuid>.compacted.parquet` files, then ONE transaction re-checks
that the inputs are still live and nothing misordered appeared, registers the outputs and retires the inputs (the
grace period keeps them readable for queries planned before). That transaction runs in the session holding the
partition's compaction lock and first checks it still does: the lock is what keeps the stray sweep off the staged
outputs. Otherwise nothing is registered and the staged outputs are deleted. A killed compaction leaves strays only, swept under the partition's compaction lock by the
next compaction or persist (`persist.sweep_compaction_strays`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import sqlalchemy as sa

from iox_planner.catalog.names import check_name, excerpt
from iox_planner.catalog.store import Catalog, ChunkRow
from iox_planner.config import env_int, warehouse as default_warehouse
from iox_planner.errors import BadInputError, CatalogError, CatalogUnavailableError
from iox_planner.ingest import files as storage
from iox_planner.ingest.persist import COMPACTED_SUFFIX, sweep_locked_partition
from iox_planner.model import LOCAL_STORE, TIME, ChunkKind, ColumnType
from iox_planner.slicing import Span, time_slices
from iox_planner.timeutil import format_time

DEFAULT_COLD_SECONDS = 4 * 3600
DEFAULT_TARGET_ROWS = 5_000_000
DEFAULT_MAX_ROWS = 2_000_000
DEFAULT_MIN_SLICES = 2
PARALLEL_SLICE_ROWS = 65_536
"""A partition is cut into `min_slices` tasks only while each keeps at least this many rows: below that a second
Spark task costs more than it saves."""
_BOUNDS = {
    "IOX_COMPACT_MIN_SLICES": (1, 4096),
    "IOX_COMPACT_COLD_SECONDS": (0, 10 * 365 * 86400),
    "IOX_COMPACT_TARGET_ROWS": (1, 1 << 40),
    "IOX_COMPACT_MAX_ROWS": (1, 1 << 40),
}


def _env_int(name: str, default: int) -> int:
    return env_int(name, default, *_BOUNDS[name])


@dataclass(frozen=True)
class CompactSettings:
    cold_seconds: int = DEFAULT_COLD_SECONDS
    """A partition whose newest chunk is this old is cold: its L1 files may become L2."""
    target_rows: int = DEFAULT_TARGET_ROWS
    """Rows of an L2 file (and the size below which an L1 file counts as small)."""
    max_rows: int = DEFAULT_MAX_ROWS
    """Memory budget: at most about this many input rows are read by one task (one time slice)."""
    min_slices: int = DEFAULT_MIN_SLICES
    """Parallelism: a large partition is cut into at least this many time slices (Spark tasks run at once)."""

    @staticmethod
    def from_env() -> CompactSettings:
        return CompactSettings(_env_int("IOX_COMPACT_COLD_SECONDS", DEFAULT_COLD_SECONDS),
                               _env_int("IOX_COMPACT_TARGET_ROWS", DEFAULT_TARGET_ROWS),
                               _env_int("IOX_COMPACT_MAX_ROWS", DEFAULT_MAX_ROWS),
                               _env_int("IOX_COMPACT_MIN_SLICES", DEFAULT_MIN_SLICES))


# --- planning ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionPlan:
    """One partition's compaction: which files are rewritten into which level, why, cut into which time slices,
    and (hot only) which L0 files are promoted to L1 in place."""

    db_id: int
    table: str
    table_id: int
    partition: str
    partition_id: int
    level: int
    reason: str
    inputs: tuple[ChunkRow, ...]
    """The files rewritten (may be empty when the partition only needs promotions)."""
    slices: tuple[tuple[int, int], ...]
    columns: Mapping[str, ColumnType]
    sort_key: tuple[str, ...]
    promoted: tuple[ChunkRow, ...] = ()
    """L0 files that become L1 by a catalog update only: same file, same order, same rows."""
    groups: tuple[tuple[int, ...], ...] = ()
    """The rewrite's independent groups (chunk ids), each closed on its own (`close_inputs`); empty means one
    group of all inputs."""
    slice_orders: tuple[int, ...] = ()
    """Each slice's output order: the newest input of the slice's group (empty: `order` for every slice)."""
    why: Mapping[int, str] = field(default_factory=dict)
    """Chunk id -> why that file is rewritten or promoted (the dry run's words)."""
    waits: str | None = None
    """Why the partition's rewrite waits (an ingester chunk in a rewrite group's order trap) while its promotions
    go ahead alone; None when nothing waits."""

    @property
    def order(self) -> int:
        return max((c.order for c in self.inputs), default=0)

    @property
    def rows_in(self) -> int:
        return sum(c.row_count for c in self.inputs)

    @property
    def rows_promoted(self) -> int:
        return sum(c.row_count for c in self.promoted)

    def slice_order(self, index: int) -> int:
        return self.slice_orders[index] if self.slice_orders else self.order

    def input_groups(self) -> list[tuple[ChunkRow, ...]]:
        by_id = {c.id: c for c in self.inputs}
        if not self.groups:
            return [self.inputs] if self.inputs else []
        return [tuple(by_id[i] for i in g) for g in self.groups]


@dataclass(frozen=True)
class Skip:
    """A partition that needs work but cannot be compacted now, and why (one sentence)."""

    table: str
    partition: str
    reason: str


def _overlaps(c: ChunkRow, lo: int, hi: int) -> bool:
    return c.min_time <= hi and c.max_time >= lo


def close_inputs(inputs: Sequence[ChunkRow], others: Sequence[ChunkRow], level: int) -> list[ChunkRow] | str:
    """`inputs` grown until the compaction is exact and its outputs cannot overlap a file of their `level`: a
    file overlapping the inputs' time range joins when it is of the output level, or when its order lies between
    the inputs' orders (the order trap). An ingester chunk in the trap cannot join (persist's job): the reason, as
    text, is returned instead."""
    chosen = {c.id: c for c in inputs}
    while True:
        lo = min(c.min_time for c in chosen.values())
        hi = max(c.max_time for c in chosen.values())
        first = min(c.order for c in chosen.values())
        last = max(c.order for c in chosen.values())
        grew = False
        for c in others:
            if c.kind is ChunkKind.PARQUET and c.id in chosen:
                continue
            if not _overlaps(c, lo, hi):
                continue
            between = first <= c.order <= last
            if c.kind is ChunkKind.INGESTER:
                if between:
                    return (f"ingester chunk {c.display_id} (order {c.order}) overlaps the files to compact and its "
                            f"order lies between theirs ({first} to {last}); persist the partition first")
                continue
            if between or c.level == level:
                chosen[c.id] = c
                grew = True
        if not grew:
            return sorted(chosen.values(), key=lambda c: (c.order, c.id))


def output_sort_key(partition_key: Sequence[str] | None, inputs: Sequence[ChunkRow],
                    columns: Mapping[str, ColumnType]) -> tuple[str, ...]:
    """The partition's sort key restricted to the outputs' columns. Loaded files may predate a partition key, or
    hold tags it lacks: those tags go just before time, by name (the same for every slice of the compaction)."""
    base = list(partition_key) if partition_key else list(max(inputs, key=lambda c: c.order).sort_key)
    head = [c for c in base if c in columns and columns[c] is ColumnType.TAG]
    extra = sorted(c for c, t in columns.items() if t is ColumnType.TAG and c not in head)
    return (*head, *extra, TIME)


def promotable(l0: Sequence[ChunkRow], files: Sequence[ChunkRow]) -> list[ChunkRow]:
    """The L0 files whose time range overlaps no other live Parquet file of the partition (of any level): already
    sorted and duplicate-free, they may become L1 as they are (IOx's "upgrade"), never overlapping another L1.

    Ingester chunks do not stop a promotion: it changes no file, no row and no order, only the level, and the
    query planner deduplicates by time overlap and order, never by level (grep: nothing under `planner/` reads
    `level`), so an ingester chunk overlapping a promoted file is merged with it exactly as before. The level
    invariant (L1 files never overlap each other) is about Parquet files only."""
    return [c for c in l0 if not any(o.id != c.id and _overlaps(o, c.min_time, c.max_time) for o in files)]


def rewrite_groups(seeds: Sequence[ChunkRow], chunks: Sequence[ChunkRow],
                   candidates: Sequence[ChunkRow]) -> list[list[ChunkRow]] | str:
    """The rewrite of `seeds` as independent groups, each closed by `close_inputs` on its own (the order trap
    rules unchanged, per group) and merged with any other group its time range overlaps, until stable. Groups
    with disjoint time ranges are separate compactions that happen to share a swap: each group's outputs take
    its own newest order, which is exact for the same reason as one compaction's (no chunk outside a group
    overlaps it with an order between its inputs'). The promotion `candidates` count as the L1 files they will
    be: a group overlapping one pulls it in (its outputs would overlap an L1), so promoted files and outputs never
    overlap. Returns the reason as text when an ingester chunk is in a group's order trap."""
    ids = {c.id for c in candidates}
    view = [c._replace(level=1) if c.kind is ChunkKind.PARQUET and c.id in ids else c for c in chunks]
    groups: list[list[ChunkRow]] = [[s] for s in seeds]
    while True:
        closed: list[list[ChunkRow]] = []
        for g in groups:
            got = close_inputs(g, view, 1)
            if isinstance(got, str):
                return got
            closed.append(got)
        closed.sort(key=lambda g: min(c.min_time for c in g))
        merged: list[list[ChunkRow]] = []
        for g in closed:
            if merged and min(c.min_time for c in g) <= max(c.max_time for c in merged[-1]):
                merged[-1] = list({c.id: c for c in merged[-1] + g}.values())
            else:
                merged.append(g)
        if _id_sets(merged) == _id_sets(groups):  # closing only grows groups: equal sets are the fixpoint
            return [sorted(g, key=lambda c: (c.order, c.id)) for g in merged]
        groups = merged


def _id_sets(groups: Sequence[Sequence[ChunkRow]]) -> list[tuple[int, ...]]:
    return sorted(tuple(sorted(c.id for c in g)) for g in groups)


def plan_partition(chunks: Sequence[ChunkRow], quiet_seconds: float, settings: CompactSettings,
                   partition_key: Sequence[str] | None, table_columns: Mapping[str, ColumnType],
                   db_id: int) -> PartitionPlan | Skip | None:
    """The compaction one partition needs now (hot first, cold when quiet), a Skip, or None for no work.

    Hot: the L0 files overlapping no other file are promoted to L1 in the catalog (no Spark, no rewrite); the
    rest are rewritten into L1 files, in independent groups (`rewrite_groups`). When a group is in an ingester
    chunk's order trap (`trap`), the rewrite waits for persist and the promotions go ahead alone (`waits` says
    why); with nothing to promote, the partition waits (a Skip).

    Why a promotion cannot change any query's answer, trap or not: it updates one catalog column, the file's
    level. The file, its rows, its time range and its order stay; a query's answer depends on which chunks are
    live, their rows and their orders (the dedup keeps the newest order's values), and the planner reads no level.
    The trap is a rewrite's hazard only: a rewrite's output takes its newest input's order, which would lift the
    older inputs' rows above the ingester chunk between them; a promotion gives no row a new order. And the level
    invariant holds: a candidate overlaps no other live Parquet file (`promotable`), so no two L1 files overlap
    after it. When the trap clears, the waiting rewrite pulls in any promoted file its range reaches (an L1 file
    of its output level), exactly as it does a candidate now (`rewrite_groups`)."""
    files = [c for c in chunks if c.kind is ChunkKind.PARQUET]
    if not chunks:
        return None
    first = chunks[0]
    l0 = [c for c in files if c.level == 0]
    l1 = [c for c in files if c.level == 1]
    level: int
    candidates = promotable(l0, files)
    why: dict[int, str] = {}
    waits: str | None = None
    if len(l0) >= 2 or candidates or any(_overlaps(a, b.min_time, b.max_time) for a in l0 for b in l1):
        level = 1
        promotable_ids = {c.id for c in candidates}
        seeds = [c for c in l0 if c.id not in promotable_ids]
        groups = rewrite_groups(seeds, chunks, candidates)
        if isinstance(groups, str):
            if not candidates:
                return Skip(first.table, first.partition, groups)
            waits, groups = groups, []  # the rewrite waits; the promotions go ahead alone (docstring: why exact)
        rewritten = {c.id for g in groups for c in g}
        promoted = [c for c in candidates if c.id not in rewritten]
        original = {c.id: c for c in files}
        groups = [[original[c.id] for c in g] for g in groups]
        if waits is None:
            for c in seeds:
                why[c.id] = "rewritten: overlaps another file"
        for g in groups:
            for c in g:
                if c.id in why:
                    continue
                if c.id in promotable_ids:
                    why[c.id] = ("rewritten: overlaps no file, but lies in the time range of a rewrite (its outputs "
                                 "would overlap it as an L1)")
                elif c.level == 1:
                    why[c.id] = "rewritten: an L1 file overlapping the rewrite (the outputs must not overlap it)"
                else:
                    why[c.id] = "rewritten: overlaps the rewrite with an order between its inputs' (the order trap)"
        for c in promoted:
            why[c.id] = "promoted: overlaps no other file (already sorted and duplicate-free)"
        pulled = len(rewritten) - len(seeds)
        reason = (f"hot: {len(l0)} L0 file{'' if len(l0) == 1 else 's'}: {len(promoted)} promoted to L1, "
                  + (f"the rewrite of {len(seeds)} waits" if waits is not None else f"{len(seeds)} rewritten"
                     + (f" (+{pulled} file(s) pulled in)" if pulled else "")))
        budget = settings.max_rows
    else:
        small = [c for c in l1 if c.row_count < settings.target_rows]
        ingester = [c for c in chunks if c.kind is ChunkKind.INGESTER]
        if l0 or ingester or len(small) < 2 or quiet_seconds < settings.cold_seconds:
            return None
        level = 2
        closed = close_inputs(l1, chunks, level)
        if isinstance(closed, str):
            return Skip(first.table, first.partition, closed)
        groups, promoted = [closed], []
        reason = f"cold: quiet for {quiet_seconds:,.0f} s with {len(small)} small L1 files"
        pulled = len(closed) - len(l1)
        if pulled:
            reason += f" (+{pulled} overlapping file(s) pulled in)"
        budget = min(settings.max_rows, settings.target_rows)
    inputs = [c for g in groups for c in g]
    described = inputs or promoted
    columns = {name: table_columns[name] for c in described for name in c.column_names if name in table_columns}
    columns[TIME] = ColumnType.TIME
    rows = sum(c.row_count for c in inputs)
    budget = min(budget, max(PARALLEL_SLICE_ROWS, -(-rows // settings.min_slices)))
    slices: list[tuple[int, int]] = []
    orders: list[int] = []
    for g in groups:
        cut = time_slices([Span(c.min_time, c.max_time, c.row_count) for c in g], budget)
        slices += cut
        orders += [max(c.order for c in g)] * len(cut)
    return PartitionPlan(db_id, first.table, first.table_id, first.partition, first.partition_id, level, reason,
                         tuple(inputs), tuple(slices), columns, output_sort_key(partition_key, described, columns),
                         tuple(promoted), tuple(tuple(c.id for c in g) for g in groups), tuple(orders), why,
                         waits=waits)


NO_REWRITE = "this run makes promotions only (it starts no Spark job); the next run rewrites"


def without_rewrite(plan: PartitionPlan) -> PartitionPlan | Skip:
    """`plan` without its rewrite: its promotions alone (exact on their own, `plan_partition` says why; they
    overlap no file, so none lies in the rewrite's range), or a Skip when it has none."""
    if not plan.inputs:
        return plan
    if not plan.promoted:
        return Skip(plan.table, plan.partition, f"needs a rewrite: {NO_REWRITE}")
    why = {c.id: plan.why[c.id] for c in plan.promoted if c.id in plan.why}
    return dataclasses.replace(plan, reason=f"{plan.reason}; the rewrite waits", inputs=(), slices=(), groups=(),
                               slice_orders=(), why=why, waits=NO_REWRITE)


# --- one slice (runs in a Spark Python worker) ------------------------------------------------------------------


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
    folder = f"{plan.db_id}/{plan.table_id}/{plan.partition_id}"
    cols = tuple((n, t.value) for n, t in plan.columns.items())
    # A slice reads only the inputs overlapping it: the others hold no row of it (and, with several rewrite
    # groups, belong to another group).
    return [SliceTask(plan.partition_id, i, lo, hi,
                      tuple((c.path, c.order) for c in plan.inputs if _overlaps(c, lo, hi)), cols,
                      plan.sort_key, f"{folder}/{uuid.uuid4()}{COMPACTED_SUFFIX}")
            for i, (lo, hi) in enumerate(plan.slices)]


def compact_slice(task: SliceTask, root: str) -> SliceResult:
    """Read each input's rows of `[lo, hi]` (a Parquet filter, not the whole file), merge them with the one Arrow
    IOx dedup, sort on the sort key and write the output aside, then into place. An empty slice writes nothing.
    Tags are read dictionary encoded, as Parquet stores them: the merge then sorts and moves integer indices, not
    strings (a third less time for the merge of a TSBS slice)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

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
    merged = storage.deduplicate(parts, columns, sort_key=task.sort_key, keep_dictionary=True)
    if merged.num_rows == 0:
        return SliceResult(task.partition_id, task.index, task.output, rows_in, 0, None, None, 0, {})
    size = storage.write_parquet_atomic(merged, Path(root) / task.output, metadata={"iox.kind": "parquet"},
                                        store_schema=False)
    mm = pc.min_max(merged[TIME]).as_py()
    return SliceResult(task.partition_id, task.index, task.output, rows_in, merged.num_rows, mm["min"], mm["max"],
                       size, storage.tag_ranges(merged, columns))


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


# --- the swap ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What happened to one partition."""

    table: str
    partition: str
    level: int
    files_in: int
    files_out: int
    rows_in: int
    rows_out: int
    skipped: str | None = None
    files_promoted: int = 0
    """L0 files made L1 in place: not in files_in/rows_in, which count rewritten files only."""
    rows_promoted: int = 0
    waits: str | None = None
    """Done, but the partition's rewrite waits (`PartitionPlan.waits`): its promotions only were made."""

    @property
    def duplicates_removed(self) -> int:
        return self.rows_in - self.rows_out


def swap(catalog: Catalog, conn: sa.Connection, session: int, plan: PartitionPlan, results: Sequence[SliceResult],
         root: Path) -> Outcome:
    """Register the outputs and retire the inputs in ONE transaction on `conn`, the connection whose session
    `session` took the partition's compaction lock, after re-checking:

    - that this very session still holds the lock. The staged outputs are only safe from the stray sweep while it
      does: had the session died during the Spark job (Postgres then drops its locks), a persist could have taken
      the lock and swept them, and rows naming them would be live rows naming missing files. Checked inside the
      transaction, it holds until the COMMIT (the lock goes only with the session, and a session that dies before
      its COMMIT commits nothing);
    - under the partition's row lock (persist's lock: no persist of this partition runs meanwhile), that every
      input is still live and that no chunk now outside the compaction sits in the order trap;
    - that every output file is in place, last thing before the COMMIT.

    On a failed check nothing is registered and the staged outputs are deleted."""
    written = [r for r in results if r.rows_out > 0]
    try:
        with _rollback_only(conn):
            if catalog.backend_pid(conn) != session or not catalog.holds_compaction_lock(conn, plan.partition_id):
                raise _Changed("the catalog session holding the partition's compaction lock was lost during the "
                               "Spark job, so its staged outputs may have been swept")
            catalog.lock_partition(conn, plan.partition_id)
            live = catalog.chunk_rows(conn, plan.db_id, partition_id=plan.partition_id)
            live_files = {c.id for c in live if c.kind is ChunkKind.PARQUET}
            gone = [c.display_id for c in plan.inputs if c.id not in live_files]
            if gone:
                raise _Changed(f"input file(s) {', '.join(gone[:5])} were retired meanwhile by another process")
            live_l0 = {c.id for c in live if c.kind is ChunkKind.PARQUET and c.level == 0}
            lost = [c.display_id for c in plan.promoted if c.id not in live_l0]
            if lost:
                raise _Changed(f"file(s) {', '.join(lost[:5])} to promote were retired or promoted meanwhile")
            _recheck_groups(plan, live)
            layout = storage.column_layout(plan.columns)
            for r in sorted(written, key=lambda r: r.index):
                assert r.min_time is not None and r.max_time is not None
                catalog.insert_chunk(conn, ChunkKind.PARQUET, dict(
                    object_id=Path(r.output).name.split(".")[0], label=None, table_id=plan.table_id,
                    partition_id=plan.partition_id, store=LOCAL_STORE, path=r.output, min_time=r.min_time,
                    max_time=r.max_time, row_count=r.rows_out, file_size=r.file_size, column_names=layout,
                    tag_ranges={k: list(v) for k, v in r.tag_ranges.items()}, chunk_order=plan.slice_order(r.index),
                    sort_key=[c for c in plan.sort_key if c in plan.columns], compaction_level=plan.level,
                ))
            if plan.inputs:
                catalog.retire_chunks(conn, ChunkKind.PARQUET, [c.id for c in plan.inputs])
            if plan.promoted and catalog.promote_files(conn, [c.id for c in plan.promoted], plan.level) \
                    != len(plan.promoted):
                raise _Changed("a file to promote changed meanwhile")
            missing = [r.output for r in written if not (root / r.output).is_file()]
            if missing:
                raise _Changed(f"staged output {missing[0]} is missing")
    except _Changed as changed:
        _remove(root, results)
        return Outcome(plan.table, plan.partition, plan.level, len(plan.inputs), 0, plan.rows_in, 0,
                       skipped=f"skipped: {changed}; nothing was changed, a later run will retry")
    except _CommitFailed as failed:
        raise CatalogUnavailableError(
            f"the catalog connection failed while committing the compaction of {plan.table} {plan.partition}; "
            "it either committed whole or changed nothing, and rerunning compact is safe") from failed
    except sa.exc.DBAPIError as err:
        _remove(root, results)
        if not err.connection_invalidated:
            raise
        # The connection dropped before the COMMIT was sent: nothing committed. Every later swap of this run finds
        # the reconnected session without the lock and skips the same way.
        return Outcome(plan.table, plan.partition, plan.level, len(plan.inputs), 0, plan.rows_in, 0,
                       skipped="skipped: the catalog connection holding the partition's compaction lock dropped; "
                               "nothing was changed, a later run will retry")
    except BaseException:
        _remove(root, results)
        raise
    return Outcome(plan.table, plan.partition, plan.level, len(plan.inputs), len(written),
                   sum(r.rows_in for r in results), sum(r.rows_out for r in results), None,
                   len(plan.promoted), plan.rows_promoted, plan.waits)


def _recheck_groups(plan: PartitionPlan, live: Sequence[ChunkRow]) -> None:
    """Inside the swap, on the live chunks: each rewrite group still closes to itself (no chunk in its order trap,
    no L1 file or file to promote in its time range appeared), and no live L1 or L2 file outside the rewrite
    overlaps a file to promote."""
    ids = {c.id for c in plan.inputs}
    promoted = {c.id for c in plan.promoted}
    view = [c._replace(level=plan.level) if c.kind is ChunkKind.PARQUET and c.id in promoted else c for c in live]
    for group in plan.input_groups():
        closed = close_inputs(group, view, plan.level)
        if isinstance(closed, str):
            raise _Changed(closed)
        if len(closed) != len(group):
            raise _Changed("a file that overlaps the inputs with an order between theirs (or that the outputs "
                           "would overlap) appeared meanwhile")
    for p in plan.promoted:
        for c in live:
            if (c.kind is ChunkKind.PARQUET and c.level > 0 and c.id not in ids and c.id != p.id
                    and _overlaps(c, p.min_time, p.max_time)):
                raise _Changed(f"file {p.display_id} to promote now overlaps L{c.level} file {c.display_id}")


class _Changed(Exception):
    pass


class _CommitFailed(Exception):
    pass


@contextlib.contextmanager
def _rollback_only(conn: sa.Connection) -> Iterator[None]:
    """A transaction on `conn` whose failure BEFORE the commit propagates as is (the caller removes the staged
    outputs), while a failing COMMIT raises `_CommitFailed`: Postgres may have committed before the connection
    dropped, and a file a committed row names must never go. If it did not commit, the outputs are strays, which
    the next compaction or persist sweeps under the partition's lock (`persist.sweep_compaction_strays`)."""
    trans = conn.begin()
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):  # a dead connection cannot roll back
            trans.rollback()
        raise
    try:
        trans.commit()
    except Exception as err:
        raise _CommitFailed(str(err)) from err


def _remove(root: Path, results: Sequence[SliceResult]) -> None:
    for r in results:
        (root / r.output).unlink(missing_ok=True)


# --- the whole run ---------------------------------------------------------------------------------------------


SliceRunner = Callable[[Sequence[SliceTask], Path], Sequence[SliceResult]]


@dataclass
class Report:
    """A compaction run: what each partition got, and the totals PRODUCT.md's summary names."""

    outcomes: list[Outcome] = field(default_factory=list)
    plans: list[PartitionPlan | Skip] = field(default_factory=list)

    @property
    def compacted(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.skipped is None]

    def totals(self) -> dict[str, int]:
        done = self.compacted
        return {
            "partitions": len(done),
            "skipped": len(self.outcomes) - len(done),
            "files_in": sum(o.files_in for o in done),
            "files_out": sum(o.files_out for o in done),
            "rows_in": sum(o.rows_in for o in done),
            "rows_out": sum(o.rows_out for o in done),
            "duplicates_removed": sum(o.duplicates_removed for o in done),
            "files_promoted": sum(o.files_promoted for o in done),
            "rows_promoted": sum(o.rows_promoted for o in done),
        }


def find_work(catalog: Catalog, conn: sa.Connection, db_id: int, settings: CompactSettings, *,
              table: str | None = None, partition: str | None = None,
              only: Sequence[int] | None = None) -> list[PartitionPlan | Skip]:
    """The plan of every partition that needs compaction now (or a Skip saying why it must wait)."""
    out: list[PartitionPlan | Skip] = []
    candidates = catalog.compaction_candidates(conn, db_id, table=table, partition=partition)
    if only is not None:
        candidates = [p for p in candidates if p in set(only)]
    keys = {int(r.id): r.sort_key for r in catalog.partition_rows(conn, db_id, table)}
    columns_of: dict[int, Mapping[str, ColumnType]] = {}
    for pid in candidates:
        chunks = catalog.chunk_rows(conn, db_id, partition_id=pid)
        if not chunks:
            continue
        tid = chunks[0].table_id
        if tid not in columns_of:
            columns_of[tid] = catalog.table_columns(conn, tid)
        found = plan_partition(chunks, catalog.partition_quiet_seconds(conn, pid), settings, keys.get(pid),
                               columns_of[tid], db_id)
        if found is not None:
            out.append(found)
    return out


def check_target(catalog: Catalog, conn: sa.Connection, db: str, table: str | None,
                 partition: str | None) -> int:
    """The database id, after checking the names given (a one-paragraph error for an unknown one)."""
    db_id = catalog.database_id(conn, db)
    if table is not None:
        check_name(table, "table name")
        known = catalog.table_ids(conn, db_id)
        if table not in known:
            names = ", ".join(sorted(known)) or "none"
            raise CatalogError(f"table {excerpt(table)} does not exist in database {db!r} (tables: {names})")
    if partition is not None:
        import re

        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", partition):
            raise BadInputError(f"--partition {excerpt(partition)} is not a partition key; give a UTC day, "
                                "YYYY-MM-DD")
    return db_id


def compact(
    catalog: Catalog,
    db: str,
    run_slices: SliceRunner,
    *,
    table: str | None = None,
    partition: str | None = None,
    only: Sequence[int] | None = None,
    warehouse: Path | None = None,
    settings: CompactSettings | None = None,
    progress: Callable[[str], None] | None = None,
    after_slices: Callable[[], None] | None = None,
    rewrites: bool = True,
) -> Report:
    """Compact every partition of `db` (or of `table`, or the one `partition`; `only`: these partition ids) that
    needs it. Each partition's compaction lock is taken first, for the whole run; a partition another compactor
    holds is skipped with a message. All slices of all locked partitions run as ONE call of `run_slices` (one
    Spark job), then each partition is swapped on its own. `rewrites=False`: promotions only, `run_slices` gets
    no slice (the `iox_compact` DAG's batch that starts no Spark job); a partition that needs a rewrite promotes
    what it can alone (`without_rewrite`) and its rewrite waits for a run that rewrites."""
    root = warehouse or default_warehouse()
    settings = settings or CompactSettings.from_env()
    say = progress or (lambda _line: None)
    report = Report()
    with catalog.engine.connect() as lock_conn:
        db_id = check_target(catalog, lock_conn, db, table, partition)
        wanted = find_work(catalog, lock_conn, db_id, settings, table=table, partition=partition, only=only)
        lock_conn.commit()
        locked: list[int] = []
        session = catalog.backend_pid(lock_conn)
        try:
            for item in wanted:
                if isinstance(item, Skip):
                    continue
                pid = item.partition_id
                if catalog.try_lock_compaction(lock_conn, pid):
                    locked.append(pid)
                else:
                    report.outcomes.append(Outcome(item.table, item.partition, item.level, 0, 0, 0, 0,
                                                   skipped="skipped: another compaction of this partition is "
                                                           "running; it does the work"))
            lock_conn.commit()
            for item in wanted:
                if isinstance(item, Skip):
                    report.plans.append(item)
                    report.outcomes.append(Outcome(item.table, item.partition, 0, 0, 0, 0, 0,
                                                   skipped=f"skipped: {item.reason}"))
            # Planned again under the locks: a compactor that finished just before we locked changed the files.
            plans: list[PartitionPlan] = []
            for pid in locked:
                sweep_locked_partition(catalog, lock_conn, root, pid)
                for item in find_work(catalog, lock_conn, db_id, settings, only=[pid]):
                    if isinstance(item, PartitionPlan) and not rewrites:
                        item = without_rewrite(item)
                    report.plans.append(item)
                    if isinstance(item, PartitionPlan):
                        plans.append(item)
                    else:
                        report.outcomes.append(Outcome(item.table, item.partition, 0, 0, 0, 0, 0,
                                                       skipped=f"skipped: {item.reason}"))
            lock_conn.commit()
            tasks = {p.partition_id: slice_tasks(p) for p in plans}
            everything = [t for p in plans for t in tasks[p.partition_id]]
            if everything:
                say(f"compacting {len(plans)} partition(s) in {len(everything)} slice(s) on Spark")
            try:
                results = list(run_slices(everything, root)) if everything else []
                if after_slices is not None:
                    after_slices()
            except BaseException:
                _remove(root, [SliceResult(t.partition_id, t.index, t.output, 0, 0, None, None, 0, {})
                               for t in everything])
                raise
            by_partition: dict[int, list[SliceResult]] = {}
            for r in results:
                by_partition.setdefault(r.partition_id, []).append(r)
            for i, p in enumerate(plans):
                outcome = swap(catalog, lock_conn, session, p, by_partition.get(p.partition_id, []), root)
                report.outcomes.append(outcome)
                what = outcome.skipped or (
                    f"L{p.level}: {outcome.files_in} file(s), {outcome.rows_in:,} rows -> {outcome.files_out} "
                    f"file(s), {outcome.rows_out:,} rows ({outcome.duplicates_removed:,} duplicates removed); "
                    f"{outcome.files_promoted} file(s), {outcome.rows_promoted:,} rows promoted in place"
                    + (f"; the rewrite waits: {outcome.waits}" if outcome.waits else ""))
                say(f"[{i + 1}/{len(plans)}] {p.table} {p.partition}: {what}")
        finally:
            # A session that died released its locks with it; its connection may not answer (or reconnect without
            # them): the unlock must not hide the run's own error.
            with contextlib.suppress(sa.exc.DBAPIError, sa.exc.InvalidRequestError):
                if lock_conn.in_transaction():
                    lock_conn.rollback()
                for pid in locked:
                    catalog.unlock_compaction(lock_conn, pid)
                lock_conn.commit()
    return report


def describe_plan(item: PartitionPlan | Skip) -> list[str]:
    """The dry run's lines for one partition: which files, which level, why, and how it is sliced."""
    if isinstance(item, Skip):
        return [f"{item.table} {item.partition}: waits ({item.reason})"]
    orders = sorted(set(item.slice_orders)) if item.slice_orders else [item.order]
    order_text = "order " + ", ".join(map(str, orders)) if item.inputs else "no rewrite, no Spark job"
    lines = [f"{item.table} {item.partition}: {len(item.inputs)} file(s), {item.rows_in:,} rows rewritten -> "
             f"L{item.level}, {order_text}; {len(item.promoted)} file(s), {item.rows_promoted:,} rows promoted "
             f"to L{item.level} in place; {item.reason}"]
    for c in item.inputs:
        lines.append(f"  in  {c.display_id} L{c.level} order {c.order}, {c.row_count:,} rows, "
                     f"{format_time(c.min_time)} .. {format_time(c.max_time)}"
                     + (f"; {item.why[c.id]}" if c.id in item.why else ""))
    if item.waits:
        lines.append(f"  the rewrite waits: {item.waits}")
    for c in item.promoted:
        lines.append(f"  promote {c.display_id} L{c.level} -> L{item.level} order {c.order}, {c.row_count:,} rows, "
                     f"{format_time(c.min_time)} .. {format_time(c.max_time)}; {item.why.get(c.id, 'promoted')}")
    if len(item.groups) > 1:
        lines.append(f"  {len(item.groups)} independent rewrite groups (disjoint time ranges, each its own order)")
    if not item.slices:
        pass
    elif len(item.slices) == 1:
        lines.append("  one slice: the inputs fit one task's budget")
    else:
        lines.append(f"  {len(item.slices)} time slices (each task reads at most about its budget of rows):")
        for lo, hi in item.slices:
            lines.append(f"    {format_time(lo)} .. {format_time(hi)}")
    return lines


def dry_run(catalog: Catalog, db: str, *, table: str | None = None, partition: str | None = None,
            settings: CompactSettings | None = None) -> list[PartitionPlan | Skip]:
    """The compaction plan, read in one short read-only transaction: nothing is locked, written or changed."""
    settings = settings or CompactSettings.from_env()
    with catalog.engine.connect() as conn:
        db_id = check_target(catalog, conn, db, table, partition)
        return find_work(catalog, conn, db_id, settings, table=table, partition=partition)


def outcome_note(outcome: Mapping[str, Any]) -> str | None:
    """The line a run's report prints for one outcome of `report_dict` that was skipped or whose rewrite waits
    (the CLI's and the `iox_compact` DAG's report alike); None for a partition compacted in full."""
    where = f"{outcome['table']} {outcome['partition']}"
    if outcome["skipped"]:
        return f"{where}: {outcome['skipped']}"
    if outcome.get("waits"):
        return f"{where}: promoted {outcome['files_promoted']} file(s); the rewrite waits: {outcome['waits']}"
    return None


def report_dict(report: Report) -> dict[str, Any]:
    """A run's report as JSON-ready values (the DAG's per-run report, a spark-submit job's output)."""
    return {**report.totals(), "outcomes": [
        {"table": o.table, "partition": o.partition, "level": o.level, "files_in": o.files_in,
         "files_out": o.files_out, "rows_in": o.rows_in, "rows_out": o.rows_out,
         "files_promoted": o.files_promoted, "rows_promoted": o.rows_promoted, "skipped": o.skipped,
         "waits": o.waits}
        for o in report.outcomes]}
