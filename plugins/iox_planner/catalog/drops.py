"""Dropping a database or a table, and the markers that make what read them stale (catalog/freshness.py).

- A **database** goes at once: its catalog rows in one transaction, then its files (its warehouse folder, or every
  object under its prefix on a store). Files a failure left after the commit are swept by the maintenance run
  (`sweeps.sweep_dropped_databases`): the id is never used again.
- A **table** goes the way every retired file goes: one transaction retires every live chunk of it, marks its row
  dropped (its name is free at once: a write of that name creates a new table) and records a drop marker with an
  order from the database's counter. A query planned before keeps reading the retired files for the grace period;
  `collect_garbage` deletes them (and their rows) after it. The drop is refused while a run that registers its
  result as this table holds its run lock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.engine import Connection

from iox_planner.catalog import locks
from iox_planner.catalog.freshness import fresh_order, record_drop
from iox_planner.catalog.names import check_name, excerpt
from iox_planner.catalog.schema import (
    CHUNK_TABLES, changes_gaps, columns, databases, partitions, query_runs, run_locks, table_drops, tables,
)
from iox_planner.catalog.store import Catalog
from iox_planner.config import warehouse_root
from iox_planner.deletion import delete_folder
from iox_planner.errors import CatalogError, StoreUnavailableError
from iox_planner.objectstore import Root, local_root

_log = logging.getLogger(__name__)


def drop_database(catalog: Catalog, name: str, warehouse: Root | Path | None = None,
                  warn: Callable[[str], None] | None = None) -> int:
    """Delete a database: its catalog rows in one transaction, then its files. Returns its id. A failure deleting
    the files (a store gone away) does not undo the drop: it is passed to `warn` and the files are left to
    `sweeps.sweep_dropped_databases`."""
    if warehouse is None:
        warehouse = warehouse_root()
    root = local_root(warehouse) if isinstance(warehouse, Path) else warehouse
    with catalog.engine.begin() as conn:
        db_id = catalog.database_id(conn, name)
        table_ids = sa.select(tables.c.id).where(tables.c.database_id == db_id).scalar_subquery()
        for ct in CHUNK_TABLES.values():
            conn.execute(ct.delete().where(ct.c.table_id.in_(table_ids)))
        conn.execute(partitions.delete().where(partitions.c.table_id.in_(table_ids)))
        conn.execute(columns.delete().where(columns.c.table_id.in_(table_ids)))
        conn.execute(tables.delete().where(tables.c.database_id == db_id))
        conn.execute(changes_gaps.delete().where(changes_gaps.c.database_id == db_id))
        conn.execute(databases.delete().where(databases.c.id == db_id))
        record_drop(conn, db_id, name)  # what read it is stale now (catalog/freshness.py)
    try:
        delete_folder(root, str(db_id))
    except StoreUnavailableError:  # says "try again", but the drop is done: the sweep finishes it
        (warn or _log.warning)(f"database {name!r} is dropped, but its files under {root.uri_of(str(db_id))} "
                               "could not all be deleted (the object store did not answer); the iox_persist "
                               "maintenance run's sweep deletes them later")
    return db_id


@dataclass(frozen=True)
class DroppedTable:
    db: str
    table: str
    table_id: int
    chunks: int
    """Live chunks retired: their files go once the grace period has passed."""
    order: int
    """The drop marker's order (catalog/freshness.py: intervals that read the table below it are stale)."""


def drop_table(catalog: Catalog, db: str, table: str) -> DroppedTable:
    """Drop table `table` of database `db` in one transaction: retire its live chunks, mark it dropped, record the
    drop marker. Writes into the database wait for it (its order lock), and so do persists, compaction swaps and
    registrations of its partitions (their row locks); run locks cannot be taken meanwhile (see
    `locks.freeze_run_locks`), so a run that registers into the table either holds its lock now, and the drop is
    refused, or takes it after the drop and registers into a new table of that name."""
    check_name(table, "table name")
    with catalog.engine.begin() as conn:
        db_id = catalog.database_id(conn, db)
        locks.lock_orders(conn, db_id)
        locks.freeze_run_locks(conn)
        table_id = catalog.table_ids(conn, db_id).get(table)
        if table_id is None:
            known = ", ".join(sorted(catalog.table_ids(conn, db_id))) or "none"
            raise CatalogError(f"table {excerpt(table)} does not exist in database {db!r} (tables: {known})")
        _refuse_while_registering(conn, db, table)
        retired = 0
        pids = conn.execute(sa.select(partitions.c.id).where(partitions.c.table_id == table_id)
                            .order_by(partitions.c.id)).scalars().all()
        for pid in pids:
            locks.lock_partition(conn, int(pid))
            retired += catalog.retire_partition(conn, int(pid))
        order = fresh_order(conn, db_id)
        conn.execute(pg.insert(table_drops).values(table_id=table_id, database_id=db_id, table_name=table,
                                                   drop_order=order))
        conn.execute(tables.update().where(tables.c.id == table_id).values(dropped_at=sa.func.now()))
    return DroppedTable(db, table, table_id, retired, order)


def _refuse_while_registering(conn: Connection, db: str, table: str) -> None:
    """A run that registers its result as `table` and holds its run lock now (planned, not yet committed) would
    write the table back the moment it commits: the drop waits for it to finish instead."""
    row = conn.execute(
        sa.select(query_runs.c.definition, query_runs.c.dag_id, query_runs.c.run_id, run_locks.c.expires_at)
        .join_from(run_locks, query_runs, query_runs.c.id == run_locks.c.query_run_id)
        .where(query_runs.c.status == "running", run_locks.c.expires_at > sa.func.now(),
               query_runs.c.params.contains({"register_as": {"db": db, "table": table}}))
        .order_by(run_locks.c.acquired_at).limit(1)).first()
    if row is not None:
        who = f"{row.dag_id}/{row.run_id}" if row.dag_id else "a run"
        raise CatalogError(
            f"table {excerpt(table)} of database {db!r} is being registered by materialized query "
            f"{excerpt(row.definition)} ({excerpt(who, 80)}, its run lock expires at "
            f"{row.expires_at:%Y-%m-%dT%H:%M:%SZ}); nothing was dropped: drop it once that run has finished")
