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


def test_whole_days_just_outside_the_range_bound_nothing(spark: Any, data: str) -> None:
    """Probe: these bounds ended in "An exception was thrown from the Python worker" (past int64)."""
    result = cli("query", "--db", data, SQL, "--format", "jsonl", "--time-start", "1677-09-21T00:00:00Z",
                 "--time-end", "2262-04-12T00:00:00Z")
    assert result.returncode == 0, result.stderr
    assert [json.loads(line) for line in result.stdout.splitlines()] == EXPECTED


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
    (["--time-start", "2024-01-01T00:00:00+25:00"], "offsets run from -23:59 to +23:59"),  # published 0 rows
    (["--time-end", "2024-01-01T00:00:00Z "], "not an RFC 3339 time"),
    (["--time-start", "2262-04-12T00:00:00Z"], "after the last time data may have (1677-09-22T00:00:00Z to "),
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


# VARIANT values, at the top and inside an array, a struct and a map: each printed as the JSON text Spark's own
# `to_json` makes of it (a JSON `null` is the text null, an SQL NULL stays NULL), never as its binary encoding.
DOC = '{"a":1,"b":[1.50,2e10,"é",null,true],"c":{"d":1.0E-3},"big":12345678901234567890.123}'
VARIANTS = {
    "v": f"parse_json('{DOC}')",
    "per_row": "parse_json(concat('{\"t\":\"', t, '\"}'))",
    "jnull": "parse_json('null')",
    "sqlnull": "CAST(NULL AS VARIANT)",
    "ts": "CAST(TIMESTAMP '2024-01-01 00:00:01.5' AS VARIANT)",
}
NESTED = {"arr": ["parse_json('1')", "parse_json('\"s\"')"], "st": "parse_json('[1,2]')",
          "mp": "parse_json('{\"z\":2.50}')"}
VARIANT_SQL = ("SELECT t, " + ", ".join(f"{e} AS {n}" for n, e in VARIANTS.items())
               + f", array({', '.join(NESTED['arr'])}) AS arr, named_struct('x', {NESTED['st']}, 'y', 3) AS st, "
               f"map('k', {NESTED['mp']}) AS mp FROM m ORDER BY t")


def _to_json(spark: Any, expr: str, t: str = "a") -> str | None:
    """Spark's own `to_json` of the variant `expr` (over a row whose `t` is `t`): the expected text."""
    return spark.sql(f"SELECT to_json({expr}) FROM VALUES ('{t}') AS m(t)").first()[0]


def test_variant_values_print_as_spark_to_json_text(spark: Any, data: str, tmp_path: Path) -> None:
    """csv, jsonl and the table (probe: `{"value": "02010000020c01", "metadata": "0101000161"}` was printed)."""
    want = {t: {n: _to_json(spark, e, t) for n, e in VARIANTS.items()} for t in ("a", "b")}
    assert want["a"]["jnull"] == "null" and want["a"]["sqlnull"] is None and "2.0E10" in want["a"]["v"]
    arr = [_to_json(spark, e) for e in NESTED["arr"]]
    st, mp = _to_json(spark, NESTED["st"]), _to_json(spark, NESTED["mp"])

    out = tmp_path / "v.csv"
    assert cli("query", "--db", data, VARIANT_SQL, "--format", "csv", "--output", str(out)).returncode == 0
    with open(out, newline="") as fh:
        header, *rows = list(csv.reader(fh))
    assert header == ["t", *VARIANTS, "arr", "st", "mp"]
    for row in rows:
        assert row[1:6] == [want[row[0]][n] or "" for n in VARIANTS]
        assert row[6:] == [f"[{arr[0]}, {arr[1]}]", f'{{"x": {st}, "y": 3}}', f'[["k", {mp}]]']

    result = cli("query", "--db", data, VARIANT_SQL, "--format", "jsonl")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    for line, t in zip(lines, ("a", "b")):
        # The text itself, not only what it parses to: 2.0E10 and 20 digits of a decimal come through as written.
        expected = (f'{{"t": "{t}", ' + ", ".join(f'"{n}": {want[t][n] or "null"}' for n in VARIANTS)
                    + f', "arr": [{arr[0]}, {arr[1]}], "st": {{"x": {st}, "y": 3}}, "mp": [["k", {mp}]]}}')
        assert line == expected
        json.loads(line)

    result = cli("query", "--db", data, "SELECT t, " + VARIANTS["per_row"] + " AS v, " + VARIANTS["sqlnull"]
                 + " AS n FROM m ORDER BY t", "--format", "table")
    assert result.returncode == 0, result.stderr
    assert want["a"]["per_row"] in result.stdout and want["b"]["per_row"] in result.stdout
    assert "NULL" in result.stdout and "metadata" not in result.stdout


def test_variant_explode_prints_json_text(spark: Any, data: str) -> None:
    sql = ("SELECT e.key, e.value FROM m, LATERAL variant_explode(parse_json('{\"a\":[1,2.50],\"b\":\"x\"}')) AS e "
           "WHERE m.t = 'a' ORDER BY e.key")
    result = cli("query", "--db", data, sql, "--format", "csv")
    assert result.returncode == 0, result.stderr
    assert list(csv.reader(result.stdout.splitlines())) == [
        ["key", "value"], ["a", _to_json(spark, "parse_json('[1,2.50]')")],
        ["b", _to_json(spark, "parse_json('\"x\"')")]]


def test_variant_through_the_arrow_file_spark_submit_hands_back(spark: Any, tmp_path: Path) -> None:
    """The spark-submit runner's job writes an Arrow IPC file that the CLI prints: the JSON typing survives it."""
    import io

    from iox_planner.cli.runner import print_result
    from iox_planner.output import OutputFormat
    from spark_jobs.load import write_result

    import pyarrow as pa

    df = spark.sql("SELECT " + ", ".join(f"{e} AS {n}" for n, e in VARIANTS.items())
                   + " FROM VALUES ('a') AS m(t)")
    assert write_result(df, "arrow", tmp_path / "r.arrow", None) == 1
    with pa.memory_map(str(tmp_path / "r.arrow")) as source:
        table = pa.ipc.open_file(source).read_all()
    out = io.StringIO()
    print_result(table, OutputFormat.CSV, out)
    assert list(csv.reader(out.getvalue().splitlines()))[1] == [_to_json(spark, e) or "" for e in VARIANTS.values()]


def test_parquet_keeps_variant_as_parquet_variant(spark: Any, data: str, tmp_path: Path) -> None:
    """Parquet has a VARIANT type of its own: the output keeps the values as variants (Spark reads them back as
    VARIANT, equal to what the query made), not as text."""
    out = tmp_path / "v.parquet"
    sql = "SELECT t, " + VARIANTS["v"] + " AS v FROM m ORDER BY t"
    assert cli("query", "--db", data, sql, "--format", "parquet", "--output", str(out)).returncode == 0
    back = spark.read.parquet(str(out))
    assert back.schema["v"].dataType.typeName() == "variant"
    assert {r[0] for r in back.selectExpr("to_json(v)").collect()} == {_to_json(spark, VARIANTS["v"])}
    assert "Variant" in str(pq.ParquetFile(next(out.glob("*.parquet"))).schema)
