"""Hostile inputs that are not SQL: YAML bombs and oversized scenario files, order values that would break the
(order << 32 | write position) packing or another database's writes, and names with newlines or NULs. Each is
refused fast, in one paragraph, with nothing changed (canary, warehouse, catalog)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from common_support import assert_one_paragraph_error, live_chunks, run_cli
from iox_planner.catalog.store import Catalog
from spark_support import cli, load

T0 = 1_704_067_200_000_000_000
MAX_ORDER = 2**31 - 1  # written out here, not imported: the bound is the executor's int64 packing


def _scenario(tmp_path: Path, text: str, name: str = "s.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


BILLION_LAUGHS = "\n".join(
    ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)]
    + ["db: x", "chunks: [*i]"]
)


def test_billion_laughs_is_refused_at_once(db: str, tmp_path: Path, untouched: Any) -> None:
    started = time.monotonic()
    result = run_cli("load", _scenario(tmp_path, BILLION_LAUGHS), "--db", db)
    assert_one_paragraph_error(result, "aliases", "not allowed")
    assert time.monotonic() - started < 30  # the reported case took ~100 s to end in MemoryError
    assert len(result.stderr) < 400 and "lol, lol" not in result.stderr
    untouched.check()


@pytest.mark.parametrize("text, needle", [
    ("[" * 50_000 + "]" * 50_000, "nested deeper"),
    ("{a: " * 5_000 + "1" + "}" * 5_000, "nested deeper"),
    ("chunks:\n  - &one {id: A, kind: parquet, lines: 'm v=1 1'}\n  - *one\n", "aliases"),
    ("chunks: !!python/object/apply:os.system ['touch /tmp/pwned']\n", "not valid YAML"),
    ("db: x\nchunks: [" + "{id: " + "A" * 100_000 + "}]", "at most 64"),
    ("chunks:\n  - {id: A, kind: parquet, order: " + "9" * 100_000 + ", lines: 'm v=1 1'}\n", "not valid YAML"),
    ("db: x\nchunks:\n  - {id: A, kind: " + "z" * 100_000 + "}\n", "use parquet or ingester"),
])
def test_malformed_scenarios_are_refused_with_a_short_excerpt(db: str, tmp_path: Path, untouched: Any,
                                                              text: str, needle: str) -> None:
    result = cli("load", _scenario(tmp_path, text), "--db", db)
    assert_one_paragraph_error(result, needle)
    assert len(result.stderr) < 600, result.stderr[:700]
    untouched.check()


@pytest.mark.parametrize(("text", "words"), [
    ("db: a\nchunks: [{id: A, kind: ingester, lines: 'm v=1 1'}]\ndb: b\n", "line 3, column 1: key 'db' appears twice"),
    ("chunks:\n  - id: A\n    kind: ingester\n    lines: 'm v=1 1'\n    lines: 'm v=2 1'\n",
     "line 5, column 5: key 'lines' appears twice in one mapping (first at line 4)"),
])
def test_a_key_given_twice_in_a_scenario_is_refused(tmp_path: Path, text: str, words: str) -> None:
    """PyYAML keeps the last of two equal keys silently; YAML forbids them, and the file would mean what its
    reader does not see."""
    from iox_planner.errors import BadInputError
    from iox_planner.ingest.scenario import read_scenario

    with pytest.raises(BadInputError) as info:
        read_scenario(_scenario(tmp_path, text))
    assert words in str(info.value)


def test_size_and_count_limits(db: str, tmp_path: Path, untouched: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    big = _scenario(tmp_path, "db: x\n# " + "x" * 5000 + "\nchunks: []\n", "big.yaml")
    monkeypatch.setenv("IOX_SCENARIO_MAX_BYTES", "1000")
    assert_one_paragraph_error(cli("load", big, "--db", db), "larger than 1000 bytes", "IOX_SCENARIO_MAX_BYTES")
    # An endless "file" is not read at all: a scenario is a regular file (tests/test_userfiles.py).
    assert_one_paragraph_error(cli("load", "/dev/zero", "--db", db), "it is a character device")
    monkeypatch.delenv("IOX_SCENARIO_MAX_BYTES")
    chunks = "".join(f"  - {{id: C{n}, kind: ingester, lines: 'm v=1 {T0 + n}'}}\n" for n in range(4))
    many = _scenario(tmp_path, "chunks:\n" + chunks, "many.yaml")
    monkeypatch.setenv("IOX_SCENARIO_MAX_CHUNKS", "3")
    assert_one_paragraph_error(cli("load", many, "--db", db), "at most 3", "IOX_SCENARIO_MAX_CHUNKS")
    monkeypatch.delenv("IOX_SCENARIO_MAX_CHUNKS")
    monkeypatch.setenv("IOX_SCENARIO_MAX_LINES", "3")
    assert_one_paragraph_error(cli("load", many, "--db", db), "at most 3", "IOX_SCENARIO_MAX_LINES")
    untouched.check()


@pytest.mark.parametrize("order", [9223372036854775807, 2**63, 2**32, 2**31, 0, -1, "1e9", True])
def test_out_of_range_orders_are_refused(db: str, tmp_path: Path, untouched: Any, order: Any) -> None:
    text = f"chunks:\n  - {{id: A, kind: parquet, order: {str(order).lower()}, lines: 'm v=1 {T0}'}}\n"
    result = cli("load", _scenario(tmp_path, text), "--db", db)
    assert_one_paragraph_error(result, "field `order`", "2147483647")
    untouched.check()


def test_the_highest_order_stays_inside_its_database(catalog: Catalog, db: str, tmp_path: Path) -> None:
    other = db + "_other"
    load(catalog, other, [{"id": "O", "kind": "ingester", "lines": f"m v=1 {T0}"}])
    [before] = live_chunks(catalog, other)
    # 2^31 - 1 is the last order: it loads, and only this database's orders are used up.
    load(catalog, db, [{"id": "TOP", "kind": "ingester", "order": MAX_ORDER, "lines": f"m v=1 {T0}"}])
    assert [c["chunk_order"] for c in live_chunks(catalog, db)] == [MAX_ORDER]
    lp = tmp_path / "w.lp"
    lp.write_text(f"m v=2 {T0 + 1}\n")
    full = cli("write", "--db", db, str(lp))
    assert_one_paragraph_error(full, "every chunk order")
    assert len(live_chunks(catalog, db)) == 1
    # Every other database writes on, its orders counting from its own.
    assert cli("write", "--db", other, str(lp)).returncode == 0
    orders = [c["chunk_order"] for c in live_chunks(catalog, other)]
    assert orders == [before["chunk_order"], before["chunk_order"] + 1]
    # A scenario order of one database never moves the global sequence either (no database uses it now).
    with catalog.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT last_value < 2147483648 FROM iox_chunk_order_seq")).scalar_one()


def test_default_orders_may_not_pass_the_bound(catalog: Catalog, db: str, tmp_path: Path) -> None:
    load(catalog, db, [{"id": "TOP", "kind": "parquet", "order": MAX_ORDER, "lines": f"m v=1 {T0}"}])
    counts = len(live_chunks(catalog, db))
    result = cli("load", _scenario(tmp_path, f"chunks:\n  - {{id: B, kind: ingester, lines: 'm v=1 {T0 + 1}'}}\n"),
                 "--db", db)
    assert_one_paragraph_error(result, "2147483647")
    assert len(live_chunks(catalog, db)) == counts


@pytest.mark.spark
def test_orders_at_the_bound_deduplicate_exactly_with_the_shared_strategy(spark: Any, catalog: Catalog,
                                                                          db: str) -> None:
    from spark_support import run_jsonl

    # The newest chunk (order 2^31 - 1) wins over 2^31 - 2; inside it, the later write wins. Packed into one int64
    # as (order << 32) | position, these are the largest keys the executor can see.
    load(catalog, db, [
        {"id": "OLD", "kind": "parquet", "order": MAX_ORDER - 1, "lines": f"m,t=a v=1,w=7 {T0}"},
        {"id": "NEW", "kind": "ingester", "order": MAX_ORDER, "lines": f"m,t=a v=2 {T0}\nm,t=a v=3 {T0}"},
    ])
    for strategy in ("shared", None):
        rows = run_jsonl(spark, catalog, db, "SELECT t, v, w FROM m", strategy=strategy)
        assert rows == [{"t": "a", "v": 3.0, "w": 7.0}], strategy


@pytest.mark.parametrize("name", ["demo\n", "de\0mo", "demo\r", " demo", "demo\t", "x" * 65])
def test_database_names_with_control_characters_are_refused(name: str, untouched: Any, tmp_path: Path) -> None:
    lp = tmp_path / "w.lp"
    lp.write_text(f"m v=1 {T0}\n")
    for args in (("write", "--db", name, str(lp)), ("show", "--db", name), ("persist", "--db", name)):
        result = cli(*args)
        # A NUL is refused by the argument check before any name rule sees it; the rest by the name rule.
        needles = ("NUL character",) if "\0" in name else ("database name", "is not allowed")
        assert_one_paragraph_error(result, *needles)
        assert "\0" not in result.stderr
    untouched.check()


def test_table_and_param_names_with_control_characters_are_refused(catalog: Catalog, db: str,
                                                                   untouched: Any) -> None:
    assert_one_paragraph_error(cli("show", "--db", "any", "m\0x"), "NUL character")
    assert_one_paragraph_error(cli("show", "--db", "any", "m\x01x"), "control character")
    assert_one_paragraph_error(cli("persist", "--db", "any", "--table", "m\nx"), "control character")
    assert_one_paragraph_error(cli("explain", "--db", "any", "SELECT 1", "--param", "a\nb=1"), "control character")
    untouched.check()


def test_an_unknown_database_names_no_other(catalog: Catalog, db: str) -> None:
    secret = db + "_tenant_secret"
    load(catalog, secret, [{"id": "A", "kind": "ingester", "lines": f"m v=1 {T0}"}])
    load(catalog, "zz_" + db, [{"id": "A", "kind": "ingester", "lines": f"m v=1 {T0}"}])
    result = cli("show", "--db", "no_such_database")
    assert_one_paragraph_error(result, "does not exist")
    assert secret not in result.stderr and "zz_" not in result.stderr
    # A near miss may suggest the one close name, nothing more.
    typo = cli("show", "--db", secret[:-1])
    assert_one_paragraph_error(typo, "did you mean")
    assert f"did you mean '{secret}'?" in typo.stderr and "zz_" not in typo.stderr


def test_writes_into_one_database_commit_in_the_order_of_their_orders(catalog: Catalog, db: str,
                                                                      warehouse: Path) -> None:
    """Issue 11: an order taken early but committed late let a persist in between see the newer write alone. Now a
    write holds its database's order lock until it commits; a write into another database does not wait."""
    import threading

    from iox_planner import storage
    from iox_planner.ingest import write as ingest
    from iox_planner.ingest.lineprotocol import parse

    other = db + "_b"
    load(catalog, db, [{"id": "A", "kind": "ingester", "lines": f"m v=0 {T0}"}])
    load(catalog, other, [{"id": "A", "kind": "ingester", "lines": f"m v=0 {T0}"}])
    done: dict[str, float] = {}

    def write(name: str, key: str) -> None:
        ingest.write_line_protocol(catalog, name, f"m v=2 {T0 + 2}")
        done[key] = time.monotonic()

    staged = storage.Staged(storage.warehouse_of(warehouse))
    with catalog.engine.begin() as conn:
        first = ingest.write_points(catalog, db, parse(f"m v=1 {T0 + 1}", default_time=T0).points, conn=conn, staged=staged,
                                    warehouse=warehouse)
        same, elsewhere = (threading.Thread(target=write, args=(db, "same")),
                           threading.Thread(target=write, args=(other, "other")))
        same.start(), elsewhere.start()
        elsewhere.join(30)
        time.sleep(1.0)
        assert "other" in done and "same" not in done  # the same database's write waits for this one
        committed_at = time.monotonic()
    same.join(30)
    assert done["same"] >= committed_at
    orders = [c["chunk_order"] for c in live_chunks(catalog, db)]
    assert orders == sorted(orders) and first.chunks[0].order == orders[1] and len(orders) == 3
