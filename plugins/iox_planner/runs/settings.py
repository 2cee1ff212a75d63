"""Settings of the Airflow layer, from `IOX_*` environment variables, validated once into a frozen dataclass.

| variable | default | what |
|---|---|---|
| `IOX_MAX_SPARK_JOBS` | 1 | fan-out: the plan task may split deduplicated scans into at most this many Spark jobs |
| `IOX_SPARK_RETRIES` | 1 | retries of a failed Spark task (each retry reruns cleanly) |
| `IOX_SPARK_RETRY_DELAY_S` | 30 | seconds between them |
| `IOX_SPARK_FAST_START_ROWS` | 1000000 | Spark jobs over at most this many rows start for latency (0: never) |
| `IOX_RUN_LOCK_TTL_S` | 21600 | a run lock whose holder died is taken over after this long (immediately when its Airflow DAG run has ended: catalog/runs.py) |
| `IOX_PERSIST_CHUNK_THRESHOLD` | 10 | the maintenance DAG persists partitions with at least this many ingester chunks |
| `IOX_PERSIST_SCHEDULE` | `*/30 * * * *` | when it looks |
| `IOX_PERSIST_DATABASES` | (all) | comma-separated databases it looks at |
| `IOX_COMPACT_SCHEDULE` | `@hourly` | when `iox_compact` looks for compaction work |
| `IOX_COMPACT_DATABASES` | (all) | comma-separated databases it compacts |
| `IOX_REFRESH_SCHEDULE` | `*/15 * * * *` | when `iox_refresh` looks for stale materialized intervals |
| `IOX_REFRESH_CONCURRENCY` | 2 | how many stale intervals `iox_refresh` recomputes at once |
| `IOX_OUTPUT_ROOT` | `<project>/output` | where relative output paths (params, definitions) resolve |
| `IOX_OUTPUT_ROOTS` | `IOX_OUTPUT_ROOT` | every folder runs may write under (`os.pathsep`-separated; the first is where relative paths go) |
| `IOX_MATERIALIZED_DIR` | `dags/materialized` | the folder of materialized query definitions (`*.yaml`) |
| `IOX_BULK_LOAD_ROOT` | `<project>/bulk` | the only folder whose files and subfolders `iox_bulk_load` may load |
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Mapping

from iox_planner.config import project_root
from iox_planner.errors import BadInputError


@dataclass(frozen=True)
class AirflowSettings:
    max_spark_jobs: int = 1
    spark_retries: int = 1
    spark_retry_delay_s: int = 30
    spark_fast_start_rows: int = 1_000_000
    run_lock_ttl_s: int = 6 * 3600
    persist_chunk_threshold: int = 10
    persist_schedule: str = "*/30 * * * *"
    persist_databases: tuple[str, ...] = ()
    compact_schedule: str = "@hourly"
    compact_databases: tuple[str, ...] = ()
    refresh_schedule: str = "*/15 * * * *"
    refresh_concurrency: int = 2
    output_root: Path = Path("output")
    materialized_dir: Path = Path("dags/materialized")
    output_roots: tuple[Path, ...] = ()
    """Every folder a run may write under, resolved (symlinks included); empty: just `output_root`."""
    bulk_load_root: Path = Path("bulk")
    """Where `iox_bulk_load`'s folders must resolve (symlinks included), resolved."""

    def __post_init__(self) -> None:
        roots = tuple(Path(r).resolve() for r in (self.output_roots or (self.output_root,)))
        for r in roots:
            if r == Path(r.anchor):
                raise BadInputError(f"output root {r} is a filesystem root; give IOX_OUTPUT_ROOT(S) folders of "
                                    "their own, which runs may fill")
        object.__setattr__(self, "output_roots", roots)
        bulk = Path(self.bulk_load_root).resolve()
        if bulk == Path(bulk.anchor):
            raise BadInputError(f"IOX_BULK_LOAD_ROOT {bulk} is a filesystem root; give a folder that holds only "
                                "what triggered bulk loads may read")
        object.__setattr__(self, "bulk_load_root", bulk)
        minimum = {"max_spark_jobs": 1, "spark_retries": 0, "spark_retry_delay_s": 0, "spark_fast_start_rows": 0,
                   "run_lock_ttl_s": 1, "persist_chunk_threshold": 1, "refresh_concurrency": 1}
        for name, low in minimum.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise BadInputError(f"IOX_{name.upper()} must be a whole number of at least {low}, got {value!r}")
        for name, example in (("persist_schedule", "*/30 * * * *"), ("compact_schedule", "@hourly"),
                              ("refresh_schedule", "*/15 * * * *")):
            if not getattr(self, name).strip():
                raise BadInputError(f"IOX_{name.upper()} must be a cron expression or preset such as {example!r}")

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> AirflowSettings:
        env = os.environ if environ is None else environ
        root = project_root()
        values: dict[str, object] = {
            "output_root": _path(env.get("IOX_OUTPUT_ROOT"), root / "output", root),
            "materialized_dir": _path(env.get("IOX_MATERIALIZED_DIR"), root / "dags" / "materialized", root),
            "bulk_load_root": _path(env.get("IOX_BULK_LOAD_ROOT"), root / "bulk", root),
        }
        listed = [_path(p.strip(), root, root) for p in (env.get("IOX_OUTPUT_ROOTS") or "").split(os.pathsep)
                  if p.strip()]
        if listed:
            # The first listed root is where relative paths go, unless IOX_OUTPUT_ROOT names one explicitly.
            if not env.get("IOX_OUTPUT_ROOT"):
                values["output_root"] = listed[0]
            values["output_roots"] = tuple(dict.fromkeys([values["output_root"], *listed]))
        for f in fields(AirflowSettings):
            var = f"IOX_{f.name.upper()}"
            if f.name in values or var not in env or f.name == "output_roots":
                continue
            text = env[var].strip()
            if f.name in ("persist_schedule", "compact_schedule", "refresh_schedule"):
                values[f.name] = text
                continue
            if f.name in ("persist_databases", "compact_databases"):
                values[f.name] = tuple(name.strip() for name in text.split(",") if name.strip())
                continue
            try:
                values[f.name] = int(text)
            except ValueError:
                raise BadInputError(f"{var}={text!r} is not a whole number") from None
        return AirflowSettings(**values)  # type: ignore[arg-type]

    def resolve_output(self, path: str | Path) -> Path:
        """An output path as given (params, definitions): absolute as is, relative under `output_root`; resolved
        (symlinks, `..`). Not checked: `QueryRequest.check_output` does that (the plan task refuses)."""
        text = str(path)
        if "\0" in text:
            raise BadInputError("output holds a NUL character; give a plain path under the output roots")
        p = Path(text)  # no ~ expansion: a run's output never names a home folder
        return (p if p.is_absolute() else self.output_root / p).resolve()

    def root_of(self, path: Path) -> Path | None:
        """The output root that `path` (resolved) lies strictly inside, if any."""
        return next((r for r in self.output_roots if path != r and path.is_relative_to(r)), None)


def _path(value: str | None, default: Path, root: Path) -> Path:
    if not value:
        return default.resolve()
    p = Path(value).expanduser()
    return (p if p.is_absolute() else root / p).resolve()
