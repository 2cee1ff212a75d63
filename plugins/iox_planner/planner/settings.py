"""Planner settings: PRODUCT.md's four and the dedup slice budget, with their defaults, read from `IOX_<NAME>` then `--set name=value`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Mapping

from iox_planner import config
from iox_planner.errors import BadInputError

_VARIABLES: Mapping[str, config.Whole] = {
    "target_partitions": config.TARGET_PARTITIONS,
    "max_dedup_partition_split": config.MAX_DEDUP_PARTITION_SPLIT,
    "max_dedup_time_split": config.MAX_DEDUP_TIME_SPLIT,
    "max_parquet_fanout": config.MAX_PARQUET_FANOUT,
    "max_dedup_rows_per_slice": config.MAX_DEDUP_ROWS_PER_SLICE,
}
"""Each setting's `IOX_<NAME>` variable, which declares its default and bounds (past them a plan only grows:
groups, slices and lists sized by the setting, without splitting any better)."""


@dataclass(frozen=True)
class PlannerSettings:
    """How far the planner splits and fans out. Every value is a positive integer."""

    target_partitions: int = config.TARGET_PARTITIONS.default
    """Parquet files are dealt into this many file groups (partitions) where their order does not matter."""
    max_dedup_partition_split: int = config.MAX_DEDUP_PARTITION_SPLIT.default
    """More partitions than this under one DeduplicateExec: keep one dedup over all of them."""
    max_dedup_time_split: int = config.MAX_DEDUP_TIME_SPLIT.default
    """More time groups than this under one DeduplicateExec: keep that dedup whole."""
    max_parquet_fanout: int = config.MAX_PARQUET_FANOUT.default
    """Under a dedup, files get one (sorted) group each up to this many; more are dealt unsorted and sorted."""
    max_dedup_rows_per_slice: int = config.MAX_DEDUP_ROWS_PER_SLICE.default
    """A dedup group estimated (from chunk row counts) above this many rows is cut into time slices of about this
    many rows each, merged as separate tasks (`slice_dedup_by_time`)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            _VARIABLES[f.name].check(getattr(self, f.name), f"planner setting {f.name}", f.name)

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
    def from_env(overrides: Mapping[str, str] | None = None,
                 environ: Mapping[str, str] | None = None) -> PlannerSettings:
        """Defaults, then `IOX_<NAME>` environment variables (e.g. `IOX_TARGET_PARTITIONS`), then `overrides`
        (from `--set name=value`), each read by the registry's one rule."""
        values = {name: variable.read(environ) for name, variable in _VARIABLES.items()}
        for name, text in (overrides or {}).items():
            if name not in _VARIABLES:
                raise BadInputError(
                    f"unknown planner setting {name!r} in --set; valid settings: {', '.join(PlannerSettings.names())}"
                )
            values[name] = _VARIABLES[name].parse(text, f"--set {name}", name)
        return PlannerSettings(**values)


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """`["name=value", ...]` (from repeated `--set`) as a mapping; a pair without `=` is a BadInputError."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise BadInputError(f"--set {pair!r} is not name=value; valid names: {', '.join(PlannerSettings.names())}")
        out[name.strip()] = value
    return out
