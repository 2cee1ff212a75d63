"""`iox_persist`: persists partitions whose ingester chunks pile up, so nobody has to run `iox-batch persist`.

Every IOX_PERSIST_SCHEDULE (default every 30 minutes) it finds the partitions holding at least
IOX_PERSIST_CHUNK_THRESHOLD (default 10) live ingester chunks (in the databases IOX_PERSIST_DATABASES names,
default all) and persists their tables, one mapped task per (database, table): a table that cannot be persisted
fails its own task and not the others. First, `expire` retires the partitions of every database (of those) whose
retention has passed them, and deletes files retired longer ago than the grace period, so expired data goes even
from databases nobody writes to any more. When every table is persisted, `request_compaction` emits an event of
the `iox_compact_request` asset naming the partitions the persist left overlapping (those compaction would
rewrite), which runs `iox_compact` for exactly those partitions within minutes instead of at its next scheduled
run; it is skipped (no event) when none overlaps, and after a failed persist the scheduled run does the
compaction.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import DAG, task

from iox_planner.runs.settings import RunSettings

from iox_airflow.assets import COMPACT_REQUEST

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
        from iox_planner.config import warehouse_root
        from iox_planner.maintenance.sweeps import DEFAULT_GRACE_SECONDS, expire_databases

        settings = RunSettings.from_env()
        with open_catalog() as catalog:
            done = expire_databases(catalog, warehouse_root(), DEFAULT_GRACE_SECONDS, settings.persist_databases)
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
        return [{"db": target["db"], "partition": r.partition, "partition_id": r.partition_id,
                 "chunks_in": r.chunks_in, "rows_out": r.rows_out} for r in results]

    @task(outlets=[COMPACT_REQUEST])
    def request_compaction(persisted: list[list[dict[str, Any]]]) -> dict[str, Any]:
        from airflow.sdk import get_current_context
        from airflow.sdk.exceptions import AirflowSkipException

        from iox_planner.catalog.store import open_catalog
        from iox_planner.maintenance.compact.batches import request_extra
        from iox_planner.maintenance.compact.plan import left_overlapping

        by_db: dict[str, list[int]] = {}
        for results in persisted:
            for r in results:
                by_db.setdefault(r["db"], []).append(int(r["partition_id"]))
        with open_catalog() as catalog:
            targets = {db: left_overlapping(catalog, db, ids) for db, ids in sorted(by_db.items())}
        extra = request_extra(targets)
        if not extra["targets"]:
            raise AirflowSkipException("no persisted partition overlaps another file: no compaction to request")
        context: Any = get_current_context()
        context["outlet_events"][COMPACT_REQUEST].extra = extra
        for db, ids in extra["targets"].items():
            print(f"requested compaction of {db}: {len(ids)} partition(s) left overlapping")
        return extra

    piles = find_piles()
    expire() >> piles
    request_compaction(persist_table.expand(target=piles))
