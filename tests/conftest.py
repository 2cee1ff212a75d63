"""Shared fixtures: the tests' own catalog database (on the project's local Postgres, never the user's catalog)
and their own warehouse."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from iox_planner.catalog import localpg
from iox_planner.catalog.store import Catalog

ROOT = Path(__file__).resolve().parents[1]


def _fresh_database(prefix: str) -> tuple[str, str]:
    pg = localpg.ensure_running()
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    return name, localpg.ensure_database(pg, name)


def _drop_database(name: str) -> None:
    localpg.drop_database(localpg.ensure_running(), name)


@pytest.fixture(scope="session", autouse=True)
def s3_server() -> Iterator[Any]:
    """This worker's S3 API server on loopback (moto's standalone server, a process of its own), with the
    `AWS_*` settings pointing every process at it set before any SparkSession starts, so Spark's Python workers
    inherit them as a deployment's executors would have theirs."""
    from s3_support import S3Server

    server = S3Server()
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    yield server
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.stop()


@pytest.fixture
def s3_warehouse(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh `s3://` warehouse in the test bucket, set as IOX_WAREHOUSE for this test."""
    from s3_support import fresh_prefix

    uri = fresh_prefix()
    monkeypatch.setenv("IOX_WAREHOUSE", uri)
    return uri


@pytest.fixture(scope="session")
def catalog_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A catalog database of the test session's own, migrated; the environment points every command at it."""
    name, url = _fresh_database("iox_test")
    warehouse = tmp_path_factory.mktemp("warehouse")
    saved = {k: os.environ.get(k) for k in ("IOX_CATALOG_URL", "IOX_WAREHOUSE")}
    os.environ["IOX_CATALOG_URL"] = url
    os.environ["IOX_WAREHOUSE"] = str(warehouse)
    Catalog(url).migrate()
    yield url
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _drop_database(name)


@pytest.fixture(scope="session")
def catalog(catalog_url: str) -> Iterator[Catalog]:
    cat = Catalog(catalog_url)
    yield cat
    cat.dispose()


@pytest.fixture
def warehouse() -> Path:
    return Path(os.environ["IOX_WAREHOUSE"])


@pytest.fixture
def db(catalog: Catalog) -> str:
    """A database name no other test uses (databases are created by the first write)."""
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def spark(catalog_url: str) -> Iterator[object]:
    """One local SparkSession for the whole run (JVM start-up costs about 10 s), the CLI's own."""
    from spark_jobs.session import shared_session

    yield shared_session()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that kills the shared Connect server (`connect_support.kills_the_server`) runs last."""
    items.sort(key=lambda item: getattr(getattr(item, "function", None), "kills_the_server", False))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `-n N`, the tests on the Spark Connect server all go to one worker (`connect_support`)."""
    if config.getvalue("dist") != "load":
        return None
    from connect_support import one_connect_worker

    return one_connect_worker(config, log)


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """This process's private Spark Connect server (`connect_support.Server`), shared by every test that uses
    the connect runner and the DAGs' tests over Connect; the test that kills it has the next test start another."""
    from connect_support import private_server

    yield from private_server(tmp_path_factory)


@pytest.fixture
def connect(connect_server: Any, catalog_url: str) -> dict[str, str]:
    """The environment of an `iox-batch` run on the connect runner, on the private server (and the tests'
    catalog)."""
    return dict(connect_server.env())


@pytest.fixture(scope="session")
def connect_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The child process that runs the connect runner's plans for `runner` (`connect_support.ConnectClient`)."""
    from connect_support import ConnectClient

    client = ConnectClient(tmp_path_factory.mktemp("connect-client") / "client.log")
    yield client
    client.close()


@pytest.fixture
def runner(request: pytest.FixtureRequest) -> object:
    """The runner a test's queries go through (`connect_support.Leg`): the in-process session, or with the
    parameter `connect` (`connect_support.both_runners`) the private Connect server."""
    from connect_support import ConnectLeg, Leg

    if getattr(request, "param", "in-process") == "connect":
        request.getfixturevalue("catalog_url")
        return ConnectLeg(request.getfixturevalue("connect_server"), request.getfixturevalue("connect_client"))
    return Leg(request.getfixturevalue("spark"))


@pytest.fixture
def empty_catalog() -> Iterator[str]:
    """A brand-new, unmigrated catalog database."""
    name, url = _fresh_database("iox_empty")
    yield url
    _drop_database(name)


from common_support import run_cli  # noqa: E402,F401  (kept importable from conftest)


class Untouched:
    """A canary folder (files a hostile input might try to replace, read or overwrite), the warehouse and the
    catalog's row counts, snapshotted; `check()` fails if any of them changed."""

    def __init__(self, canary: Path, warehouse: Path, catalog: Catalog) -> None:
        from common_support import catalog_counts, tree_digest

        self.canary = canary
        self.warehouse = warehouse
        self.catalog = catalog
        (canary / "keep.txt").write_text("canary\n")
        (canary / "folder").mkdir()
        (canary / "folder" / "inner.txt").write_text("inner\n")
        (canary / ".iox-batch").write_text("a planted marker: must not make anything replaceable\n")
        self._digest = tree_digest
        self._counts = catalog_counts
        self.before = (tree_digest(canary), tree_digest(warehouse), catalog_counts(catalog))

    def check(self) -> None:
        after = (self._digest(self.canary), self._digest(self.warehouse), self._counts(self.catalog))
        assert after[0] == self.before[0], "the canary folder changed"
        assert after[1] == self.before[1], "the warehouse changed"
        assert after[2] == self.before[2], "the catalog changed"


@pytest.fixture
def untouched(tmp_path: Path, catalog: Catalog) -> Untouched:
    """Snapshot a canary folder (`untouched.canary`), the warehouse and the catalog; call `.check()` after the
    hostile command."""
    canary = tmp_path / "canary"
    canary.mkdir()
    return Untouched(canary, Path(os.environ["IOX_WAREHOUSE"]), catalog)


@pytest.fixture
def outside() -> Iterator[Path]:
    """A folder outside every output root a test configures (and outside pytest's temporary folder, which the
    Airflow tests make an output root)."""
    import shutil

    folder = Path("/tmp") / f"iox-sec-outside-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    yield folder
    shutil.rmtree(folder)
