"""What a scheduled or triggered run records in the catalog.

- **Query runs**: one `iox_query_run` row per run (per Airflow DAG run: a rerun updates its row), holding params,
  plan, output, row count, duration and status.
- **Run locks**, keyed by (definition, interval): a run takes the lock when it plans and checks it in the
  transaction that publishes, so two runs of one interval can never both publish.

Imports neither Airflow nor Spark: the DAGs call these functions, the tests call them against a real Postgres.
"""

from __future__ import annotations

import contextlib
import enum
import json
from typing import Any, Iterator, Mapping

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.engine import Connection

from iox_planner.catalog.schema import query_runs, run_locks
from iox_planner.catalog.store import Catalog
from iox_planner.errors import BadInputError, CatalogError
from iox_planner.model import RunKey


class RunStatus(str, enum.Enum):
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"


@contextlib.contextmanager
def _transaction(catalog: Catalog, conn: Connection | None) -> Iterator[Connection]:
    """The caller's transaction if it passes one, else a transaction of our own."""
    if conn is not None:
        yield conn
        return
    with catalog.engine.begin() as own:
        yield own


# --- query runs ------------------------------------------------------------------------------------------------


def start_run(
    catalog: Catalog,
    *,
    database: str,
    params: Mapping[str, Any],
    dag_id: str | None = None,
    run_id: str | None = None,
    definition: str | None = None,
    interval: tuple[int | None, int | None] = (None, None),
    output: str | None = None,
    conn: Connection | None = None,
) -> int:
    """Record a run as `running` and return its id. The same (dag_id, run_id) again (a retry or a rerun of that
    DAG run) resets and reuses its row."""
    values: dict[str, Any] = dict(
        database_name=database, definition=definition, dag_id=dag_id, run_id=run_id, interval_start=interval[0],
        interval_end=interval[1], params=_jsonable(params), plan=None, output=output, row_count=None,
        status=RunStatus.RUNNING.value, error=None, started_at=sa.func.now(), finished_at=None, duration_s=None,
    )
    insert = pg.insert(query_runs).values(**values)
    with _transaction(catalog, conn) as c:
        if dag_id is None:
            return int(c.execute(insert.returning(query_runs.c.id)).scalar_one())
        upsert = insert.on_conflict_do_update(
            index_elements=[query_runs.c.dag_id, query_runs.c.run_id],
            index_where=query_runs.c.dag_id.is_not(None),
            set_={k: insert.excluded[k] for k in values if k not in ("dag_id", "run_id")},
        )
        return int(c.execute(upsert.returning(query_runs.c.id)).scalar_one())


def record_plan(catalog: Catalog, run: int, plan: Mapping[str, Any], *, conn: Connection | None = None) -> None:
    with _transaction(catalog, conn) as c:
        c.execute(query_runs.update().where(query_runs.c.id == run).values(plan=_jsonable(plan)))


def finish_run(
    catalog: Catalog,
    run: int,
    status: RunStatus,
    *,
    row_count: int | None = None,
    error: str | None = None,
    conn: Connection | None = None,
) -> None:
    """Mark a run finished. A failure keeps the first error recorded (the most specific one: the plan task's, or
    the Spark job's), so a later, vaguer report does not overwrite it, and never overwrites a success (a step
    whose COMMIT lost its answer does not know whether it happened, and reports a failure)."""
    if status is RunStatus.RUNNING:
        raise ValueError("finish_run needs a final status")
    done = sa.func.clock_timestamp()
    values: dict[str, Any] = dict(
        status=status.value, finished_at=done,
        duration_s=sa.func.extract("epoch", done - query_runs.c.started_at),
    )
    if status is RunStatus.SUCCESS:
        values.update(row_count=row_count, error=None)
    else:
        values["error"] = sa.func.coalesce(query_runs.c.error, error)
    where = query_runs.c.id == run
    if status is RunStatus.FAILED:
        where = sa.and_(where, query_runs.c.status != RunStatus.SUCCESS.value)
    with _transaction(catalog, conn) as c:
        c.execute(query_runs.update().where(where).values(**values))


def get_run(catalog: Catalog, run: int) -> dict[str, Any] | None:
    with catalog.engine.connect() as conn:
        row = conn.execute(sa.select(query_runs).where(query_runs.c.id == run)).mappings().one_or_none()
    return dict(row) if row is not None else None


def _jsonable(value: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON round trip: what JSONB will hold, and an early, clear error for what it cannot."""
    try:
        result: dict[str, Any] = json.loads(json.dumps(dict(value), default=str))
    except (TypeError, ValueError) as err:
        raise BadInputError(f"run parameters cannot be stored as JSON: {err}") from err
    return result


# --- run locks ---------------------------------------------------------------------------------------------------


def _where(key: RunKey) -> sa.ColumnElement[bool]:
    return sa.and_(run_locks.c.definition == key.definition,
                   run_locks.c.interval_start == key.interval_start,
                   run_locks.c.interval_end == key.interval_end)


_ACQUIRE = sa.text("""
    INSERT INTO iox_run_lock AS l (definition, interval_start, interval_end, holder, query_run_id, expires_at)
    VALUES (:definition, :start, :end, :holder, :run, now() + make_interval(secs => :ttl))
    ON CONFLICT (definition, interval_start, interval_end) DO UPDATE
    SET holder = EXCLUDED.holder, query_run_id = EXCLUDED.query_run_id, acquired_at = now(),
        expires_at = EXCLUDED.expires_at
    WHERE l.holder = EXCLUDED.holder
       OR l.expires_at < now()
       OR NOT EXISTS (SELECT 1 FROM iox_query_run r WHERE r.id = l.query_run_id AND r.status = 'running')
    RETURNING holder
""")


def acquire_lock(
    catalog: Catalog, key: RunKey, holder: str, *, query_run: int | None, ttl_seconds: float,
    conn: Connection | None = None,
) -> None:
    """Take the lock on `key` for `holder`, or fail naming who holds it. The same holder may take it again (a
    retry); another holder's lock is taken over only when it expired or its query run is no longer running."""
    with _transaction(catalog, conn) as c:
        got = c.execute(_ACQUIRE.bindparams(
            definition=key.definition, start=key.interval_start, end=key.interval_end, holder=holder,
            run=query_run, ttl=float(ttl_seconds))).scalar_one_or_none()
        if got is not None:
            return
        row = c.execute(sa.select(run_locks.c.holder, run_locks.c.acquired_at, run_locks.c.expires_at)
                        .where(_where(key))).one_or_none()
    if row is None:  # released between our insert and our look: another attempt will get it
        raise CatalogError(f"could not lock {key.describe()} for {holder}; retry the run")
    raise CatalogError(
        f"{key.describe()} is being computed by {row.holder} (since {row.acquired_at:%Y-%m-%dT%H:%M:%SZ}); two "
        f"runs of one interval must not both publish, so {holder} stops here with nothing published. Retry "
        f"once that run has finished (its lock expires at {row.expires_at:%Y-%m-%dT%H:%M:%SZ} if it died)"
    )


def check_lock(conn: Connection, key: RunKey, holder: str) -> None:
    """Inside the publishing transaction: `holder` must still hold `key`. The row stays locked until that
    transaction ends, so nobody takes the lock over while we publish."""
    row = conn.execute(sa.select(run_locks.c.holder).where(_where(key)).with_for_update()).one_or_none()
    if row is None or row.holder != holder:
        who = "nobody" if row is None else row.holder
        raise CatalogError(
            f"{holder} no longer holds the lock on {key.describe()} (held by {who}: it expired and another run "
            "took it over); nothing was published, the other run publishes this interval"
        )


def release_lock(catalog: Catalog, key: RunKey, holder: str, *, conn: Connection | None = None) -> bool:
    """Release `key` if `holder` holds it. Returns whether it did."""
    with _transaction(catalog, conn) as c:
        result = c.execute(run_locks.delete().where(_where(key), run_locks.c.holder == holder))
        return bool(result.rowcount)


def lock_holder(catalog: Catalog, key: RunKey) -> str | None:
    with catalog.engine.connect() as conn:
        return conn.execute(sa.select(run_locks.c.holder).where(_where(key))).scalar_one_or_none()


