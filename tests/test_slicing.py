"""Time slices of a dedup group (`slicing.py`): contiguous, covering, within budget by an estimate the test
computes itself (each span's rows spread evenly over its nanoseconds), and never more than asked for."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from iox_planner.slicing import Span, rows_within, time_slices


def estimated_rows(spans: list[Span], start: int, end: int) -> Fraction:
    total = Fraction(0)
    for s in spans:
        overlap = min(end, s.max_time) - max(start, s.min_time) + 1
        if overlap > 0:
            total += Fraction(s.rows * overlap, s.max_time - s.min_time + 1)
    return total


@pytest.mark.parametrize("seed", range(200))
def test_slices_cover_the_range_and_keep_the_budget(seed: int) -> None:
    rng = random.Random(seed)
    spans = []
    for _ in range(rng.randint(1, 12)):
        low = rng.choice([0, 10, 1_000, 86_400_000_000_000]) + rng.randint(0, 5_000)
        width = rng.choice([0, 1, 7, 100, 10_000, 3_600_000_000_000])
        spans.append(Span(low, low + width, rng.randint(0, 50_000)))
    budget = rng.choice([1, 10, 1_000, 20_000, 10**9])
    max_slices = rng.choice([1, 3, 64, 4096])
    slices = time_slices(spans, budget, max_slices)

    assert slices[0][0] == min(s.min_time for s in spans)
    assert slices[-1][1] == max(s.max_time for s in spans)
    for (a0, a1), (b0, _) in zip(slices, slices[1:]):
        assert a1 + 1 == b0
    assert all(start <= end for start, end in slices)
    assert len(slices) <= max_slices + 1  # the raised budget may leave one rounding remainder
    total = sum(s.rows for s in spans)
    allowed = max(budget, -(-total // max_slices))
    for start, end in slices:
        # A slice may exceed the budget only by less than one nanosecond's worth of rows (cuts fall on whole ns).
        densest = max((Fraction(s.rows, s.max_time - s.min_time + 1) for s in spans
                       if s.min_time <= end and s.max_time >= start), default=Fraction(0))
        heaviest_ns = sum(Fraction(s.rows, s.max_time - s.min_time + 1) for s in spans)
        assert estimated_rows(spans, start, end) <= allowed + max(densest, heaviest_ns), (start, end)
    if total <= allowed:
        assert len(slices) == 1


def test_a_group_that_fits_is_one_slice() -> None:
    assert time_slices([Span(5, 10, 3), Span(8, 20, 4)], 7) == [(5, 20)]


def test_an_even_group_is_cut_evenly() -> None:
    assert time_slices([Span(0, 99, 100)], 25) == [(0, 24), (25, 49), (50, 74), (75, 99)]


def test_rows_at_one_nanosecond_stay_together() -> None:
    assert time_slices([Span(7, 7, 1_000)], 10) == [(7, 7)]


def test_nothing_to_slice() -> None:
    assert time_slices([], 10) == []


def test_rows_within_is_the_even_spread_estimate_rounded_up() -> None:
    rng = random.Random(7)
    for _ in range(200):
        spans = []
        for _ in range(rng.randint(1, 5)):
            lo = rng.randint(0, 1000)
            spans.append(Span(lo, lo + rng.randint(0, 500), rng.randint(0, 10_000)))
        start = rng.randint(-100, 1600)
        end = start + rng.randint(0, 800)
        exact = estimated_rows(spans, start, end)
        got = rows_within(spans, start, end)
        # Rounded up per span: at least the estimate, less than one row per span above it.
        assert exact <= got < exact + len(spans), (spans, start, end)
    assert rows_within([Span(10, 19, 100)], 0, 9) == 0
    assert rows_within([Span(10, 19, 100)], 15, 15) == 10
