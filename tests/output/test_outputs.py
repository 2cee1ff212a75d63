"""Output formats, atomic publication, the spark-submit path and EXPLAIN ANALYZE, through the CLI."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import sqlalchemy as sa
import pytest

from common_support import run_cli
from iox_planner.catalog.store import Catalog
from spark_support import cli, load

pytestmark = pytest.mark.spark

T0 = 1_704_067_200_000_000_000
LINES = f"m,t=a v=1.5,n=3i,ok=true {T0 + 5}\nm,t=b v=2.5,s=\"x,y\" {T0 + 1000}\nm,t=a v=9.5 {T0 + 5}"
SQL = "SELECT t, v, n, ok, s, time FROM m ORDER BY t"
EXPECTED = [
    {"t": "a", "v": 9.5, "n": 3, "ok": True, "s": None, "time": "2024-01-01T00:00:00.000000005Z"},
    {"t": "b", "v": 2.5, "n": None, "ok": None, "s": "x,y", "time": "2024-01-01T00:00:00.000001Z"},
]


@pytest.fixture
def data(catalog: Catalog, db: str) -> str:
    load(catalog, db, [{"id": "F", "kind": "parquet", "order": 1, "lines": LINES.split("\n", 2)[0]},
                       {"id": "I", "kind": "ingester", "order": 2, "lines": "\n".join(LINES.split("\n")[1:])}])
    return db


def test_jsonl_file_and_csv_file(spark: Any, data: str, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    result = run_cli("query", "--db", data, SQL, "--format", "jsonl", "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert "2 rows written to" in result.stdout
    assert [json.loads(line) for line in out.read_text().splitlines()] == EXPECTED
    out_csv = tmp_path / "r.csv"
    assert cli("query", "--db", data, SQL, "--format", "csv", "--output", str(out_csv)).returncode == 0
    with open(out_csv, newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows == [["t", "v", "n", "ok", "s", "time"],
                    ["a", "9.5", "3", "true", "", "2024-01-01T00:00:00.000000005Z"],
                    ["b", "2.5", "", "", "x,y", "2024-01-01T00:00:00.000001Z"]]
    # Rerunning replaces what iox-batch wrote.
    assert cli("query", "--db", data, SQL, "--format", "csv", "--output", str(out_csv)).returncode == 0


def test_parquet_folder_with_microsecond_timestamps(spark: Any, data: str, tmp_path: Path, catalog: Any) -> None:
    out = tmp_path / "r.parquet"
    result = cli("query", "--db", data, SQL, "--format", "parquet", "--output", str(out))
    assert result.returncode == 0, result.stderr
    # What was published is recorded in the catalog (not by a marker inside the output).
    with catalog.engine.connect() as conn:
        kinds = conn.execute(sa.text("SELECT kind FROM iox_output_publication WHERE path = :p")
                             .bindparams(p=str(out.resolve()))).scalars().all()
    assert kinds == ["folder"] and not (out / ".iox-batch").exists()
    table = pq.read_table(out)
    assert str(table.schema.field("time").type) == "timestamp[us, tz=UTC]"
    rows = sorted(table.to_pylist(), key=lambda r: r["t"])
    assert [(r["t"], r["v"], r["time"].isoformat()) for r in rows] == [
        ("a", 9.5, "2024-01-01T00:00:00+00:00"), ("b", 2.5, "2024-01-01T00:00:00.000001+00:00")]
    assert cli("query", "--db", data, SQL, "--format", "parquet", "--output", str(out)).returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.parquet"]


def test_never_replaces_what_iox_batch_did_not_write(spark: Any, data: str, tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("mine")
    result = cli("query", "--db", data, SQL, "--format", "parquet", "--output", str(precious))
    assert result.returncode != 0 and "not written by iox-batch" in result.stderr
    assert (precious / "keep.txt").read_text() == "mine" and len(list(precious.iterdir())) == 1
    file = tmp_path / "notes.jsonl"
    file.write_text("hand-written\n")
    result = cli("query", "--db", data, SQL, "--format", "jsonl", "--output", str(file))
    assert result.returncode != 0 and file.read_text() == "hand-written\n"


def test_failed_query_publishes_nothing(spark: Any, data: str, tmp_path: Path) -> None:
    out = tmp_path / "r.parquet"
    # Division by zero is an error in ANSI mode: it fails while Spark writes, after planning succeeded.
    result = run_cli("query", "--db", data, "SELECT n / 0 AS boom FROM m", "--format", "parquet", "--output", str(out))
    assert result.returncode != 0 and result.stderr.startswith("error: ")
    assert list(tmp_path.iterdir()) == []


def test_spark_submit_gives_the_same_rows_as_in_process(spark: Any, data: str, tmp_path: Path) -> None:
    out = tmp_path / "submit.jsonl"
    result = run_cli("query", "--db", data, SQL, "--format", "jsonl", "--output", str(out),
                     env={"IOX_RUNNER": "spark-submit", "IOX_SPARK_MASTER": "local[1]"})
    assert result.returncode == 0, result.stderr
    assert [json.loads(line) for line in out.read_text().splitlines()] == EXPECTED


def test_explain_analyze_shows_metrics(spark: Any, data: str) -> None:
    result = cli("explain", "--analyze", "--db", data, "SELECT * FROM m")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "analyze: 2 result rows" in text
    dedup_line = next(line for line in text.splitlines() if "DeduplicateExec" in line)
    assert "input_rows=3" in dedup_line and "duplicates_removed=1" in dedup_line and "output_rows=2" in dedup_line
    assert "files=1" in text


@pytest.mark.parametrize("args, needle", [
    (["--format", "parquet"], "give --output"),
    (["--format", "table", "--output", "/tmp/x"], "terminal"),
    (["--time-start", "2024-01-02T00:00:00Z", "--time-end", "2024-01-01T00:00:00Z"], "is not before its end"),
    (["--time-start", "yesterday"], "not an RFC 3339 time"),
    (["--param", "novalue"], "NAME=VALUE"),
])
def test_bad_query_options(catalog: Catalog, data: str, args: list[str], needle: str) -> None:
    result = cli("query", "--db", data, "SELECT * FROM m", *args)
    assert result.returncode != 0 and needle in result.stderr, result.stderr


@pytest.mark.parametrize("sql, needle", [
    ("SELEC * FROM m", "parse"),
    ("DROP TABLE m", "SELECT"),
    ("SELECT * FROM nope", "nope"),
    ("SELECT reflect('java.lang.Runtime', 'getRuntime') FROM m", "reflect"),
])
def test_bad_sql_is_refused_before_spark(catalog: Catalog, data: str, sql: str, needle: str) -> None:
    result = cli("query", "--db", data, sql)
    assert result.returncode != 0 and needle in result.stderr, result.stderr
