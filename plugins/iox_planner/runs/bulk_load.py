"""`iox_bulk_load`'s run plumbing: a run's params checked into the load job (`spark/jobs.py` `BulkLoadJob`; a
triggered folder is hostile input, so it must resolve inside IOX_BULK_LOAD_ROOT before anything reads it:
`ingest/bulk.py` `resolve_source`), and where the job leaves its report for the summary."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Mapping

from iox_planner.catalog.names import check_db_name
from iox_planner.errors import BadInputError
from iox_planner.ingest.bulk import resolve_source
from iox_planner.ingest.lineprotocol import Precision
from iox_planner.spark.jobs import BulkLoadJob

from iox_planner.runs.settings import RunSettings


def load_job(params: Mapping[str, Any], settings: RunSettings, run_id: str) -> BulkLoadJob:
    """The load job of a run's params, every value checked (the Params schema is checked again here: a run
    created past it, or an older DAG version, must not reach spark-submit unchecked)."""
    db = params.get("db")
    if not isinstance(db, str):
        raise BadInputError("db must be a database name")
    check_db_name(db)
    precision = params.get("precision", Precision.NS.value)
    if precision not in Precision.choices():
        raise BadInputError(f"precision must be one of {', '.join(Precision.choices())}")
    folder = resolve_source(params.get("folder"), settings.bulk_load_root)  # type: ignore[arg-type]
    # The job checks the folder against the root again when it opens it: this check ran in an earlier task, and
    # the folder (or a folder on its path) may have become a link since.
    return BulkLoadJob(db, str(folder), Precision(precision), report=report_path(run_id),
                       root=settings.bulk_load_root)


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
