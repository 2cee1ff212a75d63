"""Finding compaction's work and planning it: which partitions need it now, and for each which files are
rewritten into which level in which independent groups, which are promoted in place, why, and in which time
slices; or why the partition must wait (`Skip`). Read-only: nothing here locks or changes anything."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import sqlalchemy as sa

from iox_planner.catalog.names import check_name, excerpt
from iox_planner.catalog.store import Catalog, ChunkRow
from iox_planner.errors import BadInputError, CatalogError
from iox_planner.maintenance.compact.settings import PARALLEL_SLICE_ROWS, CompactSettings
from iox_planner.model import TIME, ChunkKind, ColumnType
from iox_planner.slicing import Span, time_slices


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


def overlaps(c: ChunkRow, lo: int, hi: int) -> bool:
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
            if not overlaps(c, lo, hi):
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
    return [c for c in l0 if not any(o.id != c.id and overlaps(o, c.min_time, c.max_time) for o in files)]


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
    if len(l0) >= 2 or candidates or any(overlaps(a, b.min_time, b.max_time) for a in l0 for b in l1):
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


# --- finding work -------------------------------------------------------------------------------------------------


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
        check_partition(partition)
    return db_id


_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def check_partition(partition: str) -> None:
    """A partition argument must name a day partition: a real calendar day written `YYYY-MM-DD` (ASCII digits), as
    the partitions' keys are. A day that does not exist (`2024-02-30`) names no partition, so it is refused rather
    than matching nothing."""
    if not _DAY.fullmatch(partition):
        raise BadInputError(f"--partition {excerpt(partition)} is not a partition key; give a UTC day, "
                            "YYYY-MM-DD")
    try:
        dt.date.fromisoformat(partition)
    except ValueError:
        raise BadInputError(f"--partition {excerpt(partition)} is not a UTC calendar day (no such date); give a "
                            "day that exists, YYYY-MM-DD") from None


def dry_run(catalog: Catalog, db: str, *, table: str | None = None, partition: str | None = None,
            settings: CompactSettings | None = None, only: Sequence[int] | None = None) -> list[PartitionPlan | Skip]:
    """The compaction plan (`only`: of these partition ids), read in one short read-only transaction: nothing is
    locked, written or changed."""
    settings = settings or CompactSettings.from_env()
    with catalog.engine.connect() as conn:
        db_id = check_target(catalog, conn, db, table, partition)
        return find_work(catalog, conn, db_id, settings, table=table, partition=partition, only=only)


def left_overlapping(catalog: Catalog, db: str, partition_ids: Sequence[int],
                     settings: CompactSettings | None = None) -> list[int]:
    """Which of `partition_ids` (those a persist just wrote) compaction would rewrite now: their files overlap, so
    queries deduplicate them until a compaction. Partitions whose new files only need a promotion (a catalog
    update; queries do not pay for them) and partitions that must wait (`Skip`) are left to the scheduled run."""
    if not partition_ids:
        return []
    return sorted(p.partition_id for p in dry_run(catalog, db, settings=settings, only=partition_ids)
                  if isinstance(p, PartitionPlan) and p.inputs)
