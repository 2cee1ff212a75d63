"""Garbage collection on a store the sweeps can only list (`maintenance/sweeps.py`), against the suite's real S3
API server and the real catalog: the listing sweep deletes exactly the unreferenced objects older than the grace
period (by the store's last-modified time), keeps young ones, referenced ones (live or retired) and names that are
not iox-batch's, asks the catalog in batches, and keeps everything when the catalog stops answering (Postgres
reached through a TCP proxy that is cut just before the lookup); compaction strays and dead bulk loads' staging on
the store; a database's leftovers after a drop."""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from common_support import live_chunks
from s3_support import CuttableProxy
from iox_planner import storage
from iox_planner.catalog import locks
from iox_planner.catalog.store import Catalog
from iox_planner.ingest import bulk
from iox_planner.ingest.write import write_line_protocol
from iox_planner.maintenance.persist import persist
from iox_planner.maintenance.sweeps import sweep_bulk_loads, sweep_compaction_strays, sweep_unreferenced
from iox_planner.objectstore import Root, parse_root

T0 = 1_704_067_200_000_000_000
DAY = 86_400_000_000_000
AGE = 3.0
"""Seconds between putting the "old" objects and the "young" ones (a store's last-modified time has whole
seconds, truncated)."""
GRACE = 1.0
"""A grace period the old objects are past, once `AGE` has passed."""


def _grace_between(old_put: float) -> float:
    """A grace period that, taken at once, puts the cutoff half a second after `old_put` (when the last old object
    was put): every old object is older, and a young one put `AGE` seconds later is younger, its last-modified
    time truncated to the second, however long the test took in between."""
    return time.time() - (old_put + 0.5)


@pytest.fixture
def root(s3_warehouse: str) -> Root:
    return parse_root(s3_warehouse)


def _keys(root: Root) -> set[str]:
    return {o.rel for o in root.list()}


def _lookups(catalog: Catalog) -> tuple[list[str], Any]:
    """The statements that ask the catalog which paths it names, as they are sent."""
    sent: list[str] = []

    def seen(conn: object, cursor: object, statement: str, *rest: object) -> None:
        if "ANY" in statement and "path" in statement:
            sent.append(statement)

    return sent, seen


def test_the_listing_sweep_deletes_exactly_the_old_unreferenced_objects_in_batches(
        catalog: Catalog, db: str, root: Root, s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = "".join(f"m,h=h{k} v={k} {T0 + k * DAY}\n" for k in range(4))
    write_line_protocol(catalog, db, lines, warehouse=root)
    write_line_protocol(catalog, db, f"m,h=h0 v=9 {T0}\n", warehouse=root)
    persist(catalog, db, warehouse=root, table="m")  # retires the ingester chunks: named by retired rows still
    named = {c["path"] for c in live_chunks(catalog, db)}
    with catalog.engine.connect() as conn:
        retired = set(conn.execute(sa.text(
            "SELECT c.path FROM iox_ingester_chunk c JOIN iox_table t ON t.id = c.table_id JOIN iox_database d "
            "ON d.id = t.database_id WHERE d.name = :db AND c.to_delete IS NOT NULL").bindparams(db=db)).scalars())
    assert retired and named and not retired & named
    db_id, table_id, part_id = next(iter(named)).split("/")[:3]
    # Old strays: a killed write's chunk in a live partition and in ids never committed, a killed local writer's
    # temporary name; and objects no sweep may take, however old: other names, another database's chunk.
    strays = {f"{db_id}/{table_id}/{part_id}/{uuid.uuid4()}.parquet",
              f"{db_id}/999999990/999999991/{uuid.uuid4()}.parquet",
              f"{db_id}/{table_id}/{part_id}/.{uuid.uuid4()}.parquet.{uuid.uuid4().hex}.tmp"}
    strays |= {f"{db_id}/{table_id}/{part_id}/{uuid.uuid4()}.parquet" for _ in range(4)}
    foreign = {f"{db_id}/{table_id}/{part_id}/notes.txt",
               f"{db_id}/{table_id}/{part_id}/{uuid.uuid4()}.compacted.parquet",
               f"{db_id}/x/1/{uuid.uuid4()}.parquet", f"{db_id}/{table_id}/{uuid.uuid4()}.parquet",
               f"{int(db_id) + 1000000}/1/2/{uuid.uuid4()}.parquet"}
    for rel in strays | foreign:
        root.put_bytes(b"PAR1", rel)
    old_put = time.time()
    time.sleep(AGE)
    young = f"{db_id}/{table_id}/{part_id}/{uuid.uuid4()}.parquet"
    root.put_bytes(b"PAR1", young)
    everything = _keys(root)
    assert everything == named | retired | strays | foreign | {young}

    assert sweep_unreferenced(catalog, root, int(db_id), grace_seconds=3600) == []
    assert _keys(root) == everything, "deleted within the grace period"

    monkeypatch.setattr(storage, "NAMED_BATCH", 3)
    sent, seen = _lookups(catalog)
    requests_before = len(s3_server.requests())
    sa.event.listen(catalog.engine, "before_cursor_execute", seen)
    try:
        swept = sweep_unreferenced(catalog, root, int(db_id), grace_seconds=_grace_between(old_put))
    finally:
        sa.event.remove(catalog.engine, "before_cursor_execute", seen)
    assert sorted(swept) == sorted(strays)
    assert _keys(root) == named | retired | foreign | {young}
    candidates = len(named | retired | strays)  # every old chunk-named object of the database is asked about
    assert len(sent) == math.ceil(candidates / 3), f"{len(sent)} lookups for {candidates} candidates in batches of 3"
    # The store: one listing (a page holds 1000 keys), then requests for the deleted objects only.
    requests = s3_server.requests()[requests_before:]
    deleted = sorted(p.split("/", 2)[2] for m, p, _ in requests if m == "DELETE")
    assert deleted == sorted(f"{root.base.split('/', 1)[1]}/{rel}" for rel in strays)
    listings = [p for m, p, _ in requests if m == "GET" and "list-type" in p]
    assert len(listings) <= 4, listings  # `_bulk/`, `_loads/` (none there), the database's prefix: pages, not files
    assert {p.split("?")[0] for m, p, _ in requests if m == "HEAD"} <= {f"/{root.base}/{rel}" for rel in strays}


def test_the_sweep_keeps_everything_when_the_catalog_stops_answering(catalog: Catalog, catalog_url: str, db: str,
                                                                      root: Root) -> None:
    write_line_protocol(catalog, db, f"m v=1 {T0}\n", warehouse=root)
    [chunk] = live_chunks(catalog, db)
    db_id, table_id, part_id = chunk["path"].split("/")[:3]
    strays = {f"{db_id}/{table_id}/{part_id}/{uuid.uuid4()}.parquet" for _ in range(3)}
    for rel in strays:
        root.put_bytes(b"PAR1", rel)
    time.sleep(GRACE + 0.2)  # last-modified times are truncated: older than GRACE now
    everything = _keys(root)
    url = sa.engine.make_url(catalog_url)
    proxy = CuttableProxy(int(url.port or 5432))
    flaky = Catalog(url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False))
    sent, seen = _lookups(flaky)

    def cut_before_the_lookup(conn: object, cursor: object, statement: str, *rest: object) -> None:
        seen(conn, cursor, statement)
        if sent:
            proxy.cut()  # Postgres goes away just as the sweep asks which files it names

    sa.event.listen(flaky.engine, "before_cursor_execute", cut_before_the_lookup)
    try:
        with pytest.raises(Exception):
            sweep_unreferenced(flaky, root, int(db_id), grace_seconds=GRACE)
    finally:
        proxy.stop()
        flaky.dispose()
    assert sent, "the sweep never reached its lookup: the cut proved nothing"
    assert _keys(root) == everything, "a file was deleted that the catalog did not answer for"
    assert sorted(sweep_unreferenced(catalog, root, int(db_id), grace_seconds=GRACE)) == sorted(strays)


def test_compaction_strays_and_dead_bulk_loads_on_a_store(catalog: Catalog, db: str, root: Root) -> None:
    write_line_protocol(catalog, db, f"m,t=a f=1 {T0}\n", warehouse=root)
    [chunk] = live_chunks(catalog, db)
    folder = chunk["path"].rpartition("/")[0]
    stray = f"{folder}/{uuid.uuid4()}.compacted.parquet"
    other = f"{folder}/{uuid.uuid4()}.parquet"  # a write's file before its commit: not a compaction's
    nested = f"{folder}/9/{uuid.uuid4()}.compacted.parquet"  # not directly in the partition's folder
    load_id = uuid.uuid4().hex
    staging = f"{storage.BULK_STAGING}/{load_id}"
    moved = f"{folder}/{uuid.uuid4()}.parquet"
    staged = [f"{staging}/000000-000000-0000.parquet", f"{staging}/{storage.BULK_MANIFEST}"]
    for rel in (stray, other, nested, moved, staged[0]):
        root.put_bytes(b"PAR1", rel)
    root.put_bytes(json.dumps([moved, chunk["path"], "../keep.txt", "/etc/passwd"]).encode(), staged[1])
    with catalog.engine.connect() as holder:
        assert locks.try_lock(holder, locks.compaction_key(chunk["partition_id"]))
        assert sweep_compaction_strays(catalog, root, [chunk["partition_id"]]) == 0  # a compaction holds it
        locks.unlock(holder, locks.compaction_key(chunk["partition_id"]))
        holder.commit()
    assert root.exists(stray)
    assert sweep_compaction_strays(catalog, root, [chunk["partition_id"]]) == 1
    assert not root.exists(stray) and root.exists(other) and root.exists(nested)

    assert sweep_bulk_loads(catalog, root, 3600) == []  # within the grace period
    time.sleep(GRACE + 0.2)
    with bulk._load_lock(catalog, load_id):  # a driver still running
        assert sweep_bulk_loads(catalog, root, GRACE) == []
    assert all(root.exists(rel) for rel in [*staged, moved])
    assert sweep_bulk_loads(catalog, root, GRACE) == [load_id]
    assert not any(root.exists(rel) for rel in [*staged, moved])
    assert root.exists(chunk["path"]), "a file the manifest names and the catalog too was deleted"
