"""The `iox-batch` command as a user runs it: exit codes, one-paragraph errors, nothing half-written."""

from __future__ import annotations

from pathlib import Path

import pytest

from common_support import assert_one_paragraph_error, run_cli
from common_support import catalog_counts, live_chunks, warehouse_files
from iox_planner.catalog.store import Catalog

T0 = 1_704_067_200_000_000_000


def test_write_from_stdin_then_show(catalog: Catalog, db: str) -> None:
    result = run_cli("write", "--db", db, "-", stdin=f"cpu,host=a usage=1.5 {T0}\ncpu,host=b usage=2 {T0 + 1}\n")
    assert result.returncode == 0, result.stderr
    assert "2 rows in 1 chunk(s)" in result.stdout
    shown = run_cli("show", "--db", db)
    assert shown.returncode == 0, shown.stderr
    assert "cpu" in shown.stdout and "2024-01-01" in shown.stdout and "ingester" in shown.stdout
    assert "2024-01-01T00:00:00Z" in shown.stdout and "2024-01-01T00:00:00.000000001Z" in shown.stdout


def test_write_precision_seconds(catalog: Catalog, db: str) -> None:
    result = run_cli("write", "--db", db, "--precision", "s", "-", stdin="m,t=a v=1 1704067200\n")
    assert result.returncode == 0, result.stderr
    assert "2024-01-01" in run_cli("show", "--db", db).stdout


def test_bad_line_protocol_is_rejected_whole(catalog: Catalog, db: str, warehouse: Path) -> None:
    before = warehouse_files(warehouse), catalog_counts(catalog)
    result = run_cli("write", "--db", db, "-", stdin=f"m,t=a v=1 {T0}\nm,t=a v= {T0}\nm,time=x v=1\n")
    assert_one_paragraph_error(result, "line 2", "line 3", "time")
    assert (warehouse_files(warehouse), catalog_counts(catalog)) == before


def test_accept_partial_reports_bad_lines(catalog: Catalog, db: str) -> None:
    result = run_cli("write", "--db", db, "--accept-partial", "-", stdin=f"m,t=a v=1 {T0}\nbad\n")
    assert result.returncode == 0, result.stderr
    assert "1 rows in 1 chunk(s)" in result.stdout and "line 2" in result.stderr


@pytest.mark.parametrize("command", [["show"], ["persist"]])
def test_unknown_database_is_an_error(catalog: Catalog, command: list[str]) -> None:
    result = run_cli(*command, "--db", "no_such_db")
    assert_one_paragraph_error(result, "'no_such_db' does not exist")


def test_bad_database_name(catalog: Catalog) -> None:
    result = run_cli("write", "--db", "bad name!", "-", stdin=f"m v=1 {T0}\n")
    assert_one_paragraph_error(result, "database name")


def test_unreadable_file(catalog: Catalog, db: str, tmp_path: Path) -> None:
    assert_one_paragraph_error(run_cli("write", "--db", db, str(tmp_path / "missing.lp")), "no such file")
    assert_one_paragraph_error(run_cli("write", "--db", db, str(tmp_path)), "folder")
    binary = tmp_path / "binary.lp"
    binary.write_bytes(b"\xff\xfe\x00")
    assert_one_paragraph_error(run_cli("write", "--db", db, str(binary)), "not UTF-8")


@pytest.mark.parametrize(
    "content, needle",
    [
        ("db: x\nchunks: [", "not valid YAML"),
        ("chunks: []", "non-empty list"),
        ("chunks:\n  - id: A\n    kind: csv\n    lines: 'm v=1 1'", "chunk A: field `kind`"),
        ("chunks:\n  - id: A\n    kind: parquet\n    lines: 'm v=1 1'\n    table: m", "both `lines` and metadata"),
        ("chunks:\n  - id: A\n    kind: parquet\n    lines: 'm v= 1'", "chunk A: field `lines`: line 1"),
        ("chunks:\n  - id: A\n    kind: parquet\n    order: -1\n    lines: 'm v=1 1'", "chunk A: field `order`"),
        ("chunks:\n  - id: M\n    kind: parquet\n    table: m\n    partition: '2024-01-02'\n"
         "    time: [1704067200000000000, 1704067200000000001]\n    columns: {v: float, time: time}",
         "outside partition 2024-01-02"),
        ("chunks:\n  - id: M\n    kind: parquet\n    table: m\n    partition: '2024-01-01'\n"
         "    columns: {v: float, time: time}", "metadata only"),
    ],
)
def test_invalid_scenario_files(catalog: Catalog, db: str, tmp_path: Path, warehouse: Path,
                                content: str, needle: str) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(content)
    before = warehouse_files(warehouse), catalog_counts(catalog)
    assert_one_paragraph_error(run_cli("load", str(path), "--db", db), needle)
    assert (warehouse_files(warehouse), catalog_counts(catalog)) == before


def test_load_db_flag_wins_over_the_file(catalog: Catalog, db: str, tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(f"db: from_file_{db}\nchunks:\n  - id: A\n    kind: ingester\n    lines: 'm,t=a v=1 {T0}'\n")
    result = run_cli("load", str(path), "--db", db)
    assert result.returncode == 0, result.stderr
    assert "A" in run_cli("show", "--db", db).stdout
    assert run_cli("show", "--db", f"from_file_{db}").returncode != 0


def test_persist_then_show(catalog: Catalog, db: str) -> None:
    run_cli("write", "--db", db, "-", stdin=f"m,t=a v=1 {T0}\nm,t=a v=2 {T0}\n")
    result = run_cli("persist", "--db", db)
    assert result.returncode == 0, result.stderr
    assert "2 rows -> file P" in result.stdout and "with 1 rows" in result.stdout
    shown = run_cli("show", "--db", db).stdout
    assert "parquet" in shown and "ingester" not in shown.split("chunks")[-1]
    assert " L0 " in shown  # persist writes level 0 (migration 0005)


def test_drop_needs_confirmation(catalog: Catalog, db: str) -> None:
    run_cli("write", "--db", db, "-", stdin=f"m,t=a v=1 {T0}\n")
    assert_one_paragraph_error(run_cli("drop", "--db", db), "--yes")
    assert run_cli("drop", "--db", db, "--yes").returncode == 0
    assert run_cli("show", "--db", db).returncode != 0


@pytest.mark.parametrize(("flag", "value", "words"), [
    ("--hosts", "\u0661\u0662", "argument --hosts: '\u0661\u0662' is not a whole number (digits 0-9)"),
    ("--interval", "1e3", "argument --interval: '1e3' is not a whole number"),
    ("--rewrite-fraction", "nan", "argument --rewrite-fraction: 'nan' is not a decimal number from 0 to 1"),
    ("--rewrite-fraction", "\u0661", "is not a decimal number from 0 to 1"),
])
def test_generate_reads_numbers_in_ascii_digits_only(catalog: Catalog, db: str, flag: str, value: str,
                                                     words: str) -> None:
    """argparse's int and float take any script's digits (and float takes nan): every number is read by one rule."""
    result = run_cli("generate", "--db", db, "--hours", "1", flag, value)
    assert result.returncode == 2 and words in result.stderr, result.stderr
    assert not live_chunks(catalog, db)


@pytest.mark.parametrize("setting, needle", [
    ({"IOX_CATALOG_URL": "bogus://"}, "takes a Postgres URL"),
    ({"IOX_CATALOG_URL": "sqlite:///catalog.db"}, "takes a Postgres URL"),
    ({"IOX_CATALOG_URL": "postgresql+nodriver://a@b/c"}, "not one SQLAlchemy can use"),
    ({"IOX_HOME": "/nonexistent-iox-home"}, "is not an iox-batch checkout"),
])
def test_a_catalog_url_or_home_that_cannot_work_is_one_paragraph(tmp_path: Path, setting: dict[str, str],
                                                                 needle: str) -> None:
    """Probes E26 and E28 ended as internal errors: an unknown SQLAlchemy dialect, and a home with no migrations
    (the catalog looked up to date, then every table was missing)."""
    result = run_cli("show", "--db", "x", env=setting)
    assert_one_paragraph_error(result, needle)
    assert result.returncode == 2, result.stderr
    assert not Path("/nonexistent-iox-home").exists()


@pytest.mark.parametrize("args, needle", [
    (["--retention", ""], "--retention '' is empty"),  # was a database kept forever
    (["--retention", "-1d"], "--retention '-1d' is not a duration"),  # was argparse's usage line
    (["--retention", "-30d"], "--retention '-30d' is not a duration"),
    (["--retention", " 30d"], "--retention ' 30d' is not a duration"),
    (["--retention", "30d "], "--retention '30d ' is not a duration"),
    (["--retention", "NONE"], "--retention 'NONE' is not a duration"),
    (["--retention", "none "], "--retention 'none ' is not a duration"),
])
def test_a_retention_is_taken_exactly(catalog: Catalog, args: list[str], needle: str) -> None:
    import uuid

    name = f"ret_{uuid.uuid4().hex[:8]}"
    result = run_cli("database", "create", name, *args)
    assert_one_paragraph_error(result, needle)
    assert result.returncode == 2 and "usage:" not in result.stderr
    with catalog.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM iox_database WHERE name = %s", (name,)).scalar() == 0
    assert_one_paragraph_error(run_cli("database", "update", "demo", *args), needle)


@pytest.mark.parametrize("args, needle", [
    (["query", "--db", "x", "SELECT 1", "--time-start", "-1h"], "--time-start '-1h' is not an RFC 3339 time"),
    (["query", "--db", "x", "SELECT 1", "--time-end", "-2024-01-01"], "--time-end '-2024-01-01' is not an RFC"),
    (["query", "--db", "x", "SELECT 1", "--changes-since", "-1"], "'-1' is not a watermark"),
    (["query", "--db", "x", "SELECT 1", "--timeout", "-5"], "--timeout '-5' is not allowed"),
    (["materialized", "run", "x", "--from", "-1d", "--to", "2024-01-01"], "--from '-1d' is not an RFC 3339 time"),
    (["generate", "--db", "x", "--start", "-1d"], "--start '-1d' is not an RFC 3339 time"),
])
def test_a_time_or_duration_starting_with_a_dash_gets_its_own_paragraph(catalog: Catalog, args: list[str],
                                                                       needle: str) -> None:
    result = run_cli(*args)
    assert_one_paragraph_error(result, needle)
    assert "usage:" not in result.stderr
