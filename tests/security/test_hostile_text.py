"""User text is text on every surface of `iox-batch`: names, values, aliases, paths and the errors quoting them print
as written (never as rich markup), control characters print as escapes (no data reaches the terminal as a command),
and a command whose work is committed exits 0 even when its summary cannot be printed.

One database holds every hostile name. Commands that need no Spark run as the installed `iox-batch`; the two
queries run it in this process, on the shared SparkSession (CI time is scarce)."""

from __future__ import annotations

import csv
import io
import os
import pty
import re
import select
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from common_support import assert_one_paragraph_error, live_chunks, run_cli
from iox_planner.catalog.store import Catalog
from spark_support import cli

T0 = 1_704_067_200_000_000_000  # 2024-01-01T00:00:00Z
DAY = 86_400 * 10**9

LINK = "[link=file:///etc/passwd]click[/link]"
MARKUP = ("[/]", "[red]x[/]", LINK, ":warning:")
OSC8 = "\x1b]8;;file:///etc/passwd\x1b\\click\x1b]8;;\x1b\\"  # a raw terminal hyperlink
CLEAR = "\x1b[2J"  # clear the screen
C1_CSI = "\x9b2J"  # the same with the 8-bit CSI (string fields may hold it; names and tag values may not)
# How each must look, written out here rather than computed by the code under test.
SHOWN = {OSC8: "\\x1b]8;;file:///etc/passwd\\x1b\\click\\x1b]8;;\\x1b\\", CLEAR: "\\x1b[2J", C1_CSI: "\\x9b2J"}

WRITTEN = "x[/]"  # a measurement that can be written, shown and queried
QUERIED = "[red]m:x:"
QUERIED_SHOWN = "[red]m:x:"
FIELD = "[b]f[/b]"  # a field named as markup
# (tag t, string field `:warning:`) per row, v = 1..4; every row also has the tag LINK and the field FIELD.
ROWS = [("[/]", OSC8), ("[red]x[/]", CLEAR), (LINK, C1_CSI), (":warning:", "[red]x[/]")]


def _tag(text: str) -> str:
    return text.replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def _string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


LINES = "\n".join([f"{WRITTEN},t=a v=1 {T0}"] + [
    f"{QUERIED},t={_tag(tag)},{_tag(LINK)}=k :warning:={_string(value)},v={i},{_tag(FIELD)}={i} {T0 + i}"
    for i, (tag, value) in enumerate(ROWS, start=1)]) + "\n"


def assert_plain(text: str) -> None:
    """No control character of the data reached the output (off a terminal rich adds none of its own)."""
    assert "\x1b" not in text and "\x9b" not in text, text[:3000]


def assert_plain_on_terminal(text: str) -> None:
    """On a terminal: the only escape sequences are rich's own colours and styles (SGR, `ESC [ ... m`)."""
    assert re.findall(r"\x1b(?!\[[0-9;]*m)", text) == [], text[:3000]
    assert "\x9b" not in text, text[:3000]


def on_terminal(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, str]:
    """Run the installed `iox-batch` with standard output and error on a pseudo-terminal, as a person would."""
    exe = Path(sys.executable).parent / "iox-batch"
    master, slave = pty.openpty()
    proc = subprocess.Popen([str(exe), *args], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "1000", **(env or {})})
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    code = proc.wait(timeout=30)
    return code, b"".join(chunks).decode()


@dataclass
class Hostile:
    db: str
    steps: dict[str, subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def hostile(catalog: Catalog, tmp_path_factory: pytest.TempPathFactory) -> Hostile:
    """The database of hostile names, made through the CLI: write, load (two overlapping files with hostile ids,
    for compaction's plan), persist."""
    db = f"hostile_{uuid.uuid4().hex[:10]}"
    scenario = tmp_path_factory.mktemp("hostile") / "scenario.yaml"
    scenario.write_text(yaml.safe_dump({"chunks": [
        {"id": "[red]x[/]", "kind": "parquet", "lines": f"{WRITTEN},t=a v=1 {T0 + DAY}"},
        {"id": LINK, "kind": "parquet", "lines": f"{WRITTEN},t=a v=2 {T0 + DAY}"}]}))
    steps = {"write": run_cli("write", "--db", db, "-", stdin=LINES),
             "load": run_cli("load", str(scenario), "--db", db)}
    steps["persist"] = run_cli("persist", "--db", db)
    return Hostile(db, steps)


def test_write_load_and_persist_report_names_as_written(hostile: Hostile) -> None:
    for name, step in hostile.steps.items():
        assert step.returncode == 0, (name, step.stdout, step.stderr)
        assert_plain(step.stdout + step.stderr)
    assert f": {WRITTEN} 2024-01-01, 1 rows" in hostile.steps["write"].stdout
    assert f": {QUERIED_SHOWN} 2024-01-01, 4 rows" in hostile.steps["write"].stdout
    assert f"loaded parquet chunk [red]x[/]: {WRITTEN} 2024-01-02" in hostile.steps["load"].stdout
    assert f"loaded parquet chunk {LINK}: {WRITTEN} 2024-01-02" in hostile.steps["load"].stdout
    assert f"persisted {WRITTEN} 2024-01-01:" in hostile.steps["persist"].stdout
    assert f"persisted {QUERIED_SHOWN} 2024-01-01:" in hostile.steps["persist"].stdout


def test_show_on_a_terminal(hostile: Hostile) -> None:
    code, shown = on_terminal("show", "--db", hostile.db)
    assert code == 0, shown
    assert_plain_on_terminal(shown)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", shown)
    for text in (WRITTEN, QUERIED_SHOWN, LINK, ":warning: (string)", FIELD + " (float)", "[red]x[/]"):
        assert text in plain, (text, plain)
    code, shown = on_terminal("show", "--db", hostile.db, WRITTEN)
    assert code == 0 and WRITTEN in shown and LINK in shown, shown
    assert_plain_on_terminal(shown)


def test_explain_tree_and_yaml(hostile: Hostile) -> None:
    sql = (f"SELECT t AS `[red]x[/]`, `:warning:` AS `{CLEAR}`, `{LINK}` FROM `{QUERIED}` "
           f"WHERE `:warning:` <> '{OSC8.replace(chr(92), chr(92) * 2)}' AND t <> '{C1_CSI}' AND t <> '{CLEAR}'")
    tree = run_cli("explain", "--db", hostile.db, sql)
    assert tree.returncode == 0, tree.stderr
    assert_plain(tree.stdout + tree.stderr)
    assert f"{QUERIED_SHOWN} AS {QUERIED_SHOWN}" in tree.stdout and f"projection=[{LINK}, " in tree.stdout
    assert f"t <> '{SHOWN[C1_CSI]}'" in tree.stdout
    plan = run_cli("explain", "--db", hostile.db, sql, "--format", "yaml")
    assert plan.returncode == 0, plan.stderr
    assert_plain(plan.stdout + plan.stderr)
    assert "table: '[red]m:x:'" in plan.stdout and "`[red]x[/]`" in plan.stdout
    assert "\\x9B2J" in plan.stdout  # YAML's own escape of the C1 character in the query's text


def test_compact_plan_and_report(hostile: Hostile, catalog: Catalog) -> None:
    planned = run_cli("compact", "--db", hostile.db, "--dry-run")
    assert planned.returncode == 0, planned.stderr
    assert_plain(planned.stdout + planned.stderr)
    assert f"{WRITTEN} 2024-01-02: 2 file(s)" in planned.stdout
    assert "  in  [red]x[/] L0 order" in planned.stdout and f"  in  {LINK} L0 order" in planned.stdout
    # One day's files overlap nothing: promoted in place, no Spark job.
    done = run_cli("compact", "--db", hostile.db, "--partition", "2024-01-01")
    assert done.returncode == 0, done.stderr
    assert_plain(done.stdout + done.stderr)
    assert f"{WRITTEN} 2024-01-01: L1:" in done.stderr and f"{QUERIED_SHOWN} 2024-01-01: L1:" in done.stderr
    assert "2 file(s) (5 rows) promoted to L1 in place" in done.stdout
    levels = {(c["table_name"], c["partition_key"]): c["compaction_level"] for c in live_chunks(catalog, hostile.db)
              if c["kind"] == "parquet" and c["partition_key"] == "2024-01-01"}
    assert levels == {(WRITTEN, "2024-01-01"): 1, (QUERIED, "2024-01-01"): 1}


def test_errors_quote_user_text_as_written(hostile: Hostile) -> None:
    assert_one_paragraph_error(run_cli("show", "--db", hostile.db, "nope[/]"), "'nope[/]' does not exist")
    unknown = run_cli("explain", "--db", hostile.db, f"SELECT `[red]x[/]` FROM `{QUERIED}`")
    assert_one_paragraph_error(unknown, "unknown column '[red]x[/]'", f"{QUERIED_SHOWN}: {LINK}", FIELD)
    assert_plain(unknown.stderr)
    broken = run_cli("explain", "--db", hostile.db, f"SELECT '{CLEAR}{C1_CSI} FROM `{QUERIED}`")
    assert_one_paragraph_error(broken)
    assert_plain(broken.stderr)
    # A statement sqlglot cannot read as a query: its own warning quoted the text, escapes and all (probe S70).
    logged = run_cli("explain", "--db", hostile.db, f"SHOW {OSC8}{CLEAR} FROM `{QUERIED}`")
    assert_one_paragraph_error(logged)
    assert_plain(logged.stderr)
    stray = run_cli("show", "--db", hostile.db, "a", CLEAR)  # argparse's own message quotes it
    assert stray.returncode == 2 and SHOWN[CLEAR] in stray.stderr, stray.stderr
    assert_plain(stray.stderr)


def test_materialized_status_shows_a_failure_quoting_user_text(hostile: Hostile, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"IOX_MATERIALIZED_DIR": str(tmp_path / "defs"), "IOX_OUTPUT_ROOT": str(tmp_path / "out")}
    (tmp_path / "defs").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "defs" / "hostile.yaml").write_text(yaml.safe_dump({
        "name": "hostile", "db": hostile.db, "schedule": "@hourly", "start_date": "2024-01-01T00:00:00Z",
        "end_date": "2024-01-01T01:00:00Z", "format": "jsonl", "output": "{name}/{start:%H}.jsonl",
        "sql": f"SELECT `[red]x[/]` FROM `{QUERIED}`"}))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # A scheduled run of it fails while planning (no Spark), the way a materialize run records it.
    from spark_jobs.launch import InProcessLauncher
    from iox_planner.runs import refresh
    from iox_planner.runs.definitions import load_definitions
    from iox_planner.runs.settings import RunSettings
    from iox_planner.runs.staging import RunIdentity

    settings = RunSettings.from_env()
    definition = refresh.pick(load_definitions(settings.materialized_dir), "hostile")
    result = refresh.refresh_interval(definition, T0, T0 + 3600 * 10**9,
                                      RunIdentity("materialize_hostile", "scheduled__hostile"), settings,
                                      launcher=InProcessLauncher())
    assert not result.ok and "[red]x[/]" in str(result.error)
    status = run_cli("materialized", "status", env=env)
    assert status.returncode == 0, status.stderr
    assert_plain(status.stdout + status.stderr)
    assert "failed" in status.stdout and "last run failed: unknown column '[red]x[/]'" in status.stdout


class _Terminal(io.StringIO):
    """Standard output that says it is a terminal, so rich styles and sizes the table as it would on one."""

    def isatty(self) -> bool:
        return True


@pytest.mark.spark
def test_query_table_on_a_terminal(spark: Any, hostile: Hostile, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setenv("COLUMNS", "1000")
    monkeypatch.delenv("NO_COLOR", raising=False)
    sql = (f"SELECT t, `:warning:` AS `[red]x[/]`, v AS `{CLEAR}`, `{LINK}`, `{FIELD}` FROM `{QUERIED}` "
           "ORDER BY v")
    result = cli("query", "--db", hostile.db, sql, stdout=_Terminal())
    assert result.returncode == 0, result.stderr
    shown = result.stdout
    assert_plain_on_terminal(shown + result.stderr)
    assert "\x1b[1m" in shown  # it did render for a terminal: the headers are bold
    plain = re.sub(r"\x1b\[[0-9;]*m", "", shown)
    for text in (*MARKUP, SHOWN[OSC8], SHOWN[CLEAR], SHOWN[C1_CSI], "4 rows"):
        assert text in plain, (text, plain)
    # One line per row: the header, four rows, the box's three rules and the caption.
    assert len(plain.strip().splitlines()) == 9, plain


@pytest.mark.spark
def test_query_output_summary_names_the_path_as_written(spark: Any, hostile: Hostile, tmp_path: Path) -> None:
    (tmp_path / "[red]o[").mkdir()
    target = tmp_path / "[red]o[" / "].csv"  # the path reads `.../[red]o[/].csv`
    result = cli("query", "--db", hostile.db, f"SELECT t, `:warning:` FROM `{QUERIED}` ORDER BY v",
                 "--format", "csv", "--output", str(target))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"4 rows written to {target} (csv)\n"
    # The file keeps the data exactly: escaping is for the terminal only.
    with open(target, newline="", encoding="utf-8") as fh:
        assert [tuple(r) for r in csv.reader(fh)] == [("t", ":warning:"), *ROWS]


def test_a_committed_write_exits_0_when_its_summary_cannot_be_printed(catalog: Catalog, db: str) -> None:
    exe = Path(sys.executable).parent / "iox-batch"
    # A full disk: the data is committed, so exit 0 and a word on standard error.
    with open("/dev/full", "w") as full:
        done = subprocess.run([str(exe), "write", "--db", db, "-"], input=f"{WRITTEN},t=a v=1 {T0}\n",
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("warning: the work is done and committed") and "Traceback" not in done.stderr
    assert [c["table_name"] for c in live_chunks(catalog, db)] == [WRITTEN]
    # A reader that went away (`| head -c0`): exit 0, nothing to say.
    proc = subprocess.Popen([str(exe), "write", "--db", db, "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.close()
    _, errors = proc.communicate(f"{QUERIED},t=a v=1 {T0}\n", timeout=300)
    assert proc.returncode == 0, errors
    assert errors == ""
    assert [c["table_name"] for c in live_chunks(catalog, db)] == [WRITTEN, QUERIED]


# Bidi controls reorder what follows them on screen and zero-width characters hide in names: each as its escape.
# (character, escape) written out here, not taken from the code under test.
INVISIBLE = [("\u202e", "\\u202e"), ("\u202a", "\\u202a"), ("\u2066", "\\u2066"), ("\u2069", "\\u2069"),
             ("\u061c", "\\u061c"), ("\u200b", "\\u200b"), ("\u200f", "\\u200f"), ("\u2060", "\\u2060"),
             ("\ufeff", "\\ufeff")]


def assert_visible(text: str) -> None:
    assert not any(raw in text for raw, _ in INVISIBLE), ascii(text[:3000])


def test_a_table_shows_bidi_and_zero_width_characters_as_escapes() -> None:
    """`--format table`: a value `\u202e...` would display the rest of its row right to left, its cells reordered."""
    import pyarrow as pa

    from iox_planner.output.formats import print_table

    values = [f"a{raw}b" for raw, _ in INVISIBLE]
    table = pa.table({"city\u202e": values, "n": list(range(len(values)))})
    out = io.StringIO()
    print_table(table, set(), out)
    shown = out.getvalue()
    assert_visible(shown)
    assert "city\\u202e" in shown
    for _, escape in INVISIBLE:
        assert f"a{escape}b" in shown, (escape, shown)


def test_names_with_bidi_controls_print_as_escapes_in_reports_and_errors(catalog: Catalog, db: str) -> None:
    written = run_cli("write", "--db", db, "-", stdin=f"m\u202ex,t=\u2066a\u200bb v=1 {T0}\n")
    assert written.returncode == 0, written.stderr
    assert "m\\u202ex" in written.stdout
    assert_visible(written.stdout)
    shown = run_cli("show", "--db", db)
    assert "m\\u202ex" in shown.stdout
    assert_visible(shown.stdout)
    refused = run_cli("explain", "--db", db, "SELECT nope\u200b FROM `m\u202ex`")
    assert_one_paragraph_error(refused)
    assert_visible(refused.stderr)
    missing = run_cli("show", "--db", db, "nope\u2067x")
    assert_one_paragraph_error(missing, "nope\\u2067x")
    assert_visible(missing.stderr)
