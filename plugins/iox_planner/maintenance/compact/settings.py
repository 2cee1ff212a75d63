"""Compaction's settings: the cold age, L2 file size, a task's row budget and the minimum parallelism, each read
from its `IOX_COMPACT_*` variable within bounds."""

from __future__ import annotations

from dataclasses import dataclass

from iox_planner.config import env_int


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
