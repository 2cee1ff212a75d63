"""Compaction's settings: the cold age, L2 file size, a task's row budget and the minimum parallelism, each read
from its `IOX_COMPACT_*` variable (config.py declares their defaults and bounds)."""

from __future__ import annotations

from dataclasses import dataclass

from iox_planner import config


PARALLEL_SLICE_ROWS = 65_536
"""A partition is cut into `min_slices` tasks only while each keeps at least this many rows: below that a second
Spark task costs more than it saves."""


@dataclass(frozen=True)
class CompactSettings:
    cold_seconds: int = config.COMPACT_COLD_SECONDS.default
    """A partition whose newest chunk is this old is cold: its L1 files may become L2."""
    target_rows: int = config.COMPACT_TARGET_ROWS.default
    """Rows of an L2 file (and the size below which an L1 file counts as small)."""
    max_rows: int = config.COMPACT_MAX_ROWS.default
    """Memory budget: at most about this many input rows are held by one task at a time (one time slice; a task
    merges its slices one after the other)."""
    min_slices: int = config.COMPACT_MIN_SLICES.default
    """Parallelism: a large partition is cut into at least this many time slices (Spark tasks run at once)."""

    @staticmethod
    def from_env() -> CompactSettings:
        return CompactSettings(config.COMPACT_COLD_SECONDS.read(), config.COMPACT_TARGET_ROWS.read(),
                               config.COMPACT_MAX_ROWS.read(), config.COMPACT_MIN_SLICES.read())
