"""The run domain's settings (fan-out, Spark task retries, run locks, the maintenance DAGs' schedules, the output
roots, the definitions' folder, the bulk-load root), read through the settings registry (config.py declares each
variable's default and bounds) into one frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from iox_planner import config
from iox_planner.catalog.names import check_db_name
from iox_planner.config import project_root
from iox_planner.errors import BadInputError
from iox_planner.objectstore import Root, is_uri, parse_root
from iox_planner.output import Destination

_NUMBERS: Mapping[str, config.Whole] = {
    "max_spark_jobs": config.MAX_SPARK_JOBS, "spark_retries": config.SPARK_RETRIES,
    "spark_retry_delay_s": config.SPARK_RETRY_DELAY_S, "spark_fast_start_rows": config.SPARK_FAST_START_ROWS,
    "run_lock_ttl_s": config.RUN_LOCK_TTL_S, "persist_chunk_threshold": config.PERSIST_CHUNK_THRESHOLD,
    "refresh_concurrency": config.REFRESH_CONCURRENCY, "max_run_intervals": config.MAX_RUN_INTERVALS,
}
_SCHEDULES: Mapping[str, config.Schedule] = {
    "persist_schedule": config.PERSIST_SCHEDULE, "compact_schedule": config.COMPACT_SCHEDULE,
    "refresh_schedule": config.REFRESH_SCHEDULE,
}
_DATABASES: Mapping[str, config.Listed] = {
    "persist_databases": config.PERSIST_DATABASES, "compact_databases": config.COMPACT_DATABASES,
}


@dataclass(frozen=True)
class RunSettings:
    max_spark_jobs: int = config.MAX_SPARK_JOBS.default
    spark_retries: int = config.SPARK_RETRIES.default
    spark_retry_delay_s: int = config.SPARK_RETRY_DELAY_S.default
    spark_fast_start_rows: int = config.SPARK_FAST_START_ROWS.default
    run_lock_ttl_s: int = config.RUN_LOCK_TTL_S.default
    persist_chunk_threshold: int = config.PERSIST_CHUNK_THRESHOLD.default
    persist_schedule: str = config.PERSIST_SCHEDULE.default
    persist_databases: tuple[str, ...] = ()
    compact_schedule: str = config.COMPACT_SCHEDULE.default
    compact_databases: tuple[str, ...] = ()
    refresh_schedule: str = config.REFRESH_SCHEDULE.default
    refresh_concurrency: int = config.REFRESH_CONCURRENCY.default
    max_run_intervals: int = config.MAX_RUN_INTERVALS.default
    output_root: Path | Root = Path("output")
    """Where relative outputs go: a local folder, or a prefix on a store (`Root`, `s3://`)."""
    materialized_dir: Path = Path("dags/materialized")
    output_roots: tuple[Path | Root, ...] = ()
    """Every output root a run may write under: local folders resolved (symlinks included), store prefixes as
    `Root`s; empty: just `output_root`."""
    bulk_load_root: Path = Path("bulk")
    """Where `iox_bulk_load`'s folders must resolve (symlinks included), resolved."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_root", _output_root(self.output_root))
        roots = tuple(_output_root(r) for r in (self.output_roots or (self.output_root,)))
        for r in roots:
            if isinstance(r, Path) and r == Path(r.anchor):
                raise BadInputError(f"output root {r} is a filesystem root; give IOX_OUTPUT_ROOT(S) folders of "
                                    "their own, which runs may fill")
            if isinstance(r, Root) and "/" not in r.base:
                raise BadInputError(f"output root {r.uri} is a whole bucket; give IOX_OUTPUT_ROOT(S) a prefix of "
                                    "its own (s3://BUCKET/PREFIX), which runs may fill")
        object.__setattr__(self, "output_roots", roots)
        bulk = Path(self.bulk_load_root).resolve()
        if bulk == Path(bulk.anchor):
            raise BadInputError(f"IOX_BULK_LOAD_ROOT {bulk} is a filesystem root; give a folder that holds only "
                                "what triggered bulk loads may read")
        object.__setattr__(self, "bulk_load_root", bulk)
        # Values given in code (tests, a DAG file) meet the same bounds as the environment's.
        for name, number in _NUMBERS.items():
            number.check(getattr(self, name))
        for name, schedule in _SCHEDULES.items():
            schedule.parse(str(getattr(self, name)))
        for name, listed in _DATABASES.items():
            for db in getattr(self, name):
                try:
                    check_db_name(db)
                except BadInputError as err:
                    raise BadInputError(f"{listed.name} names {db[:80]!r}, which is not a database name: "
                                        f"{err}") from None

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> RunSettings:
        root = project_root()
        configured = config.OUTPUT_ROOT.read(environ)
        output_root = _output_root(configured) if configured is not None else (root / "output").resolve()
        values: dict[str, object] = {
            "output_root": output_root,
            "materialized_dir": _path(config.MATERIALIZED_DIR.read(environ), root / "dags" / "materialized"),
            "bulk_load_root": _path(config.BULK_LOAD_ROOT.read(environ), root / "bulk"),
            **{name: number.read(environ) for name, number in _NUMBERS.items()},
            **{name: schedule.read(environ) for name, schedule in _SCHEDULES.items()},
            **{name: listed.read(environ) for name, listed in _DATABASES.items()},
        }
        listed = [_output_root(r) for r in config.OUTPUT_ROOTS.read(environ)]
        if listed:
            # The first listed root is where relative paths go, unless IOX_OUTPUT_ROOT names one explicitly.
            if configured is None:
                values["output_root"] = listed[0]
            values["output_roots"] = tuple(dict.fromkeys([values["output_root"], *listed]))
        return RunSettings(**values)  # type: ignore[arg-type]

    def resolve_output(self, path: str | Path | Root) -> Destination:
        """An output as given (params, definitions): an `s3://` URI as a store key, an absolute path as is, a
        relative one under `output_root` (on a store: a key under its prefix); local paths resolved (symlinks,
        `..`). Not checked: `QueryRequest.check_output` does that (the plan task refuses)."""
        if isinstance(path, Root):
            return path
        text = str(path)
        if "\0" in text:
            raise BadInputError("output holds a NUL character; give a plain path under the output roots")
        if is_uri(text):
            return parse_root(text, what="output")  # its own checks: credentials, `..`, allowed names
        p = Path(text)  # no ~ expansion: a run's output never names a home folder
        if p.is_absolute():
            return p.resolve()
        if isinstance(self.output_root, Root):
            # Joined as text and checked as a whole URI: a `..` or a stray name is refused, not resolved.
            return parse_root(f"{self.output_root.uri}/{text}", what="output")
        return (self.output_root / p).resolve()

    def root_of(self, path: Destination) -> Path | Root | None:
        """The output root that `path` (resolved) lies strictly inside, if any: a store key under a store root,
        a local path under a local one."""
        if isinstance(path, Root):
            return next((r for r in self.output_roots
                         if isinstance(r, Root) and path.uri.startswith(r.uri + "/")), None)
        return next((r for r in self.output_roots
                     if isinstance(r, Path) and path != r and path.is_relative_to(r)), None)


def _output_root(root: Path | Root) -> Path | Root:
    """An output root as the checks compare it: a local one as its resolved path, a store prefix as is."""
    if isinstance(root, Root):
        return root.local_path.resolve() if root.is_local else root
    return Path(root).resolve()


def _path(value: Path | None, default: Path) -> Path:
    """A configured folder (absolute: the registry refuses anything else), unset `default`; resolved."""
    return (default if value is None else value).resolve()
