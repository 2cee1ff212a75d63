"""Every name class the write path accepts, written with `iox-batch write` and read back with `iox-batch query`:
real Postgres, real Spark, the CLI as a user runs it.

Each class gives one table, one tag key and one field key of its kind (dots, dashes, spaces, quotes, backticks,
SQL keywords, unicode, case, path-like and SQL-looking characters, the longest name allowed...). One write holds
them all (opened by a byte order mark, which must not become part of the first table's name) and one query reads
them all: every table backquoted in FROM, every column backquoted (a backtick inside doubled) in SELECT, and a
WHERE on every tag. Kept to one write and one query because each CLI query starts a JVM.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common_support import run_cli

pytestmark = pytest.mark.spark

T0 = 1_704_067_200_000_000_000  # 2024-01-01T00:00:00Z

# (class, measurement, tag key, field key): the names as a query sees them.
NAMES: list[tuple[str, str, str, str]] = [
    ("dots", "sys.cpu", "host.name", "usage.idle"),
    ("dashes", "disk-io", "host-name", "read-bytes"),
    ("spaces", "net stats", "host name", "bytes in"),
    ("edge spaces", " lead", "trail ", " both "),
    ("blank keys", "blank", " ", "  "),
    ("unicode", "mesure_été", "hôte", "température°C"),
    ("other scripts", "測定", "ホスト", "مقدار\u200cها"),
    ("emoji", "📈 load", "🖥️", "👩\u200d💻"),
    ("single quotes", "it's", "o'host", "val'ue"),
    ("double quotes", 'say"hi"', 'h"ost', 'f"ld'),
    ("backticks", "tick`table", "ta`g", "`field`"),
    ("sql keywords", "select", "from", "where"),
    ("mixed case", "CpuLoad", "HostName", "UsageIdle"),
    ("time in another case", "Time", "TIME", "Time"),
    ("path-like", "C:\\data/cpu", "a/b", "x:y"),
    ("sql-looking", "x;--/*", "${env:HOME}", ":param"),
    ("one underscore", "_m", "_t", "a__b"),
    ("longest", "é" * 128, "ü" * 128, "ö" * 128),  # IOX_LP_MAX_NAME_BYTES: 256 bytes of UTF-8
]


def _measurement(name: str) -> str:
    """A measurement as line protocol writes it: ',' and ' ' escaped."""
    return name.replace(",", "\\,").replace(" ", "\\ ")


def _key(name: str) -> str:
    """A tag or field key as line protocol writes it: ',', '=' and ' ' escaped."""
    return name.replace(",", "\\,").replace("=", "\\=").replace(" ", "\\ ")


def _ident(name: str) -> str:
    """A Spark SQL backquoted identifier."""
    return "`" + name.replace("`", "``") + "`"


def _line(k: int, measurement: str, tag: str, field: str) -> str:
    return f"{_measurement(measurement)},{_key(tag)}=v{k} {_key(field)}={k}.5 {T0 + k}\n"


def _query(picked: list[int]) -> str:
    """Every tag and field of the classes `picked` (indexes into NAMES), their tables cross-joined, each tag
    filtered on its value (qualified by its table's name)."""
    columns = ", ".join(f"{_ident(NAMES[k][2])}, {_ident(NAMES[k][3])}" for k in picked)
    tables = ", ".join(_ident(NAMES[k][1]) for k in picked)
    where = " AND ".join(f"{_ident(NAMES[k][1])}.{_ident(NAMES[k][2])} = 'v{k}'" for k in picked)
    return f"SELECT {columns} FROM {tables} WHERE {where}"


def test_every_name_class_written_can_be_queried(db: str, tmp_path: Path) -> None:
    source = tmp_path / "names.lp"
    source.write_bytes(b"\xef\xbb\xbf" + "".join(_line(k, *n[1:]) for k, n in enumerate(NAMES)).encode())
    written = run_cli("write", "--db", db, str(source))
    assert written.returncode == 0, written.stderr
    assert f"{len(NAMES)} rows in {len(NAMES)} chunk(s)" in written.stdout

    result = run_cli("query", "--db", db, _query(list(range(len(NAMES)))), "--format", "jsonl")
    if result.returncode != 0:
        # Which classes fail on their own (planning only: no Spark, so this costs a second or two each).
        failing = []
        for k, names in enumerate(NAMES):
            alone = run_cli("explain", "--db", db, _query([k]))
            if alone.returncode != 0:
                failing.append(f"{names[0]}: {alone.stderr.strip()[:300]}")
        pytest.fail(f"the query failed: {result.stderr.strip()[:1000]}\nclasses the planner refuses alone: "
                    + ("; ".join(failing) or "none"))
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    expected: dict[str, object] = {}
    for k, (_, _, tag, field) in enumerate(NAMES):
        expected[tag] = f"v{k}"
        expected[field] = k + 0.5
    assert rows == [expected]
    assert list(rows[0]) == list(expected)  # the columns in the order selected, under their own names
