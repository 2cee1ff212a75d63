"""Reading what changed (issue 26): a consumer of `iox-batch query --changes-since` never misses nor repeats a
change across writes, persist and compaction, on the real catalog and the shared local SparkSession."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from common_support import live_chunks
from spark_support import cli

from iox_planner.catalog.store import Catalog
from iox_planner.ingest import write as ingest
from iox_planner.ingest.scenario import load_scenario, parse_scenario
from iox_planner.maintenance import persist
from iox_planner.timeutil import parse_time

pytestmark = [pytest.mark.spark]

S = 10**9
T0 = 1704067200 * S  # 2024-01-01T00:00:00Z


class Consumer:
    """A downstream job: reads what changed since its watermark, keeps the newest row per key."""

    def __init__(self, db: str) -> None:
        self.db = db
        self.mark = "beginning"
        self.seen: dict[tuple[str, int], float] = {}

    def read(self) -> list[tuple[str, int, float]]:
        result = cli("query", "--db", self.db, "--format", "jsonl", "--changes-since", self.mark,
                     "SELECT k, v, time FROM m")
        assert result.returncode == 0, result.stderr
        (line,) = [x for x in result.stderr.splitlines() if x.startswith("watermark: ")]
        self.mark = line.removeprefix("watermark: ")
        rows = sorted((r["k"], parse_time(r["time"]), r["v"]) for r in map(json.loads, result.stdout.splitlines()))
        for k, t, v in rows:
            self.seen[(k, t)] = v
        return rows


@pytest.mark.parametrize("warehouse_kind", ["local", "s3"])
def test_a_changes_consumer_never_misses_nor_repeats_across_persist_and_compaction(
        spark: object, catalog: Catalog, db: str, warehouse_kind: str, request: pytest.FixtureRequest) -> None:
    """On a local warehouse and on an `s3://` one (the store's reader derives each row's write order per file)."""
    if warehouse_kind == "s3":
        request.getfixturevalue("s3_warehouse")
    t = [T0 + i * S for i in range(4)]
    truth: dict[tuple[str, int], float] = {}

    def write(lines: list[tuple[str, int, float]]) -> None:
        ingest.write_line_protocol(catalog, db, "\n".join(f"m,k={k} v={v} {t[i]}" for k, i, v in lines))
        truth.update({(k, t[i]): v for k, i, v in lines})

    consumer = Consumer(db)
    write([("a", 0, 1.0), ("b", 1, 2.0)])
    assert [(k, v) for k, _, v in consumer.read()] == [("a", 1.0), ("b", 2.0)]
    assert consumer.read() == []  # nothing written since

    # Key a rewritten twice between two reads: it comes back once, with its last value.
    write([("a", 0, 10.0), ("c", 2, 3.0)])
    write([("a", 0, 11.0)])
    persist.persist(catalog, db)
    assert [(k, v) for k, _, v in consumer.read()] == [("a", 11.0), ("c", 3.0)]

    # A write, persist and compaction between reads: only the key written, whatever moved.
    write([("b", 1, 20.0)])
    persist.persist(catalog, db)
    assert cli("compact", "--db", db).returncode == 0
    assert {c["compaction_level"] for c in live_chunks(catalog, db)} == {1}
    assert [(k, v) for k, _, v in consumer.read()] == [("b", 20.0)]
    assert consumer.read() == []
    write([("d", 3, 4.0)])
    assert [(k, v) for k, _, v in consumer.read()] == [("d", 4.0)]
    assert consumer.seen == truth

    # A watermark the catalog did not issue for this database is one clear paragraph.
    forged = consumer.mark[:-1] + ("0" if consumer.mark[-1] != "0" else "1")
    for bad in (forged, "W1-1-1", "yesterday"):
        result = cli("query", "--db", db, "--changes-since", bad, "SELECT * FROM m")
        assert result.returncode != 0 and result.stderr.startswith("error: --changes-since"), result.stderr


def test_a_watermark_the_catalog_can_no_longer_answer_is_refused(spark: object, catalog: Catalog, db: str) -> None:
    consumer = Consumer(db)
    ingest.write_line_protocol(catalog, db, f"m,k=a v=1 {T0}\nm,k=b v=2 {T0 + S}")
    consumer.read()
    stale_mark = consumer.mark
    # A scenario load writes a chunk "in the past" (an explicit order below the counter, another day): a read since the earlier
    # watermark would miss it, so that watermark is refused, with the way out.
    load_scenario(catalog, parse_scenario({"chunks": [
        {"id": "past", "kind": "ingester", "order": 1, "lines": f"m,k=c v=3 {T0 + 86400 * S}"}]}), db)
    result = cli("query", "--db", db, "--changes-since", stale_mark, "SELECT k, v FROM m")
    assert result.returncode != 0
    assert "cannot tell exactly what changed" in result.stderr and "--changes-since beginning" in result.stderr
    # Reading every key once gives a watermark that works again.
    consumer.mark = "beginning"
    assert [k for k, _, _ in consumer.read()] == ["a", "b", "c"]
    assert consumer.read() == []


def test_iox_query_param_changes_since_plans_and_records_the_watermark(
        spark: object, catalog: Catalog, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run domain `iox_query`'s tasks call (plan, Spark in-process, commit), without Airflow itself."""
    from spark_jobs.launch import InProcessLauncher
    from iox_planner.runs.commit import commit
    from iox_planner.runs.planning import plan
    from iox_planner.runs.request import QueryRequest
    from iox_planner.runs.refresh import run_jobs
    from iox_planner.runs.settings import RunSettings
    from iox_planner.runs.staging import RunIdentity

    monkeypatch.setenv("IOX_OUTPUT_ROOT", str(tmp_path))
    monkeypatch.delenv("IOX_OUTPUT_ROOTS", raising=False)
    settings = RunSettings.from_env()

    def read(since: str, n: int) -> tuple[list[str], str]:
        request = QueryRequest.from_params({"db": db, "sql": "SELECT k, v FROM m", "output": f"r{n}.jsonl",
                                            "format": "jsonl", "changes_since": since}, settings)
        run = RunIdentity("iox_query", f"changes_{n}")
        outcome = plan(request, run, settings)
        run_jobs(outcome, InProcessLauncher())
        assert commit(request, run, outcome.handle()).rows >= 0
        with catalog.engine.connect() as conn:
            recorded = conn.execute(sa.text("SELECT changes_watermark, params->>'changes_since' FROM iox_query_run "
                                            "WHERE id = :i").bindparams(i=outcome.query_run)).one()
        assert recorded[0] == outcome.summary["changes_watermark"] and recorded[1] == since
        keys = sorted(json.loads(line)["k"] for line in (tmp_path / f"r{n}.jsonl").read_text().splitlines())
        return keys, recorded[0]

    ingest.write_line_protocol(catalog, db, f"m,k=a v=1 {T0}\nm,k=b v=2 {T0 + S}")
    keys, mark = read("beginning", 1)
    assert keys == ["a", "b"]
    ingest.write_line_protocol(catalog, db, f"m,k=b v=3 {T0 + S}")
    keys, mark = read(mark, 2)
    assert keys == ["b"]
    assert read(mark, 3)[0] == []
