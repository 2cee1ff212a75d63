"""Recording a run that failed: the run marked failed, its lock released, its staging folder removed, whichever
step failed (the plan step, the Spark jobs, the commit step) or params that never made a request."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, NoReturn

from iox_planner.errors import IoxError, RunFailed

from iox_planner.runs.request import QueryRequest
from iox_planner.runs.staging import RunIdentity, Staging

RECORD_FAILURE_WAIT_S = 20.0
"""How long a failed step keeps trying to record its failure while the catalog is unreachable (a Postgres restart
takes seconds): recorded, the run's lock is free at once for a rerun; not, it holds until IOX_RUN_LOCK_TTL_S."""


def fail(request: QueryRequest, run: RunIdentity, handle: Mapping[str, Any] | None, reason: str) -> str:
    """An upstream task failed: record the run as failed (with the Spark job's own error where it left one),
    release the lock, remove the staging folder. Returns the message recorded."""
    staging = Staging(Path(handle["staging"])) if handle else Staging.for_run(request.output, run)
    errors = staging.errors()
    message = "; ".join(errors) if errors else reason
    from iox_planner.catalog.store import open_catalog

    with open_catalog() as catalog:
        if handle is not None:
            record_failure(catalog, int(handle["query_run"]), request.lock_key(), run, staging, message)
            return message
        # The plan step never finished. A plan that failed recorded its own failure; one killed outright (after
        # taking the lock, say) recorded nothing, and its run would stay `running`, holding the lock: record it
        # here, by this DAG run's ids. Only this run's own lock is released (release_lock checks the holder).
        from iox_planner.catalog import runs

        found = runs.find_run(catalog, run.dag_id, run.run_id)
        if found is not None and found["status"] == runs.RunStatus.RUNNING.value:
            record_failure(catalog, int(found["id"]), request.lock_key(), run, staging, message)
        staging.remove()
    return message


def reject(params: Mapping[str, Any], run: RunIdentity, message: str) -> None:
    """Params that do not even make a request: record the run as failed with the params as given."""
    from iox_planner.catalog import runs
    from iox_planner.catalog.store import open_catalog

    with open_catalog() as catalog:
        run_pk = runs.start_run(catalog, database=str(params.get("db") or ""), params=params, dag_id=run.dag_id,
                                run_id=run.run_id, output=str(params.get("output") or "") or None)
        runs.finish_run(catalog, run_pk, runs.RunStatus.FAILED, error=message)


def fail_run(err: BaseException, doing: str, catalog: Any, run_pk: int, key: Any, run: RunIdentity,
             staging: Staging) -> NoReturn:
    """Mark the run failed (lock released, staging removed) and raise: a user's mistake or a lost catalog as
    RunFailed with its one-paragraph message, anything else as it was."""
    from iox_planner.catalog.store import catalog_unavailable

    lost = catalog_unavailable(err)
    cause = lost if lost is not None else err
    message = str(cause) if isinstance(cause, IoxError) else f"internal error while {doing}: {err!r}"
    recorded = record_failure(catalog, run_pk, key, run, staging, message)
    if isinstance(cause, IoxError):
        if not recorded:
            message += ("; the run could not be marked failed either, so its lock on the output holds until "
                        "IOX_RUN_LOCK_TTL_S (retrying this task once the catalog is back finishes the run)")
        raise RunFailed(message, cause.exit_code) from err
    raise err


def record_failure(catalog: Any, run_pk: int, key: Any, run: RunIdentity, staging: Staging, message: str) -> bool:
    """Mark the run failed and release its lock, then remove its staging folder. While the catalog is
    unreachable, keep trying for RECORD_FAILURE_WAIT_S; if it stays so, leave the staging folder (a retry of the
    step may still use it) and return False. A run the catalog already has as succeeded stays so (finish_run): a
    COMMIT whose answer was lost may have happened."""
    import time

    from iox_planner.catalog import runs
    from iox_planner.catalog.store import catalog_unavailable

    deadline = time.monotonic() + RECORD_FAILURE_WAIT_S
    while True:
        try:
            runs.finish_run(catalog, run_pk, runs.RunStatus.FAILED, error=message)
            runs.release_lock(catalog, key, run.holder)
            break
        except Exception as err:
            if catalog_unavailable(err) is None:
                staging.remove()
                raise
            if time.monotonic() > deadline:
                return False
            catalog.engine.dispose()  # the pool's connections died with the server
            time.sleep(0.5)
    staging.remove()
    return True
