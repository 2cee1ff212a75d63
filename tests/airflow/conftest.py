"""Fixtures of the Airflow tests: real Airflow (its own AIRFLOW_HOME and SQLite metadata DB per session, so per
xdist worker under `make test`), the tests' own catalog database and warehouse (tests/conftest.py, also per
worker), sample data loaded into fresh databases, and materialized query definitions written for those databases.
No test may count on another having run before it in the same process: `make test` deals the files out to two
workers."""

from __future__ import annotations

import os

import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from airflow_support import DAGS, DATA, ROOT, DagRunner, base_env, setup_airflow, write_definitions

from iox_planner.catalog.store import Catalog
from iox_planner.ingest.scenario import load_scenario, read_scenario

# The DAGs' support package (dags/iox_airflow), importable as Airflow makes it: the DAGs folder on sys.path.
if str(DAGS) not in sys.path:
    sys.path.append(str(DAGS))


def _load(catalog: Catalog, scenario: Path, prefix: str) -> str:
    db = f"{prefix}_{uuid.uuid4().hex[:8]}"
    load_scenario(catalog, read_scenario(scenario), db=db)
    return db


@pytest.fixture(scope="session")
def h2o_db(catalog: Catalog) -> str:
    """The seed 001 example (examples/h2o.yaml): a Parquet file and an overlapping ingester chunk."""
    return _load(catalog, ROOT / "examples" / "h2o.yaml", "af_h2o")


@pytest.fixture(scope="session")
def h2o3_db(catalog: Catalog) -> str:
    """Three days of h2o (tests/airflow/data/h2o_3days.yaml), one overlapping pair of chunks per day."""
    return _load(catalog, DATA / "h2o_3days.yaml", "af_h2o3")


@pytest.fixture(scope="session")
def fail_db(catalog: Catalog) -> str:
    """The same three days in a database of its own, for the test that breaks a chunk file."""
    return _load(catalog, DATA / "h2o_3days.yaml", "af_fail")


@pytest.fixture(scope="session")
def airflow_env(catalog_url: str, h2o3_db: str, fail_db: str,
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for `airflow dags test` and dag.test(): a fresh AIRFLOW_HOME (SQLite metadata DB, migrated),
    the real dags/ folder, the tests' definitions and catalog."""
    home = tmp_path_factory.mktemp("airflow_home")
    definitions = tmp_path_factory.mktemp("materialized")
    write_definitions(definitions, h2o3_db, fail_db)
    env = base_env(catalog_url, home, tmp_path_factory.mktemp("output"), definitions)
    # Tests write their outputs into their own tmp_path: the session's temporary folder is an output root too
    # (the first root stays where relative outputs go).
    env["IOX_OUTPUT_ROOTS"] = os.pathsep.join([env["IOX_OUTPUT_ROOT"], str(tmp_path_factory.getbasetemp())])
    setup_airflow(env)
    return env




@pytest.fixture(scope="session")
def dag_runner(airflow_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[DagRunner]:
    """One Airflow process for every dag.test() run of the session (see dagtest_runner.py)."""
    runner = DagRunner(airflow_env, tmp_path_factory.mktemp("dag_runner") / "stderr.log")
    try:
        yield runner
    finally:
        runner.close()
