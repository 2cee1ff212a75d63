"""End to end on real Spark and real Postgres: plans from the catalog, rows as a user reads them. Every case runs
on the in-process runner, and `ON_CONNECT` of them (a seeded sample; all with IOX_CONNECT_RUN=all) on the connect
runner too, against the same expected rows (`tests/connect_support.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from connect_support import Leg, both_runners
from iox_planner.catalog.store import Catalog
from spark_support import load

pytestmark = pytest.mark.spark

ON_CONNECT = 5


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    both_runners(metafunc, ON_CONNECT)

T0 = 1_704_067_200_000_000_000  # 2024-01-01T00:00:00Z

H2O_C4 = """\
h2o,state=CA,city=SF min_temp=68.4,max_temp=85.7,area=500u 600
h2o,state=CA,city=SJ min_temp=69.5,max_temp=89.2 600
h2o,state=MA,city=Bedford max_temp=80.75,area=742u 400
h2o,state=MA,city=Boston min_temp=65.40,max_temp=82.67 400
"""
H2O_C5 = """\
h2o,state=MA,city=Bedford max_temp=88.75,area=742u 600
h2o,state=CA,city=SF min_temp=68.4,max_temp=85.7,area=500u 650
h2o,state=CA,city=SJ min_temp=68.5,max_temp=90.0 600
h2o,state=CA,city=SJ min_temp=75.5,max_temp=84.08 700
h2o,state=MA,city=Boston min_temp=67.4 550
"""


def ts(ns: int) -> str:
    from iox_planner.timeutil import format_time

    return format_time(ns)


def test_seed_001_h2o_example_returns_exactly_the_deduplicated_rows(runner: Leg, catalog: Catalog, db: str) -> None:
    load(catalog, db, [{"id": "C4", "kind": "parquet", "lines": H2O_C4},
                       {"id": "C5", "kind": "ingester", "lines": H2O_C5}])
    rows = runner.jsonl(catalog, db,
                     "SELECT state, city, min_temp, max_temp, area, time FROM h2o ORDER BY state, city, time")
    assert rows == [
        {"state": "CA", "city": "SF", "min_temp": 68.4, "max_temp": 85.7, "area": 500, "time": ts(600)},
        {"state": "CA", "city": "SF", "min_temp": 68.4, "max_temp": 85.7, "area": 500, "time": ts(650)},
        {"state": "CA", "city": "SJ", "min_temp": 68.5, "max_temp": 90.0, "area": None, "time": ts(600)},
        {"state": "CA", "city": "SJ", "min_temp": 75.5, "max_temp": 84.08, "area": None, "time": ts(700)},
        {"state": "MA", "city": "Bedford", "min_temp": None, "max_temp": 80.75, "area": 742, "time": ts(400)},
        {"state": "MA", "city": "Bedford", "min_temp": None, "max_temp": 88.75, "area": 742, "time": ts(600)},
        {"state": "MA", "city": "Boston", "min_temp": 65.4, "max_temp": 82.67, "area": None, "time": ts(400)},
        {"state": "MA", "city": "Boston", "min_temp": 67.4, "max_temp": None, "area": None, "time": ts(550)},
    ]


def test_filter_on_two_fields_sees_the_merged_row(runner: Leg, catalog: Catalog, db: str) -> None:
    load(catalog, db, [{"id": "A", "kind": "parquet", "lines": f"m,tag=A f1=2 {T0}"},
                       {"id": "B", "kind": "ingester", "lines": f"m,tag=A f2=3 {T0}"}])
    rows = runner.jsonl(catalog, db, "SELECT tag, f1, f2, time FROM m WHERE f1 = 2 AND f2 = 3")
    assert rows == [{"tag": "A", "f1": 2.0, "f2": 3.0, "time": "2024-01-01T00:00:00Z"}]
    assert runner.jsonl(catalog, db, "SELECT count(*) AS n FROM m") == [{"n": 1}]


def test_null_tags_group_together_and_differ_from_values(runner: Leg, catalog: Catalog, db: str) -> None:
    load(catalog, db, [
        {"id": "A", "kind": "parquet", "lines": f"m,host=a v=1 {T0}\nm v=2 {T0}"},
        {"id": "B", "kind": "ingester", "lines": f"m v=3 {T0}\nm,region=x v=4 {T0}"},
    ])
    rows = runner.jsonl(catalog, db, "SELECT host, region, v FROM m ORDER BY host NULLS FIRST, region NULLS FIRST")
    assert rows == [
        {"host": None, "region": None, "v": 3.0},
        {"host": None, "region": "x", "v": 4.0},
        {"host": "a", "region": None, "v": 1.0},
    ]


def test_chunks_with_different_columns(runner: Leg, catalog: Catalog, db: str) -> None:
    load(catalog, db, [
        {"id": "A", "kind": "parquet", "lines": f"m,host=a x=1i {T0}\nm,host=b x=2i {T0}"},
        {"id": "B", "kind": "parquet", "lines": f"m,host=a,dc=eu y=true {T0}"},
        {"id": "C", "kind": "ingester", "lines": f"m,host=a s=\"hi\",x=5i {T0}"},
    ])
    rows = runner.jsonl(catalog, db, "SELECT * FROM m ORDER BY host, dc NULLS FIRST")
    assert rows == [
        {"dc": None, "host": "a", "s": "hi", "x": 5, "y": None, "time": "2024-01-01T00:00:00Z"},
        {"dc": "eu", "host": "a", "s": None, "x": None, "y": True, "time": "2024-01-01T00:00:00Z"},
        {"dc": None, "host": "b", "s": None, "x": 2, "y": None, "time": "2024-01-01T00:00:00Z"},
    ]


def test_points_1ns_apart_stay_distinct_and_keep_nanoseconds(runner: Leg, catalog: Catalog, db: str) -> None:
    load(catalog, db, [
        {"id": "A", "kind": "parquet", "lines": f"m,t=a v=1 {T0 + 1}\nm,t=a v=2 {T0 + 2}"},
        {"id": "B", "kind": "ingester", "lines": f"m,t=a v=3 {T0 + 2}\nm,t=a v=4 {T0 + 123456789}"},
    ])
    rows = runner.jsonl(catalog, db, "SELECT t, v, time FROM m")
    assert sorted(rows, key=lambda r: r["v"]) == [
        {"t": "a", "v": 1.0, "time": "2024-01-01T00:00:00.000000001Z"},
        {"t": "a", "v": 3.0, "time": "2024-01-01T00:00:00.000000002Z"},
        {"t": "a", "v": 4.0, "time": "2024-01-01T00:00:00.123456789Z"},
    ]


def test_ingester_chunk_newer_than_parquet_wins(runner: Leg, catalog: Catalog, db: str) -> None:
    load(catalog, db, [
        {"id": "F", "kind": "parquet", "order": 1, "lines": f"m,t=a v=1,w=1 {T0}"},
        {"id": "I", "kind": "ingester", "order": 2, "lines": f"m,t=a v=2 {T0}"},
    ])
    assert runner.jsonl(catalog, db, "SELECT v, w FROM m") == [{"v": 2.0, "w": 1.0}]


def test_older_ingester_chunk_loses_to_newer_file(runner: Leg, catalog: Catalog, db: str) -> None:
    load(catalog, db, [
        {"id": "I", "kind": "ingester", "order": 1, "lines": f"m,t=a v=1,w=1 {T0}"},
        {"id": "F", "kind": "parquet", "order": 2, "lines": f"m,t=a v=2 {T0}"},
    ])
    assert runner.jsonl(catalog, db, "SELECT v, w FROM m") == [{"v": 2.0, "w": 1.0}]


def test_duplicates_inside_one_ingester_chunk_resolve_by_write_position(runner: Leg, catalog: Catalog,
                                                                       db: str) -> None:
    load(catalog, db, [{"id": "I", "kind": "ingester",
                        "lines": f"m,t=a v=1 {T0}\nm,t=a v=2,w=7 {T0}\nm,t=a v=3 {T0}\nm,t=b v=9 {T0}"}])
    rows = runner.jsonl(catalog, db, "SELECT t, v, w FROM m ORDER BY t")
    assert rows == [{"t": "a", "v": 3.0, "w": 7.0}, {"t": "b", "v": 9.0, "w": None}]


def test_join_of_two_tables(runner: Leg, catalog: Catalog, db: str) -> None:
    load(catalog, db, [
        {"id": "C", "kind": "parquet", "lines": f"cpu,host=a usage=10 {T0}\ncpu,host=b usage=20 {T0}"},
        {"id": "C2", "kind": "ingester", "lines": f"cpu,host=a usage=15 {T0}"},
        {"id": "H", "kind": "parquet", "lines": f"hosts,host=a rack=\"r1\" {T0}\nhosts,host=b rack=\"r2\" {T0}"},
    ])
    rows = runner.jsonl(catalog, db,
                     "SELECT c.host, h.rack, c.usage FROM cpu c JOIN hosts h ON c.host = h.host ORDER BY c.host")
    assert rows == [{"host": "a", "rack": "r1", "usage": 15.0}, {"host": "b", "rack": "r2", "usage": 20.0}]


def test_unsigned_full_range_survives(runner: Leg, catalog: Catalog, db: str) -> None:
    load(catalog, db, [{"id": "A", "kind": "ingester", "lines": f"m,t=a u=18446744073709551615u,i=-9223372036854775808i {T0}"}])
    assert runner.jsonl(catalog, db, "SELECT u, i FROM m") == [
        {"u": 18446744073709551615, "i": -9223372036854775808}]


def test_time_range_is_half_open(runner: Leg, catalog: Catalog, db: str) -> None:
    load(catalog, db, [{"id": "A", "kind": "parquet",
                        "lines": f"m,t=a v=1 {T0 - 1}\nm,t=a v=2 {T0}\nm,t=a v=3 {T0 + 999}\nm,t=a v=4 {T0 + 1000}"}])
    rows = runner.jsonl(catalog, db, "SELECT v FROM m ORDER BY v", time_start=T0, time_end=T0 + 1000)
    assert rows == [{"v": 2.0}, {"v": 3.0}]


def test_bound_parameters(runner: Leg, catalog: Catalog, db: str) -> None:
    load(catalog, db, [{"id": "A", "kind": "parquet", "lines": f"m,t=a v=1 {T0}\nm,t=b v=2 {T0}"}])
    rows = runner.jsonl(catalog, db, "SELECT t FROM m WHERE t = :who", params={"who": "b"})
    assert rows == [{"t": "b"}]
    # A value that looks like SQL stays a value.
    assert runner.jsonl(catalog, db, "SELECT t FROM m WHERE t = :who", params={"who": "b' OR '1'='1"}) == []


def test_missing_file_names_file_and_chunk_and_writes_nothing(runner: Leg, catalog: Catalog, db: str,
                                                             tmp_path: Path) -> None:
    from common_support import live_chunks
    from spark_support import warehouse_path

    load(catalog, db, [{"id": "GONE", "kind": "parquet", "lines": f"m,t=a v=1 {T0}"}])
    (chunk,) = live_chunks(catalog, db)
    path = warehouse_path() / chunk["path"]
    path.unlink()
    out = tmp_path / "out.jsonl"
    result = runner.cli("query", "--db", db, "SELECT * FROM m", "--format", "jsonl", "--output", str(out))
    assert result.returncode != 0
    assert "GONE" in result.stderr and str(path) in result.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_corrupt_file_names_file_and_chunk(runner: Leg, catalog: Catalog, db: str) -> None:
    from common_support import live_chunks
    from spark_support import warehouse_path

    load(catalog, db, [{"id": "BAD", "kind": "ingester", "lines": f"m,t=a v=1 {T0}"}])
    (chunk,) = live_chunks(catalog, db)
    path = warehouse_path() / chunk["path"]
    path.write_bytes(b"PAR1 this is not parquet at all")
    result = runner.cli("query", "--db", db, "SELECT * FROM m", "--format", "csv")
    assert result.returncode != 0
    assert "BAD" in result.stderr and str(path) in result.stderr


def test_time_through_ctes_subqueries_and_self_joins_keeps_nanoseconds_and_orders_ties(
        runner: Leg, catalog: Catalog, db: str) -> None:
    # Every point but one falls in the first microsecond: only the nanoseconds tell them apart and order them.
    load(catalog, db, [
        {"id": "A", "kind": "parquet", "lines": f"m,t=a v=1 {T0 + 2}\nm,t=a v=2 {T0 + 999}\nm,t=a v=3 {T0 + 1}"},
        {"id": "B", "kind": "ingester", "lines": f"m,t=b v=4 {T0 + 1000}\nm,t=b v=5 {T0 + 500}"},
    ])
    rows = runner.jsonl(catalog, db,
                     "WITH x AS (SELECT t, v, time FROM m) SELECT * FROM (SELECT v, time AS ts FROM x) s "
                     "ORDER BY ts DESC")
    assert rows == [{"v": 4.0, "ts": ts(T0 + 1000)}, {"v": 2.0, "ts": ts(T0 + 999)}, {"v": 5.0, "ts": ts(T0 + 500)},
                    {"v": 1.0, "ts": ts(T0 + 2)}, {"v": 3.0, "ts": ts(T0 + 1)}]
    assert ts(T0 + 500) == "2024-01-01T00:00:00.0000005Z"
    rows = runner.jsonl(catalog, db,
                     "SELECT a.v, a.time AS t1, b.time AS t2 FROM m a JOIN m b ON a.v + 1 = b.v "
                     "WHERE a.t = 'a' ORDER BY t1 LIMIT 2")
    assert rows == [{"v": 3.0, "t1": ts(T0 + 1), "t2": ts(T0 + 1000)},
                    {"v": 1.0, "t1": ts(T0 + 2), "t2": ts(T0 + 999)}]
    # A UNION keeps Spark's microseconds (the documented fallback).
    rows = runner.jsonl(catalog, db, "SELECT time FROM m WHERE v = 1 UNION ALL SELECT time FROM m WHERE v = 4")
    assert sorted(r["time"] for r in rows) == ["2024-01-01T00:00:00.000001Z", "2024-01-01T00:00:00Z"]
