"""Configuration by environment: where the project, the catalog and the warehouse are; bounded numbers."""

from __future__ import annotations

import os
from pathlib import Path

from iox_planner.errors import BadInputError


def project_root() -> Path:
    """The checkout this package runs from (IOX_HOME overrides): holds catalog_sql/, dags/, spark_jobs/."""
    env = os.environ.get("IOX_HOME")
    if env:
        return Path(env).resolve()
    here = Path(__file__).resolve().parents[2]
    if (here / "catalog_sql").is_dir():
        return here
    return Path.cwd().resolve()


def state_dir() -> Path:
    """Project-local state (the local Postgres state file, locks). Not committed."""
    path = project_root() / ".iox"
    path.mkdir(parents=True, exist_ok=True)
    return path


def warehouse() -> Path:
    """Where Parquet lives: IOX_WAREHOUSE, else the project's own `warehouse/` folder."""
    env = os.environ.get("IOX_WAREHOUSE")
    path = Path(env) if env else project_root() / "warehouse"
    return path.resolve()


def env_int(name: str, default: int, low: int, high: int) -> int:
    """A whole number from the environment variable `name` (underscores allowed: `1_000_000`), `default` when
    unset or blank; outside `[low, high]` or not a number, a one-paragraph error naming the range."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise BadInputError(f"{name}={text[:40]!r} is not allowed; set a whole number from {low:,} to {high:,} "
                            f"or unset it (default {default:,})")
    return value
