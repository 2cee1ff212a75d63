"""Atomic publication of outputs: a result is written aside and renamed into place, and an existing path is only
replaced when the catalog's record says iox-batch published exactly what is there (a marker file proved nothing).
Where outputs may never go (the warehouse, the project, the Python installation) is decided here too."""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import hashlib
import os
import re
import shutil
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from iox_planner.errors import BadInputError
from iox_planner.faults import kill_point

# # A path is replaced only when the thing at it still matches the catalog's newest record of what iox-batch
# published there (publications.py). A marker file proved nothing: a query's output, or anyone, could plant one.
# Fingerprints: a file is its size and sha256 (exact; text and Arrow outputs are driver-sized already). A folder
# (Parquet, possibly huge) is a digest of every entry's relative name, type, size, inode, mtime and ctime: stat
# only, so it costs nothing like hashing; ctime cannot be set from user space, so any rewrite in place is seen even
# when size and mtime are restored; a copy or restore gets new inodes and is no longer "ours" (the safe direction).

_RUN: contextvars.ContextVar[str | None] = contextvars.ContextVar("iox_publishing_run", default=None)
_LEDGER: contextvars.ContextVar[Any] = contextvars.ContextVar("iox_publication_ledger", default=None)


@contextlib.contextmanager
def publishing_as(run: str, ledger: Any = None) -> Iterator[None]:
    """Record publications inside the block as made by `run` (an Airflow run names itself), optionally in
    another ledger than the catalog's."""
    run_token = _RUN.set(run)
    ledger_token = _LEDGER.set(ledger) if ledger is not None else None
    try:
        yield
    finally:
        _RUN.reset(run_token)
        if ledger_token is not None:
            _LEDGER.reset(ledger_token)


def _ledger() -> Any:
    ledger = _LEDGER.get()
    if ledger is None:
        from iox_planner.catalog.publications import CatalogLedger

        ledger = CatalogLedger()
        _LEDGER.set(ledger)
    return ledger


def _run_label() -> str:
    run = _RUN.get()
    if run:
        return run
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"


def forbidden_places() -> list[tuple[Path, str]]:
    """Where no output may go (nor contain): the warehouse, the project checkout (but its `output/`), the Python
    installation and its packages, the Spark and Java homes."""
    import site
    import sys

    from iox_planner.config import project_root, warehouse

    places: list[tuple[Path, str]] = [(warehouse(), "the warehouse (IOX_WAREHOUSE)"),
                                      (project_root(), "the iox-batch project folder")]
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        places.append((Path(prefix), "the Python installation (sys.prefix)"))
    try:
        packages = [*site.getsitepackages(), site.getusersitepackages()]
    except AttributeError:  # pragma: no cover - some embedded interpreters lack them
        packages = []
    for folder in packages:
        places.append((Path(folder), "an installed package folder (site-packages)"))
    for var in ("SPARK_HOME", "JAVA_HOME"):
        if os.environ.get(var):
            places.append((Path(os.environ[var]), f"{var}"))
    import importlib.util

    # Located, not imported: the planner core does not import Spark.
    spec = importlib.util.find_spec("pyspark")
    if spec is not None and spec.origin:
        places.append((Path(spec.origin).parent, "the pyspark package"))
    return [(p.resolve(), what) for p, what in places]


def safe_output_path(path: Path | str) -> Path:
    """An output path checked and made absolute: the folder resolved (symlinks, `..`), the name kept. Refused: an
    empty path, a name that is `.`/`..`, a symlink at the path, a missing folder, a place iox-batch never
    writes (`forbidden_places`), a path inside /proc, /sys or /dev."""
    text = str(path)
    if not text.strip():
        raise BadInputError("the output path is empty; give a file (csv, jsonl) or folder (parquet) to write, or "
                            "leave --output out to print text formats")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise BadInputError(f"output {_short(text)} holds a control character (a NUL, newline...); give a plain path")
    given = Path(os.path.abspath(os.path.expanduser(text)))
    name = given.name
    if name in ("", ".", "..") or text.endswith(("/.", "/..")) or text in (".", ".."):
        raise BadInputError(f"output {_short(text)} names no file or folder; give a path ending in a name")
    parent = Path(os.path.expanduser(text)).absolute().parent
    try:
        folder = parent.resolve(strict=True)
    except (FileNotFoundError, NotADirectoryError, RuntimeError, OSError):
        raise BadInputError(f"cannot write {_short(text)}: its folder {_short(str(parent))} does not exist (or is "
                            "not a folder); create it first") from None
    if not folder.is_dir():
        raise BadInputError(f"cannot write {_short(text)}: {_short(str(folder))} is not a folder")
    target = folder / name
    if target.is_symlink():
        raise BadInputError(f"output {_short(text)} is a symbolic link; iox-batch does not write through links: "
                            "give the real path")
    for system in (Path("/proc"), Path("/sys"), Path("/dev")):
        if target.is_relative_to(system):
            raise BadInputError(f"output {_short(text)} lies in {system}, which holds no files to write; choose a "
                                "path on a real filesystem")
    from iox_planner.config import project_root

    allowed_in_project = project_root() / "output"
    for place, what in forbidden_places():
        inside = target == place or target.is_relative_to(place)
        if inside and place == project_root() and target.is_relative_to(allowed_in_project) \
                and target != allowed_in_project:
            continue
        if inside or place.is_relative_to(target):
            relation = "lies inside" if inside else "contains"
            raise BadInputError(f"output {_short(text)} {relation} {what} ({_short(str(place))}), where iox-batch "
                                "never writes; choose a path outside it")
    return target


def _short(text: str, size: int = 120) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= size else text[: size - 3] + "..."


def fingerprint(path: Path) -> str:
    """What the thing at `path` is now (see above); a symlink or special file has none that matches."""
    st = os.lstat(path)
    if stat.S_ISREG(st.st_mode):
        digest = hashlib.sha256()
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        return f"sha256:{st.st_size}:{digest.hexdigest()}"
    if stat.S_ISDIR(st.st_mode):
        digest = hashlib.sha256()
        for top, dirs, files in os.walk(path, followlinks=False):
            dirs.sort()
            for entry in sorted([*dirs, *files]):
                full = os.path.join(top, entry)
                e = os.lstat(full)
                rel = os.path.relpath(full, path)
                kind = "d" if stat.S_ISDIR(e.st_mode) else "f" if stat.S_ISREG(e.st_mode) else "o"
                size = e.st_size if kind == "f" else 0
                digest.update(f"{rel}\0{kind}\0{size}\0{e.st_ino}\0{e.st_mtime_ns}\0{e.st_ctime_ns}\n".encode())
        return f"stat:{digest.hexdigest()}"
    return f"other:{stat.S_IFMT(st.st_mode)}:{st.st_ino}:{st.st_ctime_ns}"


def check_destination(path: Path | str, *, folder: bool) -> Path:
    """`path` must be free, or exactly what iox-batch published there (the catalog's record matches it).
    Anything else is an error, never deleted. Returns the checked absolute path."""
    target = safe_output_path(path)
    if not os.path.lexists(target):
        return target
    want = "folder" if folder else "file"
    if folder and not target.is_dir():
        raise BadInputError(f"cannot write a folder at {_short(str(target))}: a file is there (iox-batch never "
                            "deletes what it did not write); remove it or choose another path")
    if not folder and target.is_dir():
        raise BadInputError(f"cannot write a file at {_short(str(target))}: a folder is there; remove it or choose "
                            "another path")
    records = [r for r in _recent(target) if r.kind == want]
    if not records:
        raise BadInputError(f"{_short(str(target))} exists and was not written by iox-batch, so it is not replaced; "
                            "remove it or choose another path")
    # A publication is recorded just BEFORE its rename (so a run killed after the rename leaves a path its rerun
    # may replace); a run killed between the two left the previous publication in place, so the two newest
    # records both vouch for what iox-batch put there.
    if fingerprint(target) not in {r.fingerprint for r in records}:
        raise BadInputError(f"{_short(str(target))} was written by iox-batch but changed since (by someone else), so "
                            "it is not replaced; remove it or choose another path")
    return target


def _recent(target: Path) -> list[Any]:
    ledger = _ledger()
    if hasattr(ledger, "recent"):
        return list(ledger.recent(target, 2))
    latest = ledger.latest(target)
    return [] if latest is None else [latest]


class _Folder:
    """The output's folder, held open: renames happen relative to it, so a folder swapped for a symlink between
    the check and the publication cannot redirect them."""

    def __init__(self, folder: Path) -> None:
        self.path = folder
        self.fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        if os.path.realpath(f"/proc/self/fd/{self.fd}") != str(folder) and Path("/proc/self/fd").is_dir():
            os.close(self.fd)
            raise BadInputError(f"the output folder {_short(str(folder))} changed while it was checked; try again")

    def close(self) -> None:
        os.close(self.fd)


def _temp_name(name: str, suffix: str, token: str | None = None) -> str:
    # Hidden, random, and derived from nothing a query controls: a hostile query cannot name it in advance.
    return f".{name[:100]}.{token or uuid.uuid4().hex}.{suffix}"


# --- what a killed run leaves behind ----------------------------------------------------------------------------------
# A run publishing `name` holds an exclusive flock on `.<name>.<token>.lock` from before it creates its staged
# `.<name>.<token>.tmp` until it is done; the old output it moves aside is `.<name>.<token>.old`. The kernel drops
# the lock when the process dies however it dies (SIGKILL included), so the next run publishing the same name
# finds the lock free and removes that token's leftovers. A live run's lock is never free, so its files are never
# touched; only names of exactly this form, next to this output, are.
_TOKEN = re.compile(r"[0-9a-f]{32}")


class _RunLock:
    def __init__(self, parent: _Folder, name: str) -> None:
        self.token = uuid.uuid4().hex
        self.name = _temp_name(name, "lock", self.token)
        self.parent = parent
        self.fd = os.open(self.name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=parent.fd)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.name, dir_fd=self.parent.fd)
        os.close(self.fd)


def sweep_leftovers(parent: _Folder, name: str) -> list[str]:
    """Remove the staged and set-aside copies of `name` left by publishing runs that died. Returns their names."""
    prefix = f".{name[:100]}."
    removed: list[str] = []
    for entry in os.listdir(parent.fd):
        if not (entry.startswith(prefix) and entry.endswith(".lock")):
            continue
        token = entry[len(prefix):-len(".lock")]
        if not _TOKEN.fullmatch(token):
            continue
        try:
            fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=parent.fd)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its run is alive
            for suffix in ("tmp", "old"):
                leftover = _temp_name(name, suffix, token)
                st = _lstat_at(parent, leftover)
                if st is None:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(leftover, ignore_errors=True, dir_fd=parent.fd)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(leftover, dir_fd=parent.fd)
                removed.append(leftover)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry, dir_fd=parent.fd)
        finally:
            os.close(fd)
    return removed


def _lstat_at(parent: _Folder, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=parent.fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


@dataclass
class _Stage:
    """A publication in progress: the checked target, its open parent folder, this run's lock on the name and the
    temporary sibling the result is written to."""

    target: Path
    folder: bool
    parent: _Folder
    lock: _RunLock
    tmp_name: str

    @property
    def tmp(self) -> Path:
        return self.target.parent / self.tmp_name

    def record(self, published: str) -> None:
        """Record the publication in the catalog BEFORE the rename (a run killed right after the rename is still
        recognised as ours by its rerun), the target checked again first: still the thing we checked (or gone)."""
        if os.path.lexists(self.target):
            check_destination(self.target, folder=self.folder)
        _ledger().record(_publication(self.target, "folder" if self.folder else "file", published))
        kill_point("publish.before_rename")


@contextlib.contextmanager
def _staging(path: Path, *, folder: bool) -> Iterator[_Stage]:
    """Check the destination, sweep what dead runs left beside it, lock its name, and afterwards remove the
    temporary (if it was not renamed into place) and release everything."""
    target = check_destination(path, folder=folder)
    parent = _Folder(target.parent)
    try:
        sweep_leftovers(parent, target.name)
        lock = _RunLock(parent, target.name)
    except BaseException:
        parent.close()
        raise
    stage = _Stage(target, folder, parent, lock, _temp_name(target.name, "tmp", lock.token))
    try:
        yield stage
    finally:
        if folder:
            if os.path.lexists(stage.tmp):
                shutil.rmtree(stage.tmp_name, ignore_errors=True, dir_fd=parent.fd)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stage.tmp_name, dir_fd=parent.fd)
        lock.release()
        parent.close()


@contextlib.contextmanager
def staged_file(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling to write; publish it over `path` atomically when the block succeeds, and record
    the publication in the catalog."""
    with _staging(path, folder=False) as stage:
        yield stage.tmp
        stage.record(fingerprint(stage.tmp))
        os.replace(stage.tmp_name, stage.target.name, src_dir_fd=stage.parent.fd, dst_dir_fd=stage.parent.fd)
        kill_point("publish.after_rename")


@contextlib.contextmanager
def staged_folder(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder to fill; swap it in for `path` when the block succeeds, and record the
    publication in the catalog."""
    with _staging(path, folder=True) as stage:
        yield stage.tmp
        if not stage.tmp.is_dir() or stage.tmp.is_symlink():
            raise BadInputError(f"the result for {_short(str(stage.target))} was not written as a folder")
        stage.record(fingerprint(stage.tmp))
        publish_folder(stage.tmp, stage.target, _dir_fd=stage.parent.fd, _token=stage.lock.token)
        kill_point("publish.after_rename")


def _publication(target: Path, kind: str, fp: str) -> Any:
    from iox_planner.catalog.publications import Publication

    return Publication(str(target), kind, fp, _run_label())


def publish_folder(tmp: Path, path: Path, *, _dir_fd: int | None = None, _token: str | None = None) -> None:
    """Swap a finished folder in: the old one (checked to be ours) moves aside, the new one takes its name, the
    old goes. Both live in one folder, so each step is a rename."""
    own = _dir_fd is None
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY) if own else _dir_fd
    assert fd is not None
    try:
        old_name = None
        if os.path.lexists(path):
            check_destination(path, folder=True)  # still the thing we checked
            old_name = _temp_name(path.name, "old", _token)
            os.replace(path.name, old_name, src_dir_fd=fd, dst_dir_fd=fd)
            kill_point("publish.old_moved_aside")
        os.replace(tmp.name, path.name, src_dir_fd=fd, dst_dir_fd=fd)
        if old_name is not None:
            shutil.rmtree(old_name, ignore_errors=True, dir_fd=fd)
    finally:
        if own:
            os.close(fd)
