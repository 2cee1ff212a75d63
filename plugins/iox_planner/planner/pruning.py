"""Pruning before planning: drop the chunks the database's retention rules out (a partition or chunk wholly at
or before the cutoff), those a changes read needs no row of (no time where a key was written inside its window),
and those a scan's conjuncts rule out by partition, time range or tag min/max.

Only key columns prune (a conjunct on a key column is true or false for a whole group of duplicates alike);
field values never prune a chunk, since a field's final value comes from the merge of several chunks. For the same
reason a changes read keeps every chunk overlapping where keys were written, whatever its order: an older chunk
still gives those keys the field values no newer write replaced.
"""

from __future__ import annotations

import bisect
from typing import Sequence

from iox_planner.errors import BadInputError
from iox_planner.model import Chunk
from iox_planner.timeutil import partition_bounds
from iox_planner.planner.nodes import ScanPruning
from iox_planner.planner.sql import ScanRequest, TagFilter


def prune(scan: ScanRequest, chunks: Sequence[Chunk], time_min: int | None, time_max: int | None, *,
          retention_cutoff: int | None = None,
          written: Sequence[tuple[int, int]] | None = None) -> tuple[list[Chunk], ScanPruning]:
    """The chunks of `scan` that may hold rows within the inclusive `[time_min, time_max]` and its tag filters,
    after `retention_cutoff` (rows at or before it are excluded) and, for a changes read, overlapping `written`
    (sorted, disjoint inclusive ranges)."""
    kept: list[Chunk] = []
    by_partition = by_time = by_tag = by_retention = by_changes = 0
    partition_ok: dict[str, bool] = {}
    expired: dict[str, bool] = {}
    no_time = time_min is None and time_max is None
    filters = scan.tag_filters
    ends = [r[1] for r in written] if written is not None else []
    for chunk in chunks:
        if retention_cutoff is not None:
            gone = expired.get(chunk.partition)
            if gone is None:
                gone = expired[chunk.partition] = _partition_expired(chunk.partition, retention_cutoff)
            if gone or (chunk.time_max is not None and chunk.time_max <= retention_cutoff):
                by_retention += 1
                continue
        if written is not None and not _overlaps_any(chunk, written, ends):
            by_changes += 1
            continue
        ok = partition_ok.get(chunk.partition)
        if ok is None:
            ok = partition_ok[chunk.partition] = _partition_may_match(chunk.partition, time_min, time_max)
        if not ok:
            by_partition += 1
        elif not no_time and not _time_may_match(chunk, time_min, time_max):
            by_time += 1
        elif filters and not all(_tag_may_match(chunk, f) for f in filters):
            by_tag += 1
        else:
            kept.append(chunk)
    considered = {c.partition for c in chunks}
    remaining = {c.partition for c in kept}
    report = ScanPruning(
        view=scan.view, table=scan.table,
        partitions_considered=len(considered), partitions_pruned=len(considered - remaining),
        chunks_considered=len(chunks), chunks_pruned=len(chunks) - len(kept),
        pruned_by_partition=by_partition, pruned_by_time=by_time, pruned_by_tag=by_tag,
        time_min=time_min, time_max=time_max, pruned_by_retention=by_retention, pruned_by_changes=by_changes,
    )
    return kept, report


def _partition_expired(partition: str, cutoff: int) -> bool:
    """Whether the whole day lies at or before the retention cutoff."""
    try:
        return partition_bounds(partition)[1] <= cutoff
    except BadInputError:  # not a day partition: its chunks' own times decide
        return False


def _overlaps_any(chunk: Chunk, ranges: Sequence[tuple[int, int]], ends: Sequence[int]) -> bool:
    """Whether the chunk's time range (its partition's day when unknown) meets one of the sorted, disjoint
    inclusive `ranges` (`ends`: their ends)."""
    if chunk.time_min is not None and chunk.time_max is not None:
        lo, hi = chunk.time_min, chunk.time_max
    else:
        try:
            lo, hi = partition_bounds(chunk.partition)
        except BadInputError:
            return True
    # The first range ending at or after lo; it meets the chunk iff it starts at or before hi.
    i = bisect.bisect_left(ends, lo)
    return i < len(ranges) and ranges[i][0] <= hi


def _partition_may_match(partition: str, time_min: int | None, time_max: int | None) -> bool:
    if time_min is None and time_max is None:
        return True
    try:
        start, end = partition_bounds(partition)
    except BadInputError:  # not a day partition: cannot tell
        return True
    return (time_max is None or start <= time_max) and (time_min is None or end >= time_min)


def _time_may_match(chunk: Chunk, time_min: int | None, time_max: int | None) -> bool:
    if time_min is not None and time_max is not None and time_min > time_max:
        return False
    if chunk.time_max is not None and time_min is not None and chunk.time_max < time_min:
        return False
    if chunk.time_min is not None and time_max is not None and chunk.time_min > time_max:
        return False
    return True


def _tag_may_match(chunk: Chunk, f: TagFilter) -> bool:
    if f.column not in chunk.columns:
        return False  # the tag is NULL in every row, and NULL matches no comparison
    bounds = chunk.tag_ranges.get(f.column)
    if bounds is None:
        return True
    low, high = bounds
    if f.op == "eq":
        return low <= f.values[0] <= high
    if f.op == "in":
        return any(low <= v <= high for v in f.values)
    value = f.values[0]
    if f.op == "gt":
        return high > value
    if f.op == "gte":
        return high >= value
    if f.op == "lt":
        return low < value
    return low <= value  # lte
