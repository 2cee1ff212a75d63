"""Time slices of a dedup group: where one wide overlap may be cut so that its pieces merge independently.

Rows with different `time` are never duplicates (the primary key holds `time`), so any cut between two nanoseconds
splits a dedup group into pieces that deduplicate alone and give, together, exactly the group's answer. The only
question is where to cut so that no piece holds more than a budget of rows; the catalog knows each chunk's time
range and row count, not how rows spread inside it, so the estimate spreads each chunk's rows evenly over its range.
A single nanosecond is never cut: if more than the budget share one timestamp, that slice is over budget.

One module for the planner's dedup slicing and compaction's, so both cut the same way (base layer: no imports).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class Span:
    """What the catalog knows of one chunk: inclusive time range and row count."""

    min_time: int
    max_time: int
    rows: int


def time_slices(spans: Iterable[Span], max_rows: int, max_slices: int = 4096) -> list[tuple[int, int]]:
    """Contiguous inclusive `(start, end)` slices covering the spans' whole time range, each estimated to hold at
    most `max_rows` rows (more only inside one nanosecond), at most `max_slices` of them (the budget is raised
    evenly when the estimate would need more). One slice when everything fits; none for no spans."""
    items = [s for s in spans]
    if not items:
        return []
    if max_rows < 1 or max_slices < 1:
        raise ValueError("max_rows and max_slices must be at least 1")
    for s in items:
        if s.max_time < s.min_time or s.rows < 0:
            raise ValueError(f"invalid span {s}")
    low = min(s.min_time for s in items)
    high = max(s.max_time for s in items)
    total = sum(s.rows for s in items)
    budget = max(max_rows, -(-total // max_slices))
    if total <= budget:
        return [(low, high)]

    # Piecewise-constant density: at each breakpoint the rows per nanosecond change by a span's share.
    deltas: dict[int, float] = {}
    for s in items:
        width = s.max_time - s.min_time + 1
        density = s.rows / width
        deltas[s.min_time] = deltas.get(s.min_time, 0.0) + density
        deltas[s.max_time + 1] = deltas.get(s.max_time + 1, 0.0) - density
    points = sorted(deltas)

    slices: list[tuple[int, int]] = []
    start = low
    filled = 0.0
    density = 0.0
    for here, nxt in zip(points, points[1:]):
        density += deltas[here]
        if density <= 1e-12:
            continue
        position = max(here, start)
        while position < nxt:
            room = budget - filled
            width_left = nxt - position
            if density * width_left <= room:
                filled += density * width_left
                break
            # Nanoseconds that still fit; at least one, so a slice always advances.
            fit = max(1, int(room // density))
            cut = position + fit - 1
            if cut >= start and cut < high:
                slices.append((start, cut))
                start = cut + 1
            filled = 0.0
            position = cut + 1
    slices.append((start, high))
    return slices


def rows_within(spans: Iterable[Span], lo: int, hi: int) -> int:
    """The estimated rows of `spans` with time in `[lo, hi]`: each span's rows spread evenly over its range, as
    `time_slices` estimates them (rounded up: a span that overlaps the range counts at least one row)."""
    total = 0
    for s in spans:
        start, end = max(lo, s.min_time), min(hi, s.max_time)
        if start <= end:
            total += -(-s.rows * (end - start + 1) // (s.max_time - s.min_time + 1))
    return total
