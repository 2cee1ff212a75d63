"""What a scheduled or triggered run records in the catalog.

- **Query runs**: one `iox_query_run` row per run (per Airflow DAG run: a rerun updates its row), holding params,
  plan, output, row count, duration and status.
- **Run locks**, keyed by (definition, interval): a run takes the lock when it plans and checks it in the
  transaction that publishes, so two runs of one interval can never both publish.

A holder that died leaves its lock behind. It is taken over when it expires (`IOX_RUN_LOCK_TTL_S`), when its query
run is no longer `running`, or, when the caller can ask the scheduler (`holder_state`), as soon as the holder's
Airflow DAG run has ended (see `acquire_lock`).

Imports neither Airflow nor Spark: the DAGs call these functions, the tests call them against a real Postgres.
"""

from __future__ import annotations

import contextlib
import enum
import json
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.engine import Connection

from iox_planner.catalog.schema import databases, query_runs, run_locks, tables, write_events
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
        changes_watermark=None,
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


def record_changes_watermark(catalog: Catalog, run: int, watermark: str) -> None:
    """The watermark a changes read hands on (its plan's window end), on its run's record."""
    with _transaction(catalog, None) as c:
        c.execute(query_runs.update().where(query_runs.c.id == run).values(changes_watermark=watermark))


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


def find_run(catalog: Catalog, dag_id: str, run_id: str) -> dict[str, Any] | None:
    """The query run of one Airflow DAG run (its task ids), if it recorded one."""
    with catalog.engine.connect() as conn:
        row = conn.execute(sa.select(query_runs).where(query_runs.c.dag_id == dag_id,
                                                       query_runs.c.run_id == run_id)).mappings().one_or_none()
    return dict(row) if row is not None else None


def get_run(catalog: Catalog, run: int) -> dict[str, Any] | None:
    with catalog.engine.connect() as conn:
        row = conn.execute(sa.select(query_runs).where(query_runs.c.id == run)).mappings().one_or_none()
    return dict(row) if row is not None else None


@dataclass(frozen=True)
class TableOrigin:
    """Who wrote a table, as the catalog recorded it."""

    exists: bool
    ingested: tuple[str, ...]
    """The write log's sources other than registrations that added data to it (`write`, `load`)."""
    registered_by: tuple[str, ...]
    """The materialized query whose runs register their results as it (the table's `registered_by`, recorded by
    the registration that created it; migration 0007), or none."""


def table_origin(catalog: Catalog, db: str, table: str) -> TableOrigin:
    """Who wrote table `table` of database `db`: ingest (the write log, catalog/freshness.py), materialized
    queries' registrations (their runs' params), or nobody yet."""
    with catalog.engine.connect() as conn:
        db_id = conn.execute(sa.select(databases.c.id).where(databases.c.name == db)).scalar_one_or_none()
        row = None if db_id is None else conn.execute(sa.select(tables.c.registered_by).where(
            tables.c.database_id == db_id, tables.c.name == table,
            tables.c.dropped_at.is_(None))).first()
        if row is None:
            return TableOrigin(False, (), ())
        ingested = conn.execute(sa.select(write_events.c.source).distinct().where(
            write_events.c.database_id == db_id, write_events.c.table_name == table,
            write_events.c.source != "register").order_by(write_events.c.source)).scalars().all()
    return TableOrigin(True, tuple(ingested), () if row.registered_by is None else (row.registered_by,))


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


HolderState = Callable[[str, str], str]
"""Asks the scheduler for the state of an Airflow DAG run, by (dag_id, run_id): `ti.get_dagrun_state` in a task."""

ENDED_DAG_RUN_STATES = frozenset({"success", "failed"})
"""Airflow's terminal DAG run states: no task of such a run is running, or will run unless someone clears it."""

_TAKE_OVER = sa.text("""
    UPDATE iox_run_lock
    SET holder = :holder, query_run_id = :run, acquired_at = now(), expires_at = now() + make_interval(secs => :ttl)
    WHERE definition = :definition AND interval_start = :start AND interval_end = :end
      AND holder = :old_holder AND query_run_id = :old_run AND acquired_at = :old_acquired
    RETURNING holder
""")


def acquire_lock(
    catalog: Catalog, key: RunKey, holder: str, *, query_run: int | None, ttl_seconds: float,
    conn: Connection | None = None, holder_state: HolderState | None = None,
) -> None:
    """Take the lock on `key` for `holder`, or fail naming who holds it. The same holder may take it again (a
    retry); another holder's lock is taken over only when it expired, its query run is no longer running, or
    (given `holder_state`) the Airflow DAG run that holds it has ended.

    Why the DAG run's state: an Airflow task killed outright (SIGKILL of the task or its worker) never records
    anything, so its query run stays `running` and its lock would hold for the whole TTL (6 h). The scheduler does
    notice: the task's supervisor reports the death at once, and a lost worker's task is failed once its
    heartbeats stop for `[scheduler] task_instance_heartbeat_timeout`; the DAG run then ends. A DAG run in a
    terminal state has no live task that Airflow knows of, so its lock is taken over at once, in one statement
    that also requires the lock to be exactly as seen when the state was asked (holder, query run and
    `acquired_at`, which a retry of that holder renews): a holder that came back meanwhile (its task cleared) keeps
    its lock. A live holder is never taken over: `running` and `queued` DAG runs, a state that cannot be asked (an
    error, an unknown run, a holder that is no Airflow run) all count as alive. Exactness does not rest on this: a
    task Airflow gave up on that is still running (or is cleared later) fails at `check_lock` in its publishing
    transaction and publishes nothing.

    Considered instead: a teardown task that marks the run failed and releases its lock when the commit did not
    succeed. It would break the documented recovery of a killed commit (clear the task: it republishes the same
    staged result), since the teardown would have released the lock and removed the staging first, and a teardown
    killed in turn leaves the same 6 h lock. Taking over at the next run's plan needs no extra task and frees the
    lock however the holder died."""
    with _transaction(catalog, conn) as c:
        got = c.execute(_ACQUIRE.bindparams(
            definition=key.definition, start=key.interval_start, end=key.interval_end, holder=holder,
            run=query_run, ttl=float(ttl_seconds))).scalar_one_or_none()
        if got is not None:
            return
        row = c.execute(
            sa.select(run_locks.c.holder, run_locks.c.query_run_id, run_locks.c.acquired_at,
                      run_locks.c.expires_at, query_runs.c.dag_id, query_runs.c.run_id, query_runs.c.status)
            .select_from(run_locks.outerjoin(query_runs, query_runs.c.id == run_locks.c.query_run_id))
            .where(_where(key))).one_or_none()
    if row is None:  # released between our insert and our look: another attempt will get it
        raise CatalogError(f"could not lock {key.describe()} for {holder}; retry the run")
    ended = _ended_dag_run(row, holder_state)
    if ended is not None:
        with _transaction(catalog, conn) as c:
            took = c.execute(_TAKE_OVER.bindparams(
                definition=key.definition, start=key.interval_start, end=key.interval_end, holder=holder,
                run=query_run, ttl=float(ttl_seconds), old_holder=row.holder, old_run=row.query_run_id,
                old_acquired=row.acquired_at)).scalar_one_or_none()
            if took is not None:
                finish_run(catalog, row.query_run_id, RunStatus.FAILED, conn=c, error=(
                    f"its Airflow DAG run ended ({ended}) while this run was still recorded as running (a task "
                    f"killed outright, or its worker lost); {holder} took over its lock on {key.describe()}; "
                    "nothing of this run was published"))
                return
    raise CatalogError(
        f"{key.describe()} is being computed by {row.holder} (since {row.acquired_at:%Y-%m-%dT%H:%M:%SZ}); two "
        f"runs of one interval must not both publish, so {holder} stops here with nothing published. Retry "
        f"once that run has finished (if it died, its lock is free once its Airflow DAG run has ended, and "
        f"expires at {row.expires_at:%Y-%m-%dT%H:%M:%SZ} in any case)"
    )


def _ended_dag_run(row: Any, holder_state: HolderState | None) -> str | None:
    """The terminal state of the Airflow DAG run holding the lock, or None: alive, or not known to have ended."""
    if holder_state is None or row.status != RunStatus.RUNNING.value or row.dag_id is None or row.run_id is None:
        return None
    if row.holder != f"{row.dag_id}/{row.run_id}":  # a holder that is not this query run's Airflow DAG run
        return None
    try:
        state = holder_state(row.dag_id, row.run_id)
    except Exception:  # noqa: BLE001 - a state we cannot learn is no proof of death: the lock holds
        return None
    text = getattr(state, "value", state)  # a DagRunState enum or its plain string
    return text if isinstance(text, str) and text in ENDED_DAG_RUN_STATES else None


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


