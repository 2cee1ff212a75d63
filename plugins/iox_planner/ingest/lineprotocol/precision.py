"""The unit of an input's timestamps (`--precision`): the one list of units, each with its multiplier to
nanoseconds."""

from __future__ import annotations

import enum


class Precision(str, enum.Enum):
    """Unit of the timestamps in the input; the value is the multiplier to nanoseconds."""

    NS = "ns"
    US = "us"
    MS = "ms"
    S = "s"

    @property
    def multiplier(self) -> int:
        return _MULTIPLIERS[self]

    @property
    def unit(self) -> str:
        return _UNIT_NAMES[self]

    @classmethod
    def choices(cls) -> list[str]:
        """The units as a user gives them ("ns", "us", "ms", "s"): for argument choices and messages."""
        return [p.value for p in cls]


_MULTIPLIERS = {Precision.NS: 1, Precision.US: 1_000, Precision.MS: 1_000_000, Precision.S: 1_000_000_000}
_UNIT_NAMES = {
    Precision.NS: "nanoseconds",
    Precision.US: "microseconds",
    Precision.MS: "milliseconds",
    Precision.S: "seconds",
}
