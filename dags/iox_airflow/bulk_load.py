"""`iox_bulk_load`'s checks and report: a triggered folder is hostile input, so it must resolve inside
IOX_BULK_LOAD_ROOT before anything reads it."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Mapping

from iox_planner.catalog.names import check_db_name
from iox_planner.errors import BadInputError

from iox_planner.runs.settings import AirflowSettings

_PRECISIONS = ("ns", "us", "ms", "s")


def resolve_folder(text: str, settings: AirflowSettings) -> Path:
    """The `folder` param as a real path strictly inside `settings.bulk_load_root`: relative paths resolve under
    it; `..` is refused outright (even when it would land inside), a NUL too; symlinks are resolved and the result
    must still lie inside the root (a link out of it is refused), and it must exist as a folder or file."""
    root = settings.bulk_load_root
    if not isinstance(text, str) or not text.strip():
        raise BadInputError("folder is empty: give a folder under IOX_BULK_LOAD_ROOT")
    if "\0" in text:
        raise BadInputError("folder holds a NUL character; give a plain path under IOX_BULK_LOAD_ROOT")
    given = Path(text)
    if ".." in given.parts:
        raise BadInputError(f"folder {text[:200]!r} uses '..': give a path under IOX_BULK_LOAD_ROOT ({root}) "
                            "without it")
    candidate = given if given.is_absolute() else root / given
    try:
        real = candidate.resolve(strict=True)
    except (FileNotFoundError, RuntimeError):
        raise BadInputError(f"folder {text[:200]!r} does not exist under IOX_BULK_LOAD_ROOT ({root})") from None
    if real == root or not real.is_relative_to(root):
        raise BadInputError(f"folder {text[:200]!r} resolves to {real}, which is not inside IOX_BULK_LOAD_ROOT "
                            f"({root}): triggered bulk loads read only below that folder")
    if not (real.is_dir() or real.is_file()):
        raise BadInputError(f"folder {text[:200]!r} is neither a folder nor a regular file")
    return real


def load_args(params: Mapping[str, Any], settings: AirflowSettings, run_id: str) -> list[str]:
    """`run_bulk_load.py`'s arguments for a run's params, every value checked (the Params schema is checked
    again here: a run created past it, or an older DAG version, must not reach spark-submit unchecked)."""
    db = params.get("db")
    if not isinstance(db, str):
        raise BadInputError("db must be a database name")
    check_db_name(db)
    precision = params.get("precision", "ns")
    if precision not in _PRECISIONS:
        raise BadInputError(f"precision must be one of {', '.join(_PRECISIONS)}")
    folder = resolve_folder(params.get("folder"), settings)  # type: ignore[arg-type]
    # The job checks the folder against the root again when it opens it: this check ran in an earlier task, and
    # the folder (or a folder on its path) may have become a link since.
    return ["--db", db, "--precision", precision, "--report", str(report_path(run_id)),
            "--root", str(settings.bulk_load_root), "--", str(folder)]


def report_path(run_id: str) -> Path:
    """Where the load's job leaves its report for the summary task: under the project's state folder (like
    `iox_compact`'s reports), not a shared, world-writable temp folder where another user could plant a link at a
    predictable name. The digest keeps two run ids that sanitize alike apart."""
    from iox_planner.config import state_dir

    safe = re.sub(r"[^A-Za-z0-9_-]", "_", run_id)[:150]
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:12]
    folder = state_dir() / "bulk_load"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{safe}-{digest}.json"


def summary(run_id: str) -> dict[str, Any]:
    """What the load registered (its report, then removed)."""
    path = report_path(run_id)
    done = json.loads(path.read_text())
    path.unlink(missing_ok=True)
    chunks = done["chunks"]
    return {"chunks": len(chunks), "rows": sum(c["rows"] for c in chunks),
            "tables": sorted({c["table"] for c in chunks}), "rejected": len(done["rejected"])}
