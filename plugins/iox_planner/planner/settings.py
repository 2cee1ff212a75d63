"""Planner settings: PRODUCT.md's four and the dedup slice budget, with their defaults, read from `IOX_<NAME>` then `--set name=value`."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from typing import Mapping

from iox_planner.errors import BadInputError


@dataclass(frozen=True)
class PlannerSettings:
    """How far the planner splits and fans out. Every value is a positive integer."""

    target_partitions: int = 4
    """Parquet files are dealt into this many file groups (partitions) where their order does not matter."""
    max_dedup_partition_split: int = 10_000
    """More partitions than this under one DeduplicateExec: keep one dedup over all of them."""
    max_dedup_time_split: int = 100
    """More time groups than this under one DeduplicateExec: keep that dedup whole."""
    max_parquet_fanout: int = 40
    """Under a dedup, files get one (sorted) group each up to this many; more are dealt unsorted and sorted."""
    max_dedup_rows_per_slice: int = 1_000_000
    """A dedup group estimated (from chunk row counts) above this many rows is cut into time slices of about this
    many rows each, merged as separate tasks (`slice_dedup_by_time`)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= _CEILINGS[f.name]:
                raise BadInputError(f"planner setting {f.name} must be a whole number from 1 to "
                                    f"{_CEILINGS[f.name]:,}, got {value!r}")

    @staticmethod
    def names() -> list[str]:
        return [f.name for f in fields(PlannerSettings)]

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @staticmethod
    def from_dict(values: Mapping[str, object]) -> PlannerSettings:
        unknown = sorted(set(values) - set(PlannerSettings.names()))
        if unknown:
            raise BadInputError(
                f"unknown planner setting {', '.join(unknown)}; valid settings: {', '.join(PlannerSettings.names())}"
            )
        return PlannerSettings(**values)  # type: ignore[arg-type]

    @staticmethod
    def from_env(overrides: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None) -> PlannerSettings:
        """Defaults, then `IOX_<NAME>` environment variables (e.g. `IOX_TARGET_PARTITIONS`), then `overrides`
        (from `--set name=value`)."""
        env = os.environ if environ is None else environ
        values: dict[str, int] = {}
        for name in PlannerSettings.names():
            var = f"IOX_{name.upper()}"
            if var in env:
                values[name] = _parse(var, env[var])
        for name, text in (overrides or {}).items():
            if name not in PlannerSettings.names():
                raise BadInputError(
                    f"unknown planner setting {name!r} in --set; valid settings: {', '.join(PlannerSettings.names())}"
                )
            values[name] = _parse(f"--set {name}", text)
        return PlannerSettings(**values)


# Past these a plan only grows (groups, slices and lists sized by the setting) without splitting any better: a
# setting of 10**21 would allocate for it before planning anything.
_CEILINGS = {"target_partitions": 10_000, "max_dedup_partition_split": 1_000_000, "max_dedup_time_split": 100_000,
             "max_parquet_fanout": 100_000, "max_dedup_rows_per_slice": 2**62}


def _parse(where: str, text: str) -> int:
    name = where.removeprefix("--set ").removeprefix("IOX_").lower()
    ceiling = _CEILINGS.get(name, 1)
    try:
        value = int(text.strip().replace("_", ""))
    except ValueError:
        value = 0
    if not 1 <= value <= ceiling or not text.strip():
        raise BadInputError(f"{where}={text[:40]!r} is not allowed; {name} takes a whole number from 1 to "
                            f"{ceiling:,}")
    return value


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """`["name=value", ...]` (from repeated `--set`) as a mapping; a pair without `=` is a BadInputError."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise BadInputError(f"--set {pair!r} is not name=value; valid names: {', '.join(PlannerSettings.names())}")
        out[name.strip()] = value
    return out
