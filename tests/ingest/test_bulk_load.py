"""Bulk load (`iox-batch write --spark`) on real Spark and real Postgres, against plain writes and the test's own
tally: the same query answers (several files, ranges cut mid-file, duplicates across ranges and files, NULL-field
overwrites, two tables, a midnight); a bad line or a type conflict in any range rejects the whole load with the
plain write's own error and registers nothing; a load killed (SIGKILL of its process group) leaves the catalog as
it was and persist's sweep removes what it staged. `IOX_BULK_KILL_POINTS=all` kills at every point (CI: the one
after the files moved into place, before the commit)."""

from __future__ import annotations

import datetime as dt
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from common_support import catalog_counts
from iox_planner import storage
from iox_planner.catalog.store import Catalog
from iox_planner.errors import BadInputError
from iox_planner.ingest import bulk
from iox_planner.maintenance.sweeps import sweep_unreferenced
from spark_support import cli, run_jsonl

pytestmark = pytest.mark.spark

T0 = 1_704_153_590_000_000_000  # 2024-01-01T23:59:50Z: ten seconds before midnight
S = 1_000_000_000
TIMES = [T0 + k * S for k in range(20)] + [T0 + 10 * S + 1]  # across midnight, and a 1 ns neighbour
KILL_POINTS = (["bulk.after_tasks", "bulk.before_commit"] if os.environ.get("IOX_BULK_KILL_POINTS") == "all"
               else ["bulk.before_commit"])


def rfc3339(ns: int) -> str:
    """The output rule for a computed timestamp (a UNION's `time` is one): UTC, `Z`, microseconds at most, as many
    fractional digits as needed (an independent formatter). The 1 ns neighbours stay two rows."""
    seconds, frac = divmod(ns - ns % 1000, S)
    text = dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return text + (f".{frac:09d}".rstrip("0") if frac else "") + "Z"


class Tally:
    """The expected table contents: per (table, tags, time), each field's last value in line order."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, tuple[tuple[str, str], ...], int], dict[str, Any]] = {}

    def add(self, table: str, tags: dict[str, str], fields: dict[str, Any], t: int) -> None:
        self.rows.setdefault((table, tuple(sorted(tags.items())), t), {}).update(fields)

    def expected(self, table: str, tag_names: list[str], field_names: list[str]) -> list[str]:
        out = []
        for (tb, tags, t), fields in self.rows.items():
            if tb == table:
                row = {**{n: dict(tags).get(n) for n in tag_names}, **{f: fields.get(f) for f in field_names},
                       "time": rfc3339(t)}
                out.append(repr(sorted(row.items())))
        return sorted(out)


def make_lines(rng: random.Random, count: int, tally: Tally) -> list[str]:
    """cpu (tags host and sometimes region; float and string fields) and mem (integer and boolean fields), over a
    small key space so that most lines rewrite an earlier key, each with a random subset of its fields."""
    lines = []
    for _ in range(count):
        host = f"h{rng.randrange(4)}"
        t = rng.choice(TIMES)
        if rng.random() < 0.6:
            tags = {"host": host} | ({"region": rng.choice(["eu", "us"])} if rng.random() < 0.7 else {})
            values = {"usage": rng.randrange(100) / 4, "idle": rng.randrange(100) / 2,
                      "note": f"n{rng.randrange(50)}"}
            table = "cpu"
        else:
            tags = {"host": host}
            values = {"used": rng.randrange(-50, 50), "ok": rng.random() < 0.5}
            table = "mem"
        fields = {k: v for k, v in values.items() if rng.random() < 0.5} or dict([next(iter(values.items()))])
        body = ",".join(f"{k}={_lp(v)}" for k, v in fields.items())
        head = ",".join([table, *(f"{k}={v}" for k, v in tags.items())])
        lines.append(f"{head} {body} {t}")
        tally.add(table, tags, fields, t)
    return lines


def _lp(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}i"
    if isinstance(value, float):
        return repr(value)
    return f'"{value}"'


# Both tables in one query (one Spark job): each row tagged with its table, the other table's columns NULL.
BOTH = ("SELECT 'cpu' AS tb, host, region, idle, note, usage, CAST(NULL AS BOOLEAN) AS ok, "
        "CAST(NULL AS BIGINT) AS used, time FROM cpu UNION ALL SELECT 'mem', host, NULL, NULL, NULL, NULL, ok, used, "
        "time FROM mem")


def _rows(spark: Any, catalog: Catalog, db: str) -> dict[str, list[str]]:
    """Each table's rows, as `Tally.expected` gives them."""
    out: dict[str, list[str]] = {"cpu": [], "mem": []}
    names = {"cpu": ["host", "region", "idle", "note", "usage", "time"], "mem": ["host", "ok", "used", "time"]}
    for r in run_jsonl(spark, catalog, db, BOTH):
        out[r["tb"]].append(repr(sorted((k, r[k]) for k in names[r["tb"]])))
    return {k: sorted(v) for k, v in out.items()}


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IOX_BULK_RANGE_BYTES", "4096")  # the least allowed: every file is cut several times


def test_bulk_load_answers_as_plain_writes_and_the_tally(spark: Any, catalog: Catalog, db: str, tmp_path: Path,
                                                       small_ranges: None) -> None:
    rng = random.Random(12)
    tally = Tally()
    folder = tmp_path / "in"
    folder.mkdir()
    # Load order is by name, not by creation: b.lp is written last on purpose... and read second.
    texts = {name: make_lines(rng, 200, tally) for name in ("a.lp", "b.lp", "c.lp")}
    texts["b.lp"][100:100] = ["# a comment", ""]
    for name, lines in reversed(texts.items()):
        end = "" if name == "c.lp" else "\n"  # the last file ends without a LF
        (folder / name).write_text("\n".join(lines) + end)
    (folder / ".hidden.lp").write_text("not line protocol\n")  # skipped: it would fail the load
    (folder / "sub").mkdir()
    (folder / "sub" / "x.lp").write_text("not line protocol either\n")

    done = cli("write", "--spark", "--db", db, str(folder))
    assert done.returncode == 0, done.stderr
    assert "range(s)" in done.stderr and "one transaction" in done.stderr, done.stderr
    plain_db = f"{db}_plain"
    for name in ("a.lp", "b.lp", "c.lp"):
        assert cli("write", "--db", plain_db, str(folder / name)).returncode == 0

    with catalog.engine.connect() as conn:
        db_id = catalog.database_id(conn, db)
        chunks = conn.execute(sa.text(
            "SELECT count(*) FROM iox_ingester_chunk c JOIN iox_table t ON t.id = c.table_id "
            "WHERE t.database_id = :d").bindparams(d=db_id)).scalar_one()
    assert chunks > 3 * 2 * 2 * 2, "ranges were not cut: fewer chunks than (files x tables x days x 2)"
    expected = {"cpu": tally.expected("cpu", ["host", "region"], ["idle", "note", "usage"]),
                "mem": tally.expected("mem", ["host"], ["ok", "used"])}
    assert len(expected["cpu"]) > 50 and len(expected["mem"]) > 50
    assert _rows(spark, catalog, db) == expected
    assert _rows(spark, catalog, plain_db) == expected
    assert not (Path(os.environ["IOX_WAREHOUSE"]) / storage.BULK_STAGING).exists(), "the staging folder stayed"


def _plain_error(*files: Path, db: str) -> str:
    """What plain writes of `files`, one after another, say at the first one that fails."""
    for path in files:
        done = cli("write", "--db", db, str(path))
        if done.returncode:
            return done.stderr.strip()
    raise AssertionError("the plain writes all succeeded")


def _assert_rejected_like_plain(catalog: Catalog, folder: Path, files: list[Path], db: str) -> None:
    root = Path(os.environ["IOX_WAREHOUSE"])
    before = (_files(root), catalog_counts(catalog))
    done = cli("write", "--spark", "--db", db, str(folder))
    assert done.returncode != 0
    got = done.stderr.strip().splitlines()[-1]
    assert (_files(root), catalog_counts(catalog)) == before, "a rejected load changed the catalog or warehouse"
    plain_db = f"{db}_plain"
    expected = _plain_error(*files, db=plain_db)
    assert got == expected.replace(repr(plain_db), repr(db)), (got, expected)


def test_a_bad_line_in_any_range_rejects_the_load_with_the_plain_error(spark: Any, catalog: Catalog, db: str,
                                                                     tmp_path: Path, small_ranges: None) -> None:
    rng = random.Random(7)
    folder = tmp_path / "in"
    folder.mkdir()
    a, b = folder / "a.lp", folder / "b.lp"
    a.write_text("\n".join(make_lines(rng, 300, Tally())) + "\n")
    lines = make_lines(rng, 400, Tally())
    lines[250] = "cpu,host=h1 usage=abc 1704153590000000000"  # deep in b.lp: several ranges in
    lines[390] = "cpu,host=h1 usage=1.5 nope"
    b.write_text("\n".join(lines) + "\n")
    _assert_rejected_like_plain(catalog, folder, [a, b], db)


def test_a_type_conflict_between_ranges_is_rejected_as_the_plain_write_rejects_it(
        spark: Any, catalog: Catalog, db: str, tmp_path: Path, small_ranges: None) -> None:
    rng = random.Random(8)
    # Within one file: the field is float in an early range and string in a late one.
    folder = tmp_path / "one"
    folder.mkdir()
    lines = make_lines(rng, 400, Tally())
    lines[350] = 'cpu,host=h2 usage="high" 1704153590000000000'
    (folder / "a.lp").write_text("\n".join(lines) + "\n")
    _assert_rejected_like_plain(catalog, folder, [folder / "a.lp"], db)
    # Across files: mem.used is an integer in a.lp and a float in every line of b.lp (so b.lp's own parse is clean).
    folder = tmp_path / "two"
    folder.mkdir()
    (folder / "a.lp").write_text("\n".join(make_lines(rng, 200, Tally())) + "\n")
    (folder / "b.lp").write_text("".join(f"mem,host=h{i % 3} used={i}.5 {T0 + i}\n" for i in range(200)))
    _assert_rejected_like_plain(catalog, folder, [folder / "a.lp", folder / "b.lp"], f"{db}_x")


def test_a_triggered_load_reads_only_inside_its_root_whatever_is_swapped_in(tmp_path: Path) -> None:
    """The DAG checks the folder in one task and the load opens it in a later one: the load checks again, on what
    it actually opens, and every later open must find the very file it listed."""
    root = tmp_path / "root"
    (root / "drop" / "a").mkdir(parents=True)
    (root / "drop" / "a" / "x.lp").write_text("m f=1 1\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.lp").write_text("secret f=1 1\n")
    assert [Path(p.path).name for p in bulk.input_files(str(root / "drop" / "a"), root)] == ["x.lp"]
    # The folder, once checked, swapped for a link out of the root: refused when the load opens it.
    (root / "drop" / "a").rename(root / "drop" / "was")
    (root / "drop" / "a").symlink_to(outside)
    with pytest.raises(BadInputError, match="not inside"):
        bulk.input_files(str(root / "drop" / "a"), root)
    with pytest.raises(BadInputError, match="not inside"):
        bulk.input_files(str(outside / "secret.lp"), root)
    # Listed, then swapped under the load (a folder on its path becomes a link, or the file is rewritten): every
    # later open (cuts, tasks, the plain fallback) refuses it.
    (root / "drop" / "a").unlink()
    (root / "drop" / "was").rename(root / "drop" / "a")
    [listed] = bulk.input_files(str(root / "drop" / "a"), root)
    (root / "drop" / "a").rename(root / "drop" / "was")
    (root / "drop" / "a").symlink_to(outside)
    (outside / "x.lp").write_text("secret f=1 1\n")
    with pytest.raises(BadInputError, match="changed while the bulk load ran"):
        bulk.plan_ranges([listed], 4096)
    (root / "drop" / "a").unlink()
    (root / "drop" / "was").rename(root / "drop" / "a")
    [ranged] = bulk.plan_ranges([listed], 4096)
    (root / "drop" / "a" / "x.lp").write_text("m f=22 2\n")  # rewritten in place: same inode, new size
    with pytest.raises(BadInputError, match="changed while the bulk load ran"):
        bulk.open_input(ranged.path, ranged.pin)


def test_the_input_folder_is_read_deliberately(tmp_path: Path) -> None:
    (tmp_path / "b.lp").write_text("m f=1 1\n")
    (tmp_path / "a.lp").write_text("m f=1 1\n")
    (tmp_path / ".swp").write_text("x")
    (tmp_path / "sub").mkdir()
    assert [Path(p.path).name for p in bulk.input_files(str(tmp_path))] == ["a.lp", "b.lp"]
    (tmp_path / "link.lp").symlink_to(tmp_path / "a.lp")
    with pytest.raises(Exception, match="symlink"):
        bulk.input_files(str(tmp_path))
    (tmp_path / "link.lp").unlink()
    os.mkfifo(tmp_path / "pipe.lp")
    with pytest.raises(Exception, match="not a regular file"):
        bulk.input_files(str(tmp_path))
    with pytest.raises(Exception, match="standard input"):
        bulk.input_files("-")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(Exception, match="holds no files"):
        bulk.input_files(str(empty))


def test_ranges_end_at_line_boundaries(tmp_path: Path) -> None:
    path = tmp_path / "a.lp"
    data = "".join(f"m,t=x{'y' * (i % 37)} f={i} {i}\n" for i in range(3000)).encode()
    path.write_bytes(data)
    ranges = bulk.plan_ranges(bulk.input_files(str(path)), 4096)
    assert len(ranges) > 5
    assert ranges[0].start == 0 and ranges[-1].end == len(data)
    for left, right in zip(ranges, ranges[1:]):
        assert left.end == right.start and data[left.end - 1:left.end] == b"\n"


@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_killed_load_leaves_the_catalog_and_is_swept(catalog: Catalog, db: str, tmp_path: Path,
                                                      point: str) -> None:
    root = Path(os.environ["IOX_WAREHOUSE"])
    folder = tmp_path / "in"
    folder.mkdir()
    rng = random.Random(3)
    for name in ("a.lp", "b.lp"):
        (folder / name).write_text("\n".join(make_lines(rng, 150, Tally())) + "\n")
    before = (_files(root), catalog_counts(catalog))
    exe = Path(sys.executable).parent / "iox-batch"
    env = {**os.environ, "IOX_FAULT_KILL_AT": point, "IOX_BULK_RANGE_BYTES": "4096", "IOX_SPARK_MASTER": "local[2]"}
    proc = subprocess.run([str(exe), "write", "--spark", "--db", db, str(folder)], env=env, capture_output=True,
                          text=True, timeout=300, start_new_session=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert catalog_counts(catalog) == before[1], "a killed load registered something"
    left = _files(root) - before[0]
    assert any(p.startswith(f"{storage.BULK_STAGING}/") for p in left), f"nothing was staged before {point}: {left}"
    if point == "bulk.before_commit":
        assert any(not p.startswith(f"{storage.BULK_STAGING}/") for p in left), "no file had moved into place"
    with catalog.engine.connect() as conn:
        some_db = conn.execute(sa.text("SELECT min(id) FROM iox_database")).scalar()
    assert not any(storage.BULK_STAGING in p for p in sweep_unreferenced(catalog, root, some_db or 1, 3600)), \
        "swept within the grace period"
    swept = sweep_unreferenced(catalog, root, some_db or 1, 0)
    assert any(p.startswith(f"{storage.BULK_STAGING}/") for p in swept)
    assert _files(root) == before[0], "the sweep left the killed load's files"


def test_a_cut_inside_a_string_spanning_lines_gives_the_plain_result(spark: Any, catalog: Catalog, db: str,
                                                                     tmp_path: Path, small_ranges: None) -> None:
    # A string value of 12 kB with a LF every 100 bytes: every cut near it falls inside the string.
    text = "\n".join(f"{i:04d}" + "x" * 95 for i in range(120))
    lines = [f"log,host=h{i % 3} n={i}i {T0 + i * S}" for i in range(200)]
    lines[100] = f'log,host=h9 msg="{text}" {T0}'
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.lp").write_text("\n".join(lines) + "\n")
    done = cli("write", "--spark", "--db", db, str(folder))
    assert done.returncode == 0, done.stderr
    assert "redoing the load as plain writes" in done.stderr
    got = {(r["host"], r.get("n"), r.get("msg")) for r in run_jsonl(spark, catalog, db, "SELECT * FROM log")}
    assert ("h9", None, text) in got and len(got) == 200


def test_a_bad_line_through_spark_submit_exits_as_in_process(spark: Any, catalog: Catalog, db: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`IOX_RUNNER=spark-submit` (a real spark-submit of run_bulk_load.py): a bad line is a bad input, exit 2 with
    the plain write's own paragraph, exactly as in this process (it came back as exit 1 before: a job exited 1 for
    any error)."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.lp").write_text("cpu,host=h1 usage=1.5 1704153590000000000\n"
                                 "cpu,host=h1 usage=abc 1704153590000000001\n")
    in_process = cli("write", "--spark", "--db", db, str(folder))
    monkeypatch.setenv("IOX_RUNNER", "spark-submit")
    monkeypatch.setenv("IOX_SPARK_MASTER", "local[1]")
    submitted = cli("write", "--spark", "--db", db, str(folder))
    assert in_process.returncode == submitted.returncode == BadInputError.exit_code, submitted.stderr[-2000:]
    last = [r.stderr.strip().splitlines()[-1] for r in (in_process, submitted)]
    assert last[0] == last[1] and last[0].startswith("error: nothing was written") and "1 bad line" in last[0], last
    assert "catalog" not in last[1]


def test_a_workers_bad_input_stays_a_bad_input(spark: Any) -> None:
    """`run_tasks`: a Python worker's error of the tree keeps its class (and exit status); anything else is the
    catalog error it always was. (Lambdas: a worker cannot import this test module, so they travel by value.)"""
    from iox_planner.errors import CatalogError, check_text
    from spark_jobs.errors import run_tasks

    with pytest.raises(BadInputError, match=r"^loading failed: the SQL contains a NUL character") as bad:
        run_tasks(spark, [1], lambda _: check_text("a\0b"), "test", "loading failed")
    assert bad.value.exit_code == BadInputError.exit_code
    with pytest.raises(CatalogError, match=r"^loading failed: FileNotFoundError: ") as raised:
        run_tasks(spark, [1], lambda _: open("/nonexistent/iox/x"), "test", "loading failed")
    assert type(raised.value) is CatalogError
