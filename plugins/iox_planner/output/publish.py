"""Atomic publication of outputs: a result is written aside and renamed into place, and an existing path is only
replaced when the catalog's record says iox-batch published exactly what is there (a marker file proved nothing).
From the check on, the output's folder is held open and every step goes through that descriptor, so a folder
swapped for a link meanwhile redirects nothing. Where outputs may never go (the warehouse, the project, the Python
installation) is decided here too."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any, Iterator

from iox_planner.errors import BadInputError
from iox_planner.faults import kill_point
from iox_planner.objectstore import Root, is_uri
from iox_planner.output import Destination
# The ledger of publications (the catalog's, or a block's own) is ledger.py's, shared with output/store.py; its
# context variable and `publishing_as` are named here too, where callers and tests have always found them.
from iox_planner.output.ledger import _LEDGER as _LEDGER
from iox_planner.output.ledger import ledger, publication, recent_publications
from iox_planner.output.ledger import publishing_as as publishing_as

# # A path is replaced only when the thing at it still matches the catalog's newest record of what iox-batch
# published there (publications.py). A marker file proved nothing: a query's output, or anyone, could plant one.
# Fingerprints: a file is its size and sha256 (exact; text and Arrow outputs are driver-sized already). A folder
# (Parquet, possibly huge) is a digest of every entry's relative name, type, size, inode, mtime and ctime: stat
# only, so it costs nothing like hashing; ctime cannot be set from user space, so any rewrite in place is seen even
# when size and mtime are restored; a copy or restore gets new inodes and is no longer "ours" (the safe direction).

def forbidden_places() -> list[tuple[Path, str]]:
    """Where no output may go (nor contain): the warehouse, the project checkout (but its `output/`), the Python
    installation and its packages, the Spark and Java homes."""
    import site
    import sys

    from iox_planner.config import project_root, warehouse_root

    places: list[tuple[Path, str]] = [(project_root(), "the iox-batch project folder")]
    warehouse = warehouse_root()
    if warehouse.is_local:  # a warehouse on a store is kept from store outputs by output/store.py
        places.append((warehouse.local_path, "the warehouse (IOX_WAREHOUSE)"))
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


# Linux's limits (NAME_MAX, PATH_MAX): a longer name fails deep in a rename with ENAMETOOLONG.
_NAME_MAX = 255
_PATH_MAX = 4_096


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
    longest = max(given.parts[1:], key=lambda part: len(os.fsencode(part)), default="")
    if len(os.fsencode(longest)) > _NAME_MAX or len(os.fsencode(str(given))) > _PATH_MAX:
        raise BadInputError(f"output {_short(text)} is too long for the filesystem (a name of at most {_NAME_MAX} "
                            f"bytes, a path of at most {_PATH_MAX:,}); choose a shorter one")
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


def _why(err: OSError) -> str:
    return err.strerror.lower() if err.strerror else type(err).__name__


# --- the approved folder, held open -----------------------------------------------------------------------------------
# From the check on, everything happens through descriptors. The output's folder is opened one component at a time,
# following no link, so what is held is the folder at the approved path and not wherever a link leads; the checks
# of what is at the path, the sweep, the lock, the private staging folder and the renames are all relative to it.
# A writer that needs a path (Spark, pyarrow, open()) gets /proc/<pid>/fd/<staging fd>/result: the kernel resolves
# /proc/<pid>/fd/<n> to the held folder itself, so no folder name on the way can be re-pointed. Just before the
# publication is recorded, and again just before the rename, the approved path is walked again: when it no longer
# leads to the held folder (moved, or replaced by a link), nothing is published and nothing stays recorded. (A swap
# in the microseconds between that last walk and the rename cannot redirect the rename: it still lands in the
# folder the checks approved.)


def _walk(folder: Path) -> tuple[int, list[os.stat_result]]:
    """A readable descriptor of the absolute, link-free `folder`, opened component by component without following
    a link, and the stat of every folder on the way (`/` first)."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:
        chain = [os.fstat(fd)]
        for part in folder.parts[1:]:
            step = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = step
            chain.append(os.fstat(fd))
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), chain
    finally:
        os.close(fd)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _repointable(folder: os.stat_result, entry: os.stat_result) -> bool:
    """Whether a user other than this one and root may move or replace `entry` inside `folder`: the folder is
    someone else's, or others may write in it and it is not sticky (in a sticky folder such as /tmp only an entry's
    owner may move it). Permission bits only, as sshd's StrictModes: ACLs are not read."""
    trusted = (0, os.geteuid())
    if folder.st_uid not in trusted:
        return True
    if not folder.st_mode & 0o022:
        return False
    return not (folder.st_mode & stat.S_ISVTX and entry.st_uid in trusted)


def fd_path(fd: int, name: str = "") -> str:
    """A path to `name` inside the folder `fd` holds, usable by this process and by any process of this user on this
    machine (a local Spark JVM): the kernel resolves /proc/<pid>/fd/<n> to the held folder itself."""
    base = f"/proc/{os.getpid()}/fd/{fd}"
    return f"{base}/{name}" if name else base


def _moved(target: Path, folder: Path) -> BadInputError:
    return BadInputError(
        f"nothing was published at {_short(str(target))}: its folder {_short(str(folder))} was moved or replaced "
        "(by a link, say) after it was checked, so that path no longer leads to the folder iox-batch checked and "
        "wrote in. The result was dropped and no publication is recorded; find out who changes that folder, then "
        "run the command again")


class PinnedFolder:
    """The output's folder, held open from its check on (see above)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.fd, self._chain = _walk(path)
        except PermissionError:
            raise BadInputError(f"cannot write in {_short(str(path))}: permission denied (iox-batch opens and lists "
                                "the output's folder); choose a folder you may read and write") from None
        except OSError as err:
            raise BadInputError(
                f"cannot write in {_short(str(path))}: {_why(err)} on its path, which changed since it was checked "
                "(a folder on it moved, vanished or became a link); nothing was written. Run the command again"
            ) from None

    def __enter__(self) -> PinnedFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        os.close(self.fd)

    def in_place(self) -> bool:
        """The approved path still leads, link-free, to the held folder."""
        try:
            fd, _ = _walk(self.path)
        except OSError:
            return False
        try:
            return _same(os.fstat(fd), os.fstat(self.fd))
        finally:
            os.close(fd)

    def require_in_place(self, target: Path) -> None:
        if not self.in_place():
            raise _moved(target, self.path)

    def lstat(self, name: str) -> os.stat_result | None:
        return _lstat_at(self.fd, name)

    def open_folder(self, name: str) -> int:
        """A descriptor of the folder `name` inside this one (not a link to one)."""
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self.fd)

    def exposed(self, entry: os.stat_result) -> Path | None:
        """The first folder from `/` down to this one in which a user other than this one and root could move or
        replace what comes next on the way (for this folder: `entry`, an entry of it), if any."""
        nexts = [*self._chain[1:], entry]
        for depth, (folder, nxt) in enumerate(zip(self._chain, nexts)):
            if _repointable(folder, nxt):
                return Path(*self.path.parts[:depth + 1])
        return None


def fingerprint_at(dir_fd: int, name: str) -> str:
    """What `name` inside the folder `dir_fd` holds is now (see the top of the module); a symlink or special file has
    none that matches."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISREG(st.st_mode):
        digest = hashlib.sha256()
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
        with os.fdopen(fd, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        return f"sha256:{st.st_size}:{digest.hexdigest()}"
    if stat.S_ISDIR(st.st_mode):
        digest = hashlib.sha256()
        # fwalk never follows a link and reaches every entry through its folder's descriptor.
        for top, dirs, files, top_fd in os.fwalk(name, dir_fd=dir_fd):
            dirs.sort()
            for entry in sorted([*dirs, *files]):
                e = os.stat(entry, dir_fd=top_fd, follow_symlinks=False)
                rel = os.path.relpath(os.path.join(top, entry), name)
                kind = "d" if stat.S_ISDIR(e.st_mode) else "f" if stat.S_ISREG(e.st_mode) else "o"
                size = e.st_size if kind == "f" else 0
                digest.update(f"{rel}\0{kind}\0{size}\0{e.st_ino}\0{e.st_mtime_ns}\0{e.st_ctime_ns}\n".encode())
        return f"stat:{digest.hexdigest()}"
    return f"other:{stat.S_IFMT(st.st_mode)}:{st.st_ino}:{st.st_ctime_ns}"


def check_destination(path: Path | str, *, folder: bool) -> Destination:
    """`path` must be free, or exactly what iox-batch published there (the catalog's record matches it).
    Anything else is an error, never deleted. Returns the checked absolute path, or the checked store key for an
    `s3://` output (output/store.py: under an output root on a store)."""
    if isinstance(path, str) and is_uri(path):
        from iox_planner.output.store import check_store_destination

        return check_store_destination(path, folder=folder)
    if isinstance(path, Root):
        from iox_planner.output.store import check_store_destination

        return check_store_destination(path.uri, folder=folder)
    target = safe_output_path(path)
    with PinnedFolder(target.parent) as parent:
        _check_at(parent, target, folder=folder)
    return target


def _check_at(parent: PinnedFolder, target: Path, *, folder: bool) -> None:
    """check_destination's verdict on what `parent`, held open, has under the target's name."""
    st = parent.lstat(target.name)
    if st is None:
        return
    if stat.S_ISLNK(st.st_mode):
        raise BadInputError(f"output {_short(str(target))} is a symbolic link; iox-batch does not write through "
                            "links: give the real path")
    want = "folder" if folder else "file"
    if folder and not stat.S_ISDIR(st.st_mode):
        raise BadInputError(f"cannot write a folder at {_short(str(target))}: a file is there (iox-batch never "
                            "deletes what it did not write); remove it or choose another path")
    if not folder and stat.S_ISDIR(st.st_mode):
        raise BadInputError(f"cannot write a file at {_short(str(target))}: a folder is there; remove it or choose "
                            "another path")
    records = [r for r in recent_publications(target) if r.kind == want]
    if not records:
        raise BadInputError(f"{_short(str(target))} exists and was not written by iox-batch, so it is not replaced; "
                            "remove it or choose another path")
    # A publication is recorded just BEFORE its rename (so a run killed after the rename leaves a path its rerun
    # may replace); a run killed between the two left the previous publication in place, so the two newest
    # records both vouch for what iox-batch put there.
    if fingerprint_at(parent.fd, target.name) not in {r.fingerprint for r in records}:
        raise BadInputError(f"{_short(str(target))} was written by iox-batch but changed since (by someone else), so "
                            "it is not replaced; remove it or choose another path")


def _temp_name(name: str, suffix: str, token: str | None = None) -> str:
    # Hidden, random, and derived from nothing a query controls: a hostile query cannot name it in advance.
    return f".{name[:100]}.{token or uuid.uuid4().hex}.{suffix}"


# --- what a killed run leaves behind ----------------------------------------------------------------------------------
# A run publishing `name` holds an exclusive flock on `.<name>.<token>.lock` from before it creates its private
# staging folder `.<name>.<token>.tmp` until it is done; the old output it moves aside is `.<name>.<token>.old`.
# The kernel drops the lock when the process dies however it dies (SIGKILL included), so the next run publishing
# the same name finds the lock free and removes that token's leftovers. A live run's lock is never free, so its
# files are never touched; only names of exactly this form, next to this output, are.
_TOKEN = re.compile(r"[0-9a-f]{32}")


class _RunLock:
    def __init__(self, parent: PinnedFolder, name: str) -> None:
        self.token = uuid.uuid4().hex
        self.name = _temp_name(name, "lock", self.token)
        self.parent = parent
        self.fd = os.open(self.name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=parent.fd)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def release(self) -> None:
        found = self.parent.lstat(self.name)
        if found is not None and _same(found, os.fstat(self.fd)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.name, dir_fd=self.parent.fd)
        os.close(self.fd)


def sweep_leftovers(parent: PinnedFolder, name: str) -> list[str]:
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
                st = parent.lstat(leftover)
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


RESULT = "result"
"""The result's name inside a stage's private folder (renamed to the output's name when published)."""


class Stage:
    """A publication in progress: the checked target, its held folder, this run's lock on the name, and the private
    folder `.<name>.<token>.tmp` (this user's, mode 0700, held open too) the result is written into as `result`."""

    def __init__(self, target: Path, folder: bool, parent: PinnedFolder, lock: _RunLock) -> None:
        self.target, self.folder, self.parent, self.lock = target, folder, parent, lock
        self.name = _temp_name(target.name, "tmp", lock.token)
        os.mkdir(self.name, 0o700, dir_fd=parent.fd)
        self.fd = os.open(self.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent.fd)
        # Anyone who may write in the output's folder could have put a folder of theirs in ours' place meanwhile.
        if os.fstat(self.fd).st_uid != os.geteuid() or os.listdir(self.fd):
            os.close(self.fd)
            raise _moved(target, parent.path)
        os.fchmod(self.fd, 0o700)  # whatever the umask: nobody else enters it

    @property
    def result(self) -> Path:
        """Where to write the result, for this process and local processes of this user (a local Spark JVM):
        through the private folder's descriptor, so no swapped folder can redirect it."""
        return Path(fd_path(self.fd, RESULT))

    def shared_result(self) -> Path:
        """Where to write the result for writers that cannot use this process's descriptors (a cluster's executors
        reach the folder by name, maybe from another machine): the name, allowed only when nobody but this user
        and root can move or replace a folder on its way. A swap by this user or root is still caught before the
        publication (`publish`), though the executors' files then lie where the name led."""
        exposed = self.parent.exposed(os.fstat(self.fd))
        if exposed is not None:
            raise BadInputError(
                f"cannot write {_short(str(self.target))} from the cluster's executors: they reach it by name, and "
                f"users other than you and root may move or replace what is in {_short(str(exposed))} (writable by "
                "others and not sticky, or someone else's), so they could redirect the write. Choose an output in a "
                "folder only you can change, or run Spark locally (IOX_SPARK_MASTER=local[*])")
        return self.parent.path / self.name / RESULT

    def publish(self) -> None:
        """Record the publication, then rename the result into place, both only while the approved path still
        leads to the held folder; a failed rename takes the record back."""
        kind = "folder" if self.folder else "file"
        st = _lstat_at(self.fd, RESULT)
        if st is None or not (stat.S_ISDIR(st.st_mode) if self.folder else stat.S_ISREG(st.st_mode)):
            raise BadInputError(f"the result for {_short(str(self.target))} was not written as a {kind}")
        published = fingerprint_at(self.fd, RESULT)
        self.parent.require_in_place(self.target)
        _check_at(self.parent, self.target, folder=self.folder)  # still what was checked, or gone
        # Recorded BEFORE the rename: a run killed right after the rename is still recognised as ours by its rerun.
        # Killed between the two, the record vouches for a fingerprint nothing at the path has (harmless: it can
        # only match these same bytes, or this folder's very inodes).
        books = ledger()
        record = books.record(publication(str(self.target), kind, published))
        try:
            kill_point("publish.before_rename")
            self.parent.require_in_place(self.target)
            self._rename_into_place()
        except BaseException:
            with contextlib.suppress(Exception):  # a catalog gone meanwhile keeps a record that matches nothing
                books.withdraw(record)
            raise
        kill_point("publish.after_rename")

    def _rename_into_place(self) -> None:
        p = self.parent.fd
        name = self.target.name
        if not self.folder:
            os.replace(RESULT, name, src_dir_fd=self.fd, dst_dir_fd=p)
            return
        # A folder cannot replace a folder in one rename: the old one (checked to be ours) moves aside first.
        old = None
        if self.parent.lstat(name) is not None:
            old = _temp_name(name, "old", self.lock.token)
            os.rename(name, old, src_dir_fd=p, dst_dir_fd=p)
            kill_point("publish.old_moved_aside")
        try:
            os.rename(RESULT, name, src_dir_fd=self.fd, dst_dir_fd=p)
        except BaseException:
            if old is not None:
                with contextlib.suppress(OSError):
                    os.rename(old, name, src_dir_fd=p, dst_dir_fd=p)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True, dir_fd=p)

    def discard(self) -> None:
        """Remove the private folder with whatever is left in it (only if that name still is ours), and close it."""
        try:
            found = self.parent.lstat(self.name)
            if found is not None and _same(found, os.fstat(self.fd)):
                shutil.rmtree(self.name, ignore_errors=True, dir_fd=self.parent.fd)
        finally:
            os.close(self.fd)


@contextlib.contextmanager
def staged(path: Path | str, *, folder: bool, parent: PinnedFolder | None = None) -> Iterator[Stage]:
    """Check the destination, hold its folder open (or use `parent`, the caller's hold on it), sweep what dead runs
    left beside it, lock its name and make the private staging folder; the block writes the result
    (`Stage.result`), which is published when the block succeeds. The staging folder and the lock go either way."""
    target = safe_output_path(path)
    held = parent if parent is not None else PinnedFolder(target.parent)
    try:
        if parent is not None and (parent.path != target.parent or not parent.in_place()):
            raise _moved(target, parent.path)
        _check_at(held, target, folder=folder)
        sweep_leftovers(held, target.name)
        try:
            lock = _RunLock(held, target.name)
        except OSError as err:  # a folder one may not write in, a read-only filesystem...
            raise BadInputError(f"cannot write in {_short(str(held.path))}: {_why(err)}; choose a folder you may "
                                "write in") from None
        try:
            stage = Stage(target, folder, held, lock)
            try:
                kill_point("publish.before_write")
                yield stage
                stage.publish()
            finally:
                stage.discard()
        finally:
            lock.release()
    finally:
        if parent is None:
            held.close()


@contextlib.contextmanager
def staged_file(path: Path | str) -> Iterator[Path]:
    """A path to write the file result to (see `Stage.result`); published over `path` atomically when the block
    succeeds, and recorded in the catalog."""
    with staged(path, folder=False) as stage:
        yield stage.result
