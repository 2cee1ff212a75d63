"""`iox_persist`: persists partitions whose ingester chunks pile up, so nobody has to run `iox-batch persist`.

Every IOX_PERSIST_SCHEDULE (default every 30 minutes) it finds the partitions holding at least
IOX_PERSIST_CHUNK_THRESHOLD (default 10) live ingester chunks (in the databases IOX_PERSIST_DATABASES names,
default all) and persists their tables, one mapped task per (database, table): a table that cannot be persisted
fails its own task and not the others. First, `expire` retires the partitions of every database (of those) whose
retention has passed them, and deletes files retired longer ago than the grace period, so expired data goes even
from databases nobody writes to any more.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import DAG, task

from iox_planner.runs.settings import RunSettings

SETTINGS = RunSettings.from_env()

with DAG(
    dag_id="iox_persist",
    description="Persist partitions whose ingester chunks pile up",
    schedule=SETTINGS.persist_schedule,
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    max_active_runs=1,
    tags=["iox-batch", "maintenance"],
    doc_md=__doc__,
):

    @task
    def expire() -> list[dict[str, Any]]:
        from iox_planner.catalog.store import open_catalog
        from iox_planner.config import warehouse
        from iox_planner.maintenance.sweeps import DEFAULT_GRACE_SECONDS, expire_databases

        settings = RunSettings.from_env()
        with open_catalog() as catalog:
            done = expire_databases(catalog, warehouse(), DEFAULT_GRACE_SECONDS, settings.persist_databases)
        for db, part, chunks in done:
            print(f"{db}.{part.table} {part.partition}: past the retention, {chunks} chunk(s) retired")
        return [{"db": db, "table": part.table, "partition": part.partition, "chunks": chunks}
                for db, part, chunks in done]

    @task
    def find_piles() -> list[dict[str, Any]]:
        from iox_planner.catalog.store import open_catalog
        from iox_planner.maintenance.persist import piled_up_partitions, tables_to_persist

        settings = RunSettings.from_env()
        threshold = settings.persist_chunk_threshold
        with open_catalog() as catalog:
            piles = piled_up_partitions(catalog, threshold, settings.persist_databases)
        for pile in piles:
            print(f"{pile.db}.{pile.table} {pile.partition}: {pile.chunks} ingester chunks (threshold {threshold})")
        return [{"db": db, "table": table} for db, table in tables_to_persist(piles)]

    @task(map_index_template="{{ persist_target }}")
    def persist_table(target: dict[str, Any]) -> list[dict[str, Any]]:
        from airflow.sdk import get_current_context

        from iox_planner.catalog.store import open_catalog
        from iox_planner.maintenance.persist import persist

        context: Any = get_current_context()
        context["persist_target"] = f"{target['db']}.{target['table']}"  # the mapped task's label

        with open_catalog() as catalog:
            results = persist(catalog, target["db"], table=target["table"])
        for r in results:
            print(f"persisted {target['db']}.{r.table} {r.partition}: {r.chunks_in} chunks, {r.rows_in} rows -> "
                  f"{r.file_id} with {r.rows_out} rows (order {r.order})")
        return [{"partition": r.partition, "chunks_in": r.chunks_in, "rows_out": r.rows_out} for r in results]

    piles = find_piles()
    expire() >> piles
    persist_table.expand(target=piles)
