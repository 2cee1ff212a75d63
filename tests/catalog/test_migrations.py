"""The catalog schema: migrations from empty, re-runs, one linear history, and the code's table definitions
agreeing with the migrated database."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from iox_planner.catalog import names as catalog_names
from iox_planner.catalog import schema
from iox_planner.catalog.migrations import migration_files
from iox_planner.catalog.store import Catalog
from iox_planner.errors import BadInputError, CatalogError

ROOT = Path(__file__).resolve().parents[2]


def test_migrate_from_empty_then_rerun_applies_nothing(empty_catalog: str) -> None:
    catalog = Catalog(empty_catalog)
    assert catalog.schema_version() == 0
    applied = catalog.migrate()
    assert [m.version for m in applied] == list(range(1, len(migration_files()) + 1))
    assert catalog.schema_version() == len(migration_files())
    assert catalog.migrate() == []
    with catalog.engine.connect() as conn:
        names = set(sa.inspect(conn).get_table_names())
        versions = list(conn.execute(sa.text("SELECT version FROM iox_schema_migration ORDER BY version")).scalars())
    assert {"iox_database", "iox_table", "iox_column", "iox_partition", "iox_parquet_file",
            "iox_ingester_chunk", "iox_query_run"} <= names
    assert versions == list(range(1, len(migration_files()) + 1))
    catalog.dispose()


def test_migration_files_form_one_linear_history() -> None:
    files = sorted(p.name for p in (ROOT / "catalog_sql").glob("*.sql"))
    assert files, "no migrations"
    numbers = [int(name[:4]) for name in files]
    assert numbers == list(range(1, len(files) + 1)), files
    assert all(name[4] == "_" and name.endswith(".sql") for name in files)


def test_a_gap_in_the_history_is_refused(tmp_path: Path) -> None:
    (tmp_path / "0001_first.sql").write_text("SELECT 1;")
    (tmp_path / "0003_third.sql").write_text("SELECT 1;")
    with pytest.raises(CatalogError, match="expected version 0002"):
        migration_files(tmp_path)


def test_tables_registered_before_0007_belong_to_the_one_definition_that_registered_them(empty_catalog: str) -> None:
    """Migration 0007 records each registered table's owner from the succeeded runs older releases recorded:
    the one definition that registered it; nobody when none or two did."""
    catalog = Catalog(empty_catalog)
    catalog.migrate(until=6)
    with catalog.engine.begin() as conn:
        db_id = conn.execute(sa.text("INSERT INTO iox_database (name) VALUES ('d') RETURNING id")).scalar_one()
        for table in ("mine", "shared", "ingested", "failed_only"):
            conn.execute(sa.text("INSERT INTO iox_table (database_id, name) VALUES (:d, :t)"),
                         {"d": db_id, "t": table})
        runs = [("a", "mine", "success"), ("a", "mine", "success"), ("a", "shared", "success"),
                ("b", "shared", "success"), ("c", "failed_only", "failed")]
        for n, (definition, table, status) in enumerate(runs):
            conn.execute(sa.text(
                "INSERT INTO iox_query_run (database_name, definition, dag_id, run_id, params, status) "
                "VALUES ('d', :definition, 'dag', :run, CAST(:params AS JSONB), :status)"),
                {"definition": definition, "run": f"r{n}", "status": status,
                 "params": f'{{"register_as": {{"db": "d", "table": "{table}"}}}}'})
        conn.execute(sa.text(
            "INSERT INTO iox_query_run (database_name, definition, dag_id, run_id, params, status) "
            "VALUES ('d', 'z', 'dag', 'plain', '{\"register_as\": null}', 'success')"))
    assert [m.version for m in catalog.migrate()] == list(range(7, len(migration_files()) + 1))
    with catalog.engine.connect() as conn:
        owners = {r.name: r.registered_by for r in conn.execute(sa.text("SELECT name, registered_by FROM iox_table"))}
    assert owners == {"mine": "a", "shared": None, "ingested": None, "failed_only": None}
    catalog.dispose()


def test_an_edited_shipped_migration_is_refused(empty_catalog: str) -> None:
    catalog = Catalog(empty_catalog)
    catalog.migrate()
    with catalog.engine.begin() as conn:
        conn.execute(sa.text("UPDATE iox_schema_migration SET checksum = 'edited' WHERE version = 1"))
    with pytest.raises(CatalogError, match="edited after it was applied"):
        catalog.migrate()
    catalog.dispose()


def test_table_definitions_match_the_migrated_schema(catalog: Catalog) -> None:
    with catalog.engine.connect() as conn:
        inspector = sa.inspect(conn)
        # Every migrated table is defined in schema.py (none lives elsewhere, unseen by this test) ...
        assert set(inspector.get_table_names()) == set(schema.metadata.tables)
        # ... with exactly the migrated columns.
        for table in schema.metadata.sorted_tables:
            actual = {c["name"] for c in inspector.get_columns(table.name)}
            assert actual == {c.name for c in table.columns}, table.name


@pytest.mark.parametrize("name", ["", "a b", "x" * 65, "semi;colon", "dot.name", "ünï"])
def test_bad_database_names_are_refused(name: str) -> None:
    with pytest.raises(BadInputError, match="database name"):
        catalog_names.check_db_name(name)


@pytest.mark.parametrize("name", ["demo", "A-b_9", "x" * 64])
def test_good_database_names(name: str) -> None:
    assert catalog_names.check_db_name(name) == name
