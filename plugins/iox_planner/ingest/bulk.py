"""Bulk load (`iox-batch write --spark FILE|DIR`): line protocol parsed and written in parallel, registered in one
catalog transaction, with the plain write's result or error.

- Input: a FILE, or every regular file directly in a DIR in byte order of their names (`input_files`: hidden
  names are skipped; a symlink, device, FIFO or socket in DIR is an error, never followed or read; subfolders are
  not entered). The load means what plain writes of those files, one after another, in one transaction, mean.
  A triggered load's folder must resolve inside its root first (`resolve_source`). FILE or DIR may be an
  `s3://BUCKET/PREFIX` object or prefix too, read the same way (the same files, order and errors) through
  pyarrow's S3 filesystem, each task reading its byte range itself; a triggered load's root stays a local folder.
- Each file is cut into byte ranges of about `IOX_BULK_RANGE_BYTES`, each ending just after a LF
  (`plan_ranges`). A task (`parse_range`, run by a `RangeRunner`: Spark in `spark_jobs/bulk_job.py`) reads its
  range through `blocks.line_blocks` and the plain write's parser (`write.parse_blocks`: the vectorized path, else
  `StreamParser`), and writes one ingester chunk per (table, partition): in a local warehouse into the load's
  staging folder `<warehouse>/_bulk/<load id>/` (`storage.bulk_staging`); on an object store, which cannot rename,
  straight to the key it keeps, `_loads/<load id>/<uuid>.parquet` (`storage.bulk_load_folder`). It writes nothing
  when its range holds a bad line.
- The driver (`bulk_write`) registers every chunk in ONE transaction (`storage.Staged.transaction`): orders are
  taken in input order (file, then range, then table and partition), so a later line wins over an earlier one
  exactly as in the plain streamed write, whose chunks of one partition take rising orders too. Locally each file
  is moved from staging to `<db id>/<table id>/<partition id>/<uuid>.parquet` just before its row is inserted; on
  a store nothing moves: the rows name the keys the tasks put, and the COMMIT is the only publication. A load that
  fails before its COMMIT deletes its objects (what the tasks reported and whatever its folder lists); a killed one
  leaves objects no row names, which the sweep of unreferenced objects removes after the grace period.
- Whenever the parallel parse cannot vouch for the exact result (a bad line or UTF-8 error in any range, a range
  cut inside a string value that spans lines, a column whose type differs between ranges or from the catalog, a
  file with no point), the load is done again by the plain streamed write, serially, in one transaction: its
  error (or, for a cut inside a string, its result) is the plain write's by construction. `--accept-partial`
  takes the same way when a line is bad.
- A load in flight holds a Postgres advisory lock on its id (`catalog/locks.py`). `sweep_bulk_loads`
  (`maintenance/sweeps.py`, part of persist's `sweep_unreferenced`) removes the staging folder of a load whose
  lock is free (its driver died) once older than the grace period, and the files its manifest says were moved but
  that no catalog row names. The registration runs on the lock's own session and first re-checks that the session
  still holds the lock (as compaction's swap does): had the session died during the tasks, a sweep may have
  removed the staged chunks, so the load fails then with a retryable error and registers nothing; checked in the
  transaction, it holds until the COMMIT.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable, Iterator, Sequence, cast

import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa

from iox_planner import storage
from iox_planner.catalog import locks
from iox_planner.catalog.freshness import record_writes
from iox_planner.catalog.limits import CatalogLimits, WriteGuard, WriteShape
from iox_planner.catalog.names import check_db_name
from iox_planner.catalog.store import Catalog
from iox_planner import config
from iox_planner.errors import BadInputError, CatalogError, CatalogUnavailableError
from iox_planner.faults import kill_point
from iox_planner.ingest import files as chunk_files
from iox_planner.ingest import write as plain
from iox_planner.ingest.blocks import line_blocks
from iox_planner.ingest.lineprotocol import LineError, Limits, Point, Precision, StreamParser
from iox_planner.ingest.lineprotocol.vectorized import Piece
from iox_planner.model import LOCAL_STORE, MAX_WRITE_POSITION, TIME, ChunkKind, ColumnType
from iox_planner.timeutil import now_ns, partition_of
from iox_planner.userfiles import open_regular
from iox_planner.objectstore import Root, is_uri, local_root, parse_root, store_errors, uri_problem

if TYPE_CHECKING:
    import pyarrow.fs as pafs


def range_bytes() -> int:
    """`IOX_BULK_RANGE_BYTES`: the size a task's byte range aims at (ranges end at the next LF). A task holds its
    range's rows in memory, so this bounds a task's memory (about 5x the range for TSBS-like lines)."""
    return config.BULK_RANGE_BYTES.read()


# --- input --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputFile:
    """A file of the load and what it was when listed: every later open (the driver's cuts, each task, the plain
    fallback) refuses it unless it is still that very file (not followed through a link, same inode, size and
    modification time). A folder or file swapped for a link after the listing, or a file changed meanwhile, then
    fails the load instead of feeding it other bytes. (The device number is left out: on a shared file system it
    differs from host to host.)"""

    path: str
    """Absolute (a local path, or an `s3://` URI): what the tasks open, wherever their working folder is."""
    name: str
    """The file as the user named it (the source, or the source's folder joined with the file's name): what
    errors say, as a plain write of that file would."""
    ino: int
    """0 for an object on a store (which has no inode: its size and time pin it)."""
    size: int
    mtime_ns: int


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns


def _changed(path: str | Path) -> BadInputError:
    return BadInputError(f"{path} changed while the bulk load ran (replaced, moved, or written to): nothing was "
                         "loaded; run the load again once its files are still")


def open_input(path: str | Path, pin: tuple[int, int, int]) -> BinaryIO:
    """`path` opened for reading if it is still the file `pin` (inode, size, mtime) names; else a BadInputError.
    An `s3://` object is opened for random access through the store (each read a ranged GET), pinned by its size
    and modification time."""
    if isinstance(path, str) and is_uri(path):
        return _open_object(path, pin)
    handle = open_regular(path, str(path), follow_links=False, hint="; it changed while the bulk load ran")
    if _identity(os.fstat(handle.fileno())) != tuple(pin):
        handle.close()
        raise _changed(path)
    return handle


def read_errors(path: str) -> contextlib.AbstractContextManager[None]:
    """A store's failure while reading the input `path` as the retryable `StoreUnavailableError` (a local file's
    errors stay as they are)."""
    if is_uri(path):
        return store_errors(parse_root(path, what="the bulk load's input"), "read", "")
    return contextlib.nullcontext()


def _object_info(uri: str) -> tuple[Root, "pafs.FileInfo"]:
    """The object or prefix `uri` names, looked up on its store (one request)."""
    where = parse_root(uri, what="the bulk load's input")
    with store_errors(where, "look up", ""):
        return where, where.filesystem().get_file_info(where.base)


def _open_object(uri: str, pin: tuple[int, int, int]) -> BinaryIO:
    import pyarrow.fs as pafs

    where, found = _object_info(uri)
    if found.type != pafs.FileType.File or (0, found.size, found.mtime_ns) != tuple(pin):
        raise _changed(uri)
    with store_errors(where, "read", ""):
        return cast(BinaryIO, where.filesystem().open_input_file(where.base))


def _inside(fd: int, source: str, root: Path) -> Path:
    """The real path of the open `fd`, which must lie strictly inside `root`: read from the kernel's own record of
    what was opened, so a link swapped in after a check cannot lead elsewhere."""
    real = Path(os.readlink(f"/proc/self/fd/{fd}"))
    resolved = root.resolve()
    if real == resolved or not real.is_relative_to(resolved):
        raise BadInputError(f"{source!r} resolves to {real}, which is not inside {resolved}: this load reads only "
                            "below that folder")
    return real


def resolve_source(text: str, root: Path) -> Path:
    """A triggered load's `folder` param as a real path strictly inside `root` (IOX_BULK_LOAD_ROOT, a local folder:
    a URI is refused, whatever it names); relative paths resolve under it; `..` is refused outright (even when it
    would land inside), a NUL too; symlinks are resolved
    and the result must still lie inside the root (a link out of it is refused), and it must exist as a folder or
    file. `input_files` checks the root again on what it opens."""
    if not isinstance(text, str) or not text.strip():
        raise BadInputError("folder is empty: give a folder under IOX_BULK_LOAD_ROOT")
    if "\0" in text:
        raise BadInputError("folder holds a NUL character; give a plain path under IOX_BULK_LOAD_ROOT")
    if is_uri(text):
        # The allow-list is one local folder: a URI (another bucket, another scheme) is never resolved against it.
        raise BadInputError(f"folder {text[:200]!r} is a URI: triggered bulk loads read only below "
                            f"IOX_BULK_LOAD_ROOT ({root}), a local folder; give a path under it")
    given = Path(text)
    if ".." in given.parts:
        raise BadInputError(f"folder {text[:200]!r} uses '..': give a path under IOX_BULK_LOAD_ROOT ({root}) "
                            "without it")
    candidate = given if given.is_absolute() else root / given
    try:
        real = candidate.resolve(strict=True)
    except (FileNotFoundError, RuntimeError):
        raise BadInputError(f"folder {text[:200]!r} does not exist under IOX_BULK_LOAD_ROOT ({root})") from None
    if real == root or not real.is_relative_to(root):
        raise BadInputError(f"folder {text[:200]!r} resolves to {real}, which is not inside IOX_BULK_LOAD_ROOT "
                            f"({root}): triggered bulk loads read only below that folder")
    if not (real.is_dir() or real.is_file()):
        raise BadInputError(f"folder {text[:200]!r} is neither a folder nor a regular file")
    return real


def input_files(source: str, root: Path | None = None) -> list[InputFile]:
    """The files a load reads, in load order: FILE itself, or DIR's regular files sorted by the bytes of their
    names. Hidden names (a leading dot: editors' swap files, `.DS_Store`) are skipped and subfolders not entered;
    a symlink, device, FIFO or socket in DIR is refused (it could point outside DIR, or block a read forever).
    `root` (a triggered load's IOX_BULK_LOAD_ROOT): what is opened must lie inside it, checked on the open folder
    or file itself. Each file is pinned (`InputFile`) as listed."""
    if source == "-":
        raise BadInputError("write --spark reads files, not standard input: give a FILE or a folder")
    if is_uri(source):
        if root is not None:
            raise BadInputError(f"{source[:200]!r} is a URI: a triggered bulk load reads only below "
                                f"IOX_BULK_LOAD_ROOT ({root}), a local folder")
        return _object_files(source)
    try:
        fd = os.open(os.path.realpath(source), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise BadInputError(f"cannot read {source}: no such file or folder") from None
    except PermissionError:
        raise BadInputError(f"cannot read {source}: permission denied") from None
    except OSError as err:
        raise BadInputError(f"cannot read {source}: {err.strerror}") from None
    try:
        real = _inside(fd, source, root) if root is not None else Path(os.path.realpath(source))
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            return [InputFile(str(real), source, *_identity(st))]
        if not stat.S_ISDIR(st.st_mode):
            raise BadInputError(f"cannot read {source}: it is neither a regular file nor a folder")
        found: list[InputFile] = []
        try:
            entries = sorted(os.scandir(fd), key=lambda e: os.fsencode(e.name))
        except PermissionError:
            raise BadInputError(f"cannot read {source}: permission denied") from None
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_symlink():
                raise BadInputError(f"{source} holds a symlink, {entry.name!r}: a bulk load reads only regular "
                                    "files of its folder; replace the link by the file or load the file itself")
            est = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(est.st_mode):
                continue
            if not stat.S_ISREG(est.st_mode):
                raise BadInputError(f"{source} holds {entry.name!r}, which is not a regular file (a device, FIFO "
                                    "or socket): remove it from the folder")
            found.append(InputFile(str(real / entry.name), str(Path(source) / entry.name), *_identity(est)))
    finally:
        os.close(fd)
    return _some(found, source)


def _some(found: list[InputFile], source: str) -> list[InputFile]:
    if not found:
        raise BadInputError(f"nothing to write: {source} holds no files (hidden files and subfolders are skipped)")
    return found


def _object_files(source: str) -> list[InputFile]:
    """`input_files` of an `s3://` object, or of the objects directly under an `s3://` prefix (one listing of
    that level alone: "subfolders" are not entered), hidden names skipped, in byte order of their names."""
    import pyarrow.fs as pafs

    where, found = _object_info(source)
    if found.type == pafs.FileType.File:
        return [InputFile(where.uri, source, 0, found.size, found.mtime_ns)]
    if found.type == pafs.FileType.NotFound:
        raise BadInputError(f"cannot read {source}: no such object or prefix on the store")
    selector = pafs.FileSelector(where.base, recursive=False, allow_not_found=True)
    with store_errors(where, "list", ""):
        entries = where.filesystem().get_file_info(selector)
    files = []
    for entry in sorted(entries, key=lambda e: e.base_name.encode()):
        if entry.type != pafs.FileType.File or entry.base_name.startswith("."):
            continue
        uri = f"{where.uri}/{entry.base_name}"
        if uri_problem(uri) is not None:  # the allow-list every key iox-batch names keeps to
            raise BadInputError(f"{source} holds {entry.base_name[:80]!r}, whose name is not one a bulk load reads "
                                "(letters, digits and `._=+-`): rename the object or load the others by name")
        files.append(InputFile(uri, f"{source.rstrip('/')}/{entry.base_name}", 0, entry.size, entry.mtime_ns))
    return _some(files, source)


@dataclass(frozen=True)
class Range:
    """Bytes `[start, end)` of one input file; `start` is 0 or just after a LF."""

    file_index: int
    range_index: int
    path: str
    name: str
    start: int
    end: int
    pin: tuple[int, int, int]
    """The file's (inode, size, mtime) when listed (`InputFile`): the task opens only that file."""


def plan_ranges(files: Sequence[InputFile], target: int) -> list[Range]:
    """Each file cut into ranges of about `target` bytes, each cut just after the first LF at or past the
    target offset (so a range is whole lines; a file without LF past a cut stays one range)."""
    ranges: list[Range] = []
    for fi, file in enumerate(files):
        path, size, pin = file.path, file.size, (file.ino, file.size, file.mtime_ns)
        start, ri = 0, 0
        with read_errors(path), open_input(path, pin) as f:
            while True:
                cut = size
                probe = start + target
                while probe < size:
                    f.seek(probe)
                    buf = f.read(64 * 1024)
                    lf = buf.find(b"\n")
                    if lf >= 0:
                        cut = probe + lf + 1
                        break
                    probe += len(buf)
                ranges.append(Range(fi, ri, path, file.name, start, cut, pin))
                if cut >= size:
                    break
                start, ri = cut, ri + 1
    return ranges


class _Bounded:
    """A binary stream over bytes `[start, end)` of an open file."""

    def __init__(self, f: BinaryIO, left: int) -> None:
        self.f = f
        self.left = left

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        n = self.left if n < 0 else min(n, self.left)
        data = self.f.read(n)
        self.left -= len(data)
        return data


# --- the task -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StagedChunk:
    """One ingester chunk a task wrote into the load's staging folder (`file`, relative to it)."""

    table: str
    partition: str
    columns: tuple[tuple[str, str], ...]
    rows: int
    min_time: int
    max_time: int
    tag_ranges: dict[str, tuple[str, str]]
    file: str
    size: int


@dataclass(frozen=True)
class RangeResult:
    file_index: int
    range_index: int
    chunks: tuple[StagedChunk, ...] = ()
    points: int = 0
    cpu_seconds: float = 0.0
    """The task's own CPU time (its worker process's, while parsing and writing): the per-core cost."""
    problem: str | None = None
    """Why the parallel result cannot stand (a bad line, ...): the driver redoes the load the plain way."""


@dataclass(frozen=True)
class TaskParams:
    precision: str
    default_time: int
    limits: dict[str, int]
    staging: str
    """Where the tasks write their chunks: the local staging folder's path, or on an object store the URI of the
    load's folder (`storage.bulk_load_folder`), whose keys the chunks keep. Never a credential: each task builds
    its filesystem from its own environment."""
    max_partitions: int = 0
    """`IOX_WRITE_MAX_PARTITIONS` as the driver read it: a range touching more partitions than this writes no file
    (the driver refuses the load on its counts alone); 0: no bound here."""


def parse_range(r: Range, params: TaskParams) -> RangeResult:
    """Parse one range with the plain write's parser and write one chunk per (table, partition) into staging.
    Runs in a Spark Python worker: no catalog access, the limits and default time come from the driver."""
    cpu = time.process_time()
    parser = StreamParser(precision=Precision(params.precision), default_time=params.default_time,
                          limits=Limits(**params.limits))
    pending: dict[tuple[str, str], plain._Pending] = {}
    points = 0
    try:
        with read_errors(r.path), open_input(r.path, r.pin) as f:
            f.seek(r.start)
            # Only the first range starts where the file does: a byte order mark counts there alone.
            blocks = line_blocks(cast(BinaryIO, _Bounded(f, r.end - r.start)), r.name, start_of_input=r.start == 0)
            for parsed in plain.parse_blocks(blocks, parser):
                if parser.errors:
                    return RangeResult(r.file_index, r.range_index, problem="a bad line")
                for key, columns, table, first, last in _pieces(parsed):
                    points += table.num_rows
                    pending.setdefault(key, plain._Pending()).add(columns, table, first, last)
    except BadInputError as err:  # not UTF-8, too many bad lines: the plain write words it
        return RangeResult(r.file_index, r.range_index, problem=str(err)[:200])
    if params.max_partitions and len(pending) > params.max_partitions:
        # Over the load's partition limit on its own: what the driver needs to word the refusal, no file.
        return RangeResult(r.file_index, r.range_index, tuple(
            StagedChunk(key[0], key[1], tuple((c, t.value) for c, t in entry.columns().items()), entry.total, 0, 0,
                        {}, "", 0) for key, entry in sorted(pending.items())), points, time.process_time() - cpu)
    chunks = []
    staging = Root(params.staging)
    for n, key in enumerate(sorted(pending)):
        columns, data, _ = pending[key].take()
        if data.num_rows > MAX_WRITE_POSITION + 1:
            return RangeResult(r.file_index, r.range_index, problem="a range too large for one chunk")
        if staging.is_local:
            name = storage.bulk_staged_name(r.file_index, r.range_index, n)
            size = storage.write_parquet_atomic(data, staging.local_path / name, metadata={"iox.kind": "ingester"})
        else:  # put once under the key the chunk keeps
            name = storage.bulk_chunk_name()
            size = storage.put_parquet(staging, name, data, metadata={"iox.kind": "ingester"})
        mm = pc.min_max(data[TIME]).as_py()
        chunks.append(StagedChunk(key[0], key[1], tuple((c, t.value) for c, t in columns.items()), data.num_rows,
                                  mm["min"], mm["max"], chunk_files.tag_ranges(data, columns), name, size))
    return RangeResult(r.file_index, r.range_index, tuple(chunks), points, time.process_time() - cpu)


def _pieces(parsed: list[Piece] | list[Point]
            ) -> Iterator[tuple[tuple[str, str], dict[str, ColumnType], pa.Table, int, int]]:
    """A parsed block as (table, partition) groups in the plain write's Arrow layout."""
    if parsed and isinstance(parsed[0], Piece):
        for piece in parsed:
            yield (piece.measurement, piece.partition), piece.columns, piece.table, piece.first_line, piece.last_line
        return
    groups: dict[tuple[str, str], list[Point]] = defaultdict(list)
    for point in cast(list[Point], parsed):
        groups[(point.measurement, partition_of(point.time))].append(point)
    for key, group in groups.items():
        columns = chunk_files.chunk_columns(group)
        yield key, columns, chunk_files.points_to_table(group, columns), group[0].line, group[-1].line


RangeRunner = Callable[[Sequence[Range], TaskParams], list[RangeResult]]
"""Runs `parse_range` over every range (one Spark task each) and returns the results."""


def local_runner(ranges: Sequence[Range], params: TaskParams) -> list[RangeResult]:
    """The ranges parsed one after another in this process (tests of the driver without Spark)."""
    return [parse_range(r, params) for r in ranges]


# --- the driver ---------------------------------------------------------------------------------------------------


class _PlainWay(Exception):
    """The parallel result cannot stand: redo the load as plain writes."""


@dataclass(frozen=True)
class _Lock:
    """The load's advisory lock as held: the connection whose session holds it and that session's backend."""

    conn: sa.Connection
    session: int
    key: int

    def still_held(self) -> bool:
        """Whether the lock's session is still the one serving `conn` and still holds the lock (a dropped
        connection that reconnected has another session, without it)."""
        return locks.still_held(self.conn, self.session, self.key)


@contextlib.contextmanager
def _load_lock(catalog: Catalog, load_id: str) -> Iterator[_Lock]:
    """Hold the load's advisory lock (a session lock on a connection of its own) while the load runs: a sweep
    that can take it knows the load's driver is gone."""
    key = locks.bulk_load_key(load_id)
    with catalog.engine.connect() as conn:
        locks.lock(conn, key)
        session = locks.backend_pid(conn)
        conn.commit()
        try:
            yield _Lock(conn, session, key)
        finally:
            with contextlib.suppress(Exception):
                locks.unlock(conn, key)
                conn.commit()


def bulk_write(
    catalog: Catalog,
    db: str,
    source: str,
    runner: RangeRunner,
    *,
    precision: Precision = Precision.NS,
    accept_partial: bool = False,
    progress: Callable[[str], None] = lambda line: None,
    target_bytes: int | None = None,
    min_ranges: int = 1,
    warehouse: Root | Path | None = None,
    input_root: Path | None = None,
) -> plain.WriteResult:
    """`iox-batch write --spark`: see the module docstring. `min_ranges` (the cluster's parallelism): ranges are
    made smaller than `IOX_BULK_RANGE_BYTES` when that gives every core a range. `input_root`: the folder the
    input must lie in (a triggered load's IOX_BULK_LOAD_ROOT), checked again here on what is actually opened."""
    check_db_name(db)
    precision = Precision(precision)
    root = storage.warehouse_of(warehouse)
    paths = input_files(source, input_root)
    size = sum(p.size for p in paths)
    ranges = plan_ranges(paths, max(1, min(target_bytes or range_bytes(), -(-size // max(1, min_ranges)))))
    total = sum(r.end - r.start for r in ranges)
    default_time = now_ns()
    progress(f"bulk load into {db}: {len(paths)} file(s), {total:,} bytes, {len(ranges)} range(s)")
    load_id = storage.new_load_id()
    staging = _Staging(root, load_id)
    with _load_lock(catalog, load_id) as lock:
        try:
            staging.make()
            params = TaskParams(precision.value, default_time, asdict(Limits.from_env()), staging.root.uri,
                                CatalogLimits.from_env().max_partitions)
            started = time.monotonic()
            results = sorted(runner(ranges, params), key=lambda x: (x.file_index, x.range_index))
            kill_point("bulk.after_tasks")
            problem = _why_plain(results, len(paths))
            if problem is None:
                progress(f"parsed {sum(x.points for x in results):,} lines in {len(ranges)} task(s) in "
                         f"{time.monotonic() - started:.1f} s ({sum(x.cpu_seconds for x in results):.1f} task "
                         "CPU-seconds)")
                try:
                    return _register(catalog, lock, db, results, staging, progress)
                except _PlainWay as why:
                    problem = str(why)
        finally:
            staging.clean()
    progress(f"redoing the load as plain writes, serially ({problem}): the plain write's result and errors")
    return _plain_load(catalog, db, paths, precision, default_time, accept_partial, root)


def _why_plain(results: Sequence[RangeResult], files: int) -> str | None:
    for x in results:
        if x.problem is not None:
            return x.problem
    per_file: dict[int, int] = defaultdict(int)
    for x in results:
        per_file[x.file_index] += x.points
    if any(per_file[i] == 0 for i in range(files)):
        return "a file with no point"
    seen: dict[tuple[str, str], str] = {}
    for x in results:
        for c in x.chunks:
            for name, ctype in c.columns:
                if seen.setdefault((c.table, name), ctype) != ctype:
                    return f"{c.table}.{name} has two types"
    return None


_LOST = ("the catalog session holding the bulk load's lock was lost while its tasks ran, so a sweep may have "
         "removed its staged chunks; nothing was registered. Run the load again")


class _Staging:
    """Where a load's tasks write, and its clean-up. A local warehouse: the staging folder `_bulk/<load id>/`,
    removed whole when the load ends (its registered files were moved out of it). An object store: the load's
    folder `_loads/<load id>/`, whose keys the registered chunks keep; when the load ends every object there that no
    row of it names is deleted (all of them when it registered nothing; a retried task's first attempt's when it
    did). Not after a COMMIT that failed: it may have committed, and a key a committed row names must stay."""

    def __init__(self, warehouse: Root, load_id: str) -> None:
        self.warehouse = warehouse
        self.rel = storage.bulk_load_folder(load_id) if not warehouse.is_local else ""
        self.root = (warehouse.child(self.rel) if self.rel
                     else local_root(storage.bulk_staging(warehouse.local_path, load_id)))
        self.registered: set[str] | None = set()
        """The keys the load's COMMIT made chunks of (relative to the warehouse); None: unknown (the COMMIT
        failed), so nothing may be deleted."""

    def make(self) -> None:
        if self.warehouse.is_local:
            for _ in range(3):  # another load may remove an empty `_bulk` between the two mkdirs
                with contextlib.suppress(FileNotFoundError):
                    self.root.local_path.mkdir(parents=True)
                    break

    def chunk_path(self, c: StagedChunk) -> str:
        """The key a chunk a task put on the store keeps."""
        return f"{self.rel}/{c.file}"

    def clean(self) -> None:
        if self.warehouse.is_local:
            shutil.rmtree(self.root.local_path, ignore_errors=True)
            with contextlib.suppress(OSError):
                self.root.local_path.parent.rmdir()  # only if no other load is staging
            return
        if self.registered is None:
            return
        with contextlib.suppress(Exception):  # a store gone away keeps the orphans: the sweep takes them later
            for obj in list(self.warehouse.list(self.rel)):
                if obj.rel not in self.registered:
                    self.warehouse.delete(obj.rel)


def _register(catalog: Catalog, lock: _Lock, db: str, results: Sequence[RangeResult], staging: _Staging,
              progress: Callable[[str], None]) -> plain.WriteResult:
    """Register the staged chunks in one transaction on the lock's own session, once it is known to still hold
    the lock: a session that dies before the COMMIT commits nothing, so the check holds until then."""
    chunks = [c for x in results for c in x.chunks]
    root = staging.warehouse
    staged = storage.Staged(root)
    written: list[plain.WrittenChunk] = []
    with staged.transaction(catalog, lock.conn) as conn:
        # First thing in the transaction: from here on the session's death voids the COMMIT.
        try:
            held = lock.still_held()
        except sa.exc.DBAPIError as err:
            if not err.connection_invalidated:
                raise
            held = False
        if not held:
            raise CatalogUnavailableError(_LOST)
        db_id = catalog.ensure_database(conn, db)
        locks.lock_orders(conn, db_id)
        # The catalog limits, under the order lock, before anything is moved into place or registered.
        guard = WriteGuard(catalog, conn, db, db_id)
        guard.prefetch({c.table for c in chunks})
        for c in chunks:
            current = guard.columns(c.table)
            if any(name in current and current[name].value != ctype for name, ctype in c.columns):
                raise _PlainWay(f"{c.table} conflicts with the catalog's columns")
        for c in chunks:
            guard.admit(c.table, [name for name, _ in c.columns], c.partition)
        guard.refuse()
        if any(not c.file for c in chunks):  # a task saw more partitions than the limit the guard just allowed
            raise CatalogError("a bulk load task and its driver read different IOX_WRITE_MAX_PARTITIONS; nothing "
                               "was loaded: run it again")
        # Input order: a later range or file of the same partition gets a higher order, as in a plain write.
        orders = catalog.next_orders(conn, db_id, len(chunks)) if chunks else []
        table_ids = catalog.ensure_tables(conn, db_id, [c.table for c in chunks])
        wanted: dict[int, dict[str, ColumnType]] = defaultdict(dict)
        for c in chunks:
            wanted[table_ids[c.table]].update((name, ColumnType(ctype)) for name, ctype in c.columns)
        catalog.add_columns_of(conn, wanted)
        partition_ids = catalog.ensure_partitions(conn, [(table_ids[c.table], c.partition) for c in chunks])
        places = [(table_ids[c.table], partition_ids[(table_ids[c.table], c.partition)]) for c in chunks]
        if root.is_local:
            rels = _move_into_place(chunks, places, db_id, staging, staged)
        else:  # the chunks stay at the keys their tasks put: the rows name them, the COMMIT publishes them
            rels = [staging.chunk_path(c) for c in chunks]
            for rel in rels:
                staged.add(rel)  # removed if the transaction rolls back
        rows = []
        for c, order, rel, (table_id, partition_id) in zip(chunks, orders, rels, places):
            columns = {name: ColumnType(ctype) for name, ctype in c.columns}
            rows.append(dict(
                object_id=storage.object_id(rel), label=None, table_id=table_id, partition_id=partition_id,
                store=LOCAL_STORE, path=rel, min_time=c.min_time, max_time=c.max_time, row_count=c.rows,
                file_size=c.size, column_names=list(chunk_files.column_layout(columns)),
                tag_ranges={k: list(v) for k, v in c.tag_ranges.items()}, chunk_order=order))
        ids = catalog.insert_chunks(conn, ChunkKind.INGESTER, rows)
        for c, order, chunk_id in zip(chunks, orders, ids):
            written.append(plain.WrittenChunk(f"I{chunk_id}", c.table, c.partition, c.rows, order, c.min_time,
                                              c.max_time))
        record_writes(conn, db_id, [w.event() for w in written], orders=[w.order for w in written], source="write")
        kill_point("bulk.before_commit")
        staging.registered = None  # the COMMIT follows: if it fails, it may have committed
    staging.registered = set(staged.rels)
    progress(f"registered {len(written)} chunk(s), {sum(w.rows for w in written):,} rows, in one transaction")
    return plain.WriteResult(tuple(written))


def _move_into_place(chunks: Sequence[StagedChunk], places: Sequence[tuple[int, int]], db_id: int,
                     staging: _Staging, staged: storage.Staged) -> list[str]:
    """A local warehouse: each staged chunk renamed to its usual path `<db>/<table>/<partition>/<uuid>.parquet`,
    after the manifest naming them all (a sweep after a crash from then on knows which moved files were this
    load's)."""
    folder, root = staging.root.local_path, staging.warehouse.local_path
    rels = [storage.chunk_path(db_id, table_id, partition_id) for table_id, partition_id in places]
    (folder / storage.BULK_MANIFEST).write_text(json.dumps(rels))
    for c, rel in zip(chunks, rels):
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        staged.add(rel)
        os.replace(folder / c.file, dest)
    return rels


def _plain_load(catalog: Catalog, db: str, paths: Sequence[InputFile], precision: Precision, default_time: int,
                accept_partial: bool, root: Root) -> plain.WriteResult:
    """The load as plain streamed writes of each file in order, in one transaction (all or nothing)."""
    staged = storage.Staged(root)
    chunks: list[plain.WrittenChunk] = []
    rejected: list[LineError] = []
    limit = plain.write_chunk_rows()
    shape = WriteShape()  # the files are one write for the catalog limits
    with staged.transaction(catalog) as conn:
        for file in paths:
            parser = StreamParser(precision=precision, default_time=default_time)
            with read_errors(file.path), open_input(file.path, (file.ino, file.size, file.mtime_ns)) as f:
                result = plain._write_blocks(catalog, conn, staged, db, line_blocks(f, file.name), parser,
                                             accept_partial, file.name, limit, shape)
            chunks.extend(result.chunks)
            rejected.extend(result.rejected)
        kill_point("write.before_commit")
    return plain.WriteResult(tuple(chunks), tuple(rejected))
