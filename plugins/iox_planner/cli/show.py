"""`iox-batch show`: tables, partitions and chunks of a database."""

from __future__ import annotations

from rich.console import Console

from iox_planner.catalog.names import check_name, excerpt
from iox_planner.catalog.retention import describe_retention, retention_of
from iox_planner.catalog.store import Catalog
from iox_planner.errors import CatalogError
from iox_planner.output.terminal import PlainTable
from iox_planner.timeutil import format_time, now_ns


def show(catalog: Catalog, db: str, table: str | None, console: Console) -> None:
    if table is not None:
        check_name(table, "table name")
    with catalog.engine.connect() as conn:
        db_id = catalog.database_id(conn, db)
        table_ids = catalog.table_ids(conn, db_id)
        if table is not None and table not in table_ids:
            known = ", ".join(sorted(table_ids)) or "none"
            raise CatalogError(f"table {excerpt(table)} does not exist in database {db!r} (tables: {known})")
        names = [table] if table is not None else sorted(table_ids)
        chunks = catalog.chunk_rows(conn, db_id, table=table)
        partitions = catalog.partition_rows(conn, db_id, table)
        columns = {name: catalog.table_columns(conn, table_ids[name]) for name in names}
        retention = retention_of(conn, db_id)
    console.print(f"database {db}: {len(names)} table(s), {len(partitions)} partition(s), "
                  f"{len(chunks)} chunk(s)")
    if retention is not None:
        cut = now_ns() - retention
        past = [c for c in chunks if c.max_time <= cut]
        console.print(f"retention {describe_retention(retention)}: queries exclude rows at or before "
                      f"{format_time(cut)}; {len(past)} chunk(s), {sum(c.row_count for c in past)} row(s) wholly "
                      "past it (retired by the next persist, compaction or maintenance run)")
    if not names:
        return
    tables = PlainTable(title="tables", title_justify="left")
    for col in ("table", "tags", "fields", "partitions", "chunks", "rows"):
        tables.add_column(col, justify="right" if col in ("partitions", "chunks", "rows") else "left")
    for name in names:
        cols = columns[name]
        tags = sorted(c for c, t in cols.items() if t.value == "tag")
        fields = sorted(f"{c} ({t.value})" for c, t in cols.items() if t.is_field)
        mine = [c for c in chunks if c.table == name]
        tables.add_row(name, ", ".join(tags), ", ".join(fields),
                       str(sum(1 for p in partitions if p.table_name == name)), str(len(mine)),
                       str(sum(c.row_count for c in mine)))
    console.print(tables)
    grid = PlainTable(title="chunks", title_justify="left")
    for col in ("table", "partition", "sort key", "chunk", "kind", "level", "time min", "time max", "rows",
                "order"):
        grid.add_column(col, justify="right" if col in ("rows", "order") else "left")
    sort_keys = {(p.table_name, p.partition_key): p.sort_key for p in partitions}
    for c in chunks:
        key = sort_keys.get((c.table, c.partition))
        grid.add_row(c.table, c.partition, ",".join(key) if key else "-", c.display_id, c.kind.value,
                     f"L{c.level}" if c.kind.value == "parquet" else "-", format_time(c.min_time),
                     format_time(c.max_time), str(c.row_count), str(c.order))
    console.print(grid)
