"""Every output-path trick against `iox-batch query --output`: each is refused with one paragraph, and nothing
outside the intended output changes (canary folder, warehouse, catalog). A genuine earlier output IS replaced;
one changed by someone else after publication is not."""

from __future__ import annotations

import os
import site
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import sqlalchemy as sa

from common_support import assert_one_paragraph_error, run_cli, tree_digest
from iox_planner.catalog.store import Catalog
from spark_support import cli, load

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_704_067_200_000_000_000
SQL = "SELECT t, v, time FROM m ORDER BY t"


@pytest.fixture
def data(catalog: Catalog, db: str) -> str:
    load(catalog, db, [{"id": "F", "kind": "parquet", "lines": f"m,t=a v=1 {T0}\nm,t=b v=2 {T0 + 1}"}])
    return db


def publications(catalog: Catalog) -> int:
    with catalog.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM iox_output_publication")).scalar_one())


# Each case: (format, a function of (canary, tmp_path, warehouse) that prepares the trick and returns the path,
# what the error must say).
Case = Callable[[Path, Path, Path], str]


def _sibling_marker(canary: Path, tmp: Path, wh: Path) -> str:
    side = tmp / "side"
    side.mkdir()
    (side / "notes.csv").write_text("mine\n")
    (side / ".notes.csv.iox-batch").write_text("")  # the old scheme's marker beside a file
    return str(side / "notes.csv")


def _link_at_path(canary: Path, tmp: Path, wh: Path) -> str:
    (tmp / "link.csv").symlink_to(canary / "keep.txt")
    return str(tmp / "link.csv")


def _dangling_link_at_path(canary: Path, tmp: Path, wh: Path) -> str:
    (tmp / "dangling.csv").symlink_to(canary / "new.csv")
    return str(tmp / "dangling.csv")


def _link_in_parent_to_canary(canary: Path, tmp: Path, wh: Path) -> str:
    (tmp / "via").symlink_to(canary)
    return str(tmp / "via" / "folder")


def _link_in_parent_to_warehouse(canary: Path, tmp: Path, wh: Path) -> str:
    (tmp / "wh").symlink_to(wh)
    return str(tmp / "wh" / "fresh.csv")


def _symlinked_root_into_project(canary: Path, tmp: Path, wh: Path) -> str:
    (tmp / "proj").symlink_to(ROOT / "plugins")
    return str(tmp / "proj" / "out.csv")


def _dotdot_real(canary: Path, tmp: Path, wh: Path) -> str:
    (tmp / "sub").mkdir()
    return str(tmp / "sub" / ".." / "canary" / "keep.txt")


def _site_packages(canary: Path, tmp: Path, wh: Path) -> str:
    return str(Path(site.getsitepackages()[0]) / "evil.pth")


CASES: dict[str, tuple[str, Case, str]] = {
    "planted_marker_in_folder": ("parquet", lambda c, t, w: str(c), "not written by iox-batch"),
    "planted_marker_beside_file": ("csv", _sibling_marker, "not written by iox-batch"),
    "the_marker_itself": ("jsonl", lambda c, t, w: str(c / ".iox-batch"), "not written by iox-batch"),
    "warehouse_itself": ("parquet", lambda c, t, w: str(w), "warehouse"),
    "inside_warehouse": ("parquet", lambda c, t, w: str(w / "new.parquet"), "warehouse"),
    "project_folder": ("parquet", lambda c, t, w: str(ROOT), "project folder"),
    "project_plugins": ("csv", lambda c, t, w: str(ROOT / "plugins" / "iox_planner" / "x.csv"), "project folder"),
    "dotdot_into_project": ("csv", lambda c, t, w: str(ROOT / "plugins" / ".." / "dags" / "x.csv"), "project folder"),
    "venv": ("csv", lambda c, t, w: str(Path(sys.prefix) / "x.csv"), "never writes"),
    "site_packages": ("csv", _site_packages, "site-packages"),
    "proc": ("parquet", lambda c, t, w: "/proc/x", "/proc"),
    "empty": ("csv", lambda c, t, w: "", "empty"),
    "blank": ("csv", lambda c, t, w: "  ", "empty"),
    "newline_in_name": ("csv", lambda c, t, w: str(t / "x.csv\n"), "control character"),
    "nul_in_name": ("csv", lambda c, t, w: str(c / "keep.txt\0.csv"), "NUL character"),
    "dot": ("parquet", lambda c, t, w: str(t) + "/.", "names no file"),
    "symlink_at_path": ("csv", _link_at_path, "symbolic link"),
    "dangling_symlink_at_path": ("csv", _dangling_link_at_path, "symbolic link"),
    "symlink_in_parent": ("parquet", _link_in_parent_to_canary, "not written by iox-batch"),
    "symlink_parent_into_warehouse": ("csv", _link_in_parent_to_warehouse, "warehouse"),
    "symlinked_root_into_project": ("csv", _symlinked_root_into_project, "project folder"),
    "dotdot_onto_canary_file": ("csv", lambda c, t, w: str(t / "nowhere" / ".." / "canary" / "keep.txt"),
                                "does not exist"),
    "dotdot_through_real_folder": ("csv", _dotdot_real, "not written by iox-batch"),
    "missing_folder": ("csv", lambda c, t, w: str(t / "missing" / "x.csv"), "does not exist"),
    "file_where_folder_goes": ("parquet", lambda c, t, w: str(c / "keep.txt"), "a file is there"),
    "folder_where_file_goes": ("jsonl", lambda c, t, w: str(c / "folder"), "a folder is there"),
    "name_past_name_max": ("csv", lambda c, t, w: str(t / ("a" * 300 + ".csv")), "too long for the filesystem"),
    "path_past_path_max": ("parquet", lambda c, t, w: str(t / "/".join(["b" * 200] * 25)), "too long"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_output_is_refused(name: str, data: str, untouched: Any, tmp_path: Path, warehouse: Path,
                                   catalog: Catalog) -> None:
    fmt, prepare, needle = CASES[name]
    target = prepare(untouched.canary, tmp_path, warehouse)
    project_before = tree_digest(ROOT / "plugins")
    side_before = tree_digest(tmp_path / "side")
    recorded = publications(catalog)
    result = cli("query", "--db", data, SQL, "--format", fmt, "--output", target)
    assert_one_paragraph_error(result, needle)
    untouched.check()
    assert tree_digest(ROOT / "plugins") == project_before
    assert tree_digest(tmp_path / "side") == side_before
    assert publications(catalog) == recorded
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".") and ".tmp" in p.name]
    assert leftovers == []


def test_proc_parquet_through_the_installed_cli_is_one_paragraph(data: str, untouched: Any) -> None:
    # The reported case printed a 130-line Java trace: the real command, as a user runs it.
    result = run_cli("query", "--db", data, SQL, "--format", "parquet", "--output", "/proc/x")
    assert_one_paragraph_error(result, "/proc")
    untouched.check()


@pytest.mark.spark
def test_a_genuine_output_is_replaced_and_a_changed_one_is_not(spark: Any, data: str, tmp_path: Path,
                                                              untouched: Any) -> None:
    out = tmp_path / "r.csv"
    assert cli("query", "--db", data, SQL, "--format", "csv", "--output", str(out)).returncode == 0
    first = out.read_text()
    assert first.splitlines()[0] == "t,v,time"
    # Ours, unchanged: replaced.
    assert cli("query", "--db", data, "SELECT t FROM m ORDER BY t", "--format", "csv", "--output",
               str(out)).returncode == 0
    assert out.read_text() == "t\na\nb\n"
    # Changed by someone else after publication (same size, so only the content tells): kept.
    out.write_text("t\nz\nb\n")
    result = cli("query", "--db", data, SQL, "--format", "csv", "--output", str(out))
    assert_one_paragraph_error(result, "changed since")
    assert out.read_text() == "t\nz\nb\n"

    folder = tmp_path / "r.parquet"
    assert cli("query", "--db", data, SQL, "--format", "parquet", "--output", str(folder)).returncode == 0
    assert cli("query", "--db", data, SQL, "--format", "parquet", "--output", str(folder)).returncode == 0
    # A file dropped into a published folder makes it someone else's.
    (folder / "theirs.txt").write_text("added later\n")
    before = tree_digest(folder)
    result = cli("query", "--db", data, SQL, "--format", "parquet", "--output", str(folder))
    assert_one_paragraph_error(result, "changed since")
    assert tree_digest(folder) == before
    # Rewritten in place with the same name, size and mtime: ctime still tells.
    (folder / "theirs.txt").unlink()
    victim = next(p for p in sorted(folder.iterdir()) if p.suffix == ".parquet")
    st = victim.stat()
    victim.write_bytes(victim.read_bytes())
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    before = tree_digest(folder)
    result = cli("query", "--db", data, SQL, "--format", "parquet", "--output", str(folder))
    assert_one_paragraph_error(result, "changed since")
    assert tree_digest(folder) == before
    untouched.check()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.spark
def test_a_replaced_folder_keeps_the_query_from_choosing_names(spark: Any, data: str, tmp_path: Path) -> None:
    # A query's output named like the old marker is just data now: it makes nothing else replaceable.
    out = tmp_path / ".iox-batch"
    assert cli("query", "--db", data, SQL, "--format", "jsonl", "--output", str(out)).returncode == 0
    sibling = tmp_path / "sibling"
    sibling.mkdir()
    (sibling / "keep").write_text("k")
    result = cli("query", "--db", data, SQL, "--format", "parquet", "--output", str(sibling))
    assert_one_paragraph_error(result, "not written by iox-batch")
    assert (sibling / "keep").read_text() == "k"
    assert os.listdir(sibling) == ["keep"]
