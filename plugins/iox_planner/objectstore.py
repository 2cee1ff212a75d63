"""Where files live: a local folder or a prefix of an S3-compatible bucket, behind one small interface over
pyarrow's filesystems (`Root`). The warehouse and the output roots are each a `Root`; every other module names a
file by its path relative to one (`<db id>/<table id>/<partition id>/<uuid>.parquet`).

Object storage has no rename, so nothing here renames to publish: a file is put once under a fresh name, whole,
and a catalog transaction is what makes it visible (IOx's way). On a local folder a put is still written aside and
renamed into place, so a crash never leaves a torn file under its final name.

Credentials, region and endpoint come from the standard AWS settings alone (`AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_PROFILE`, the default credential chain; `AWS_REGION` or
`AWS_DEFAULT_REGION`; `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`). They are never put in a URI, a plan, a job's
argv or the catalog: each process builds its own filesystem from its own environment. A bucket is the user's:
pyarrow's bucket creation and deletion stay off.
"""

from __future__ import annotations

import functools
import io
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Literal
from urllib.parse import urlsplit

from iox_planner.errors import BadInputError, StoreUnavailableError

if TYPE_CHECKING:  # pyarrow costs about 0.2 s to import: only a command that touches files pays it
    import pyarrow as pa
    import pyarrow.fs as pafs

S3 = "s3://"
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
"""An S3 bucket name (the rules every S3-compatible store takes: 3-63 lower-case letters, digits, dots, dashes)."""
_KEY_PART = re.compile(r"[A-Za-z0-9._=+-]+")
"""One segment of a prefix: a conservative allow-list, so a prefix never needs quoting in a URI, a log or a key."""
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def is_uri(text: str) -> bool:
    """Whether `text` names a location by URL (`s3://...`, `gs://...`, `file:...`) rather than a path."""
    return bool(_SCHEME.match(text)) or "://" in text


_CARRIES_CREDENTIALS = ("it carries credentials: a URI is shown in logs, plans and run records, so credentials come "
                        "from the standard AWS settings (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or "
                        "the default credential chain) and never from the URI")


def uri_problem(text: str) -> str | None:
    """Why `text` is not an `s3://BUCKET/PREFIX` this product takes, or None."""
    if text.startswith("s3:") and not text.startswith(S3):
        return "an S3 location is written s3://BUCKET/PREFIX"
    if not text.startswith(S3):
        scheme = text.split(":", 1)[0]
        return (f"`{scheme[:16]}:` is not a store iox-batch reads: give an absolute local folder or "
                "s3://BUCKET/PREFIX on an S3-compatible store (endpoint, region and credentials from the standard "
                "AWS_* settings)")
    # Before anything reads the authority: `s3://KEY:SE/CRET@bucket` has its `@` past the first `/`, and urlsplit
    # would take `KEY:SE` for a host and port (and fail on the port).
    if "@" in text:
        return _CARRIES_CREDENTIALS
    parts = urlsplit(text)
    if parts.query or parts.fragment or "?" in text or "#" in text:
        return "it has a query or a fragment (`?`, `#`): give s3://BUCKET/PREFIX alone"
    if ":" in parts.netloc:
        return "it names a port: the endpoint comes from AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3), not the URI"
    if not _BUCKET.fullmatch(parts.netloc) or ".." in parts.netloc:
        return f"{parts.netloc[:70]!r} is not an S3 bucket name (3-63 of a-z, 0-9, `.`, `-`)"
    prefix = parts.path.strip("/")
    if parts.path.endswith("//") or "//" in parts.path:
        return "its prefix has an empty segment (`//`)"
    for segment in prefix.split("/") if prefix else ():
        if segment in (".", "..") or not _KEY_PART.fullmatch(segment):
            return (f"its prefix segment {segment[:40]!r} is not allowed: segments of A-Z, a-z, 0-9 and `._=+-`, "
                    "never `.` or `..`")
    if len(prefix) > 512:
        return "its prefix is longer than 512 characters"
    return None


@dataclass(frozen=True)
class ObjectInfo:
    """One file under a root: its path relative to the root, its size and when it was last written (seconds since
    the epoch, the store's clock)."""

    rel: str
    size: int
    mtime: float


@dataclass(frozen=True)
class Root:
    """A folder files live under: `/abs/path` or `s3://bucket/prefix`, canonical (no trailing slash). A value: it
    crosses process boundaries as its `uri` text (`parse_root` on the other side), never with a credential."""

    uri: str

    @property
    def is_local(self) -> bool:
        return not self.uri.startswith(S3)

    @property
    def local_path(self) -> Path:
        """The folder on this machine; only for a local root (a bug otherwise)."""
        assert self.is_local, self.uri
        return Path(self.uri)

    @property
    def base(self) -> str:
        """The root in the filesystem's own path form: `/abs/path`, or `bucket/prefix`."""
        return self.uri if self.is_local else self.uri[len(S3):]

    @property
    def bucket(self) -> str:
        assert not self.is_local, self.uri
        return self.base.split("/", 1)[0]

    def filesystem(self) -> "pafs.FileSystem":
        """This process's filesystem for the root (built once per process from its own environment)."""
        return _local_fs() if self.is_local else _s3_fs(_endpoint(), _region())

    def path(self, rel: str) -> str:
        """`rel`'s path in the filesystem's form (what pyarrow's readers take with `filesystem()`)."""
        _check_rel(rel)
        return f"{self.base}/{rel}" if rel else self.base

    def uri_of(self, rel: str) -> str:
        """`rel` as a full URI (`s3://...`) or absolute path: for messages and reports, never carrying a secret."""
        return self.path(rel) if self.is_local else f"{S3}{self.path(rel)}"

    def child(self, rel: str) -> "Root":
        """The root of a folder under this one."""
        return Root(self.uri_of(rel))

    # --- writing -------------------------------------------------------------------------------------------------

    def put_bytes(self, data: bytes, rel: str, *, fsync: bool = True) -> int:
        """`data` as the whole file `rel`, put once: on a store one request (a reader sees all of it or nothing),
        locally written aside, synced (unless `fsync=False`: the caller syncs) and renamed into place."""
        if self.is_local:
            target = Path(self.path(rel))
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
            try:
                with open(tmp, "wb") as fh:
                    fh.write(data)
                    if fsync:
                        fh.flush()
                        os.fsync(fh.fileno())
                os.replace(tmp, target)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            return len(data)
        with store_errors(self, "write", rel):
            # Buffered whole and handed over in one write: pyarrow's S3 stream then makes one PUT (or, past its
            # part size, a multipart upload a killed writer leaves incomplete, which the store never shows).
            with self.filesystem().open_output_stream(self.path(rel), metadata={}) as out:
                out.write(data)
        return len(data)

    def put_parquet(self, table: "pa.Table", rel: str, *, fsync: bool = True, **options: object) -> int:
        """`table` as the Parquet file `rel` (`options` go to `pq.ParquetWriter`), put once; its size."""
        import pyarrow.parquet as pq

        sink = io.BytesIO()
        with pq.ParquetWriter(sink, table.schema, **options) as writer:
            writer.write_table(table)
        return self.put_bytes(sink.getvalue(), rel, fsync=fsync)

    def delete(self, rel: str) -> bool:
        """Remove the file `rel`; False if it was not there. Never a folder, never a bucket."""
        if self.is_local:
            try:
                Path(self.path(rel)).unlink()
            except FileNotFoundError:
                return False
            return True
        import pyarrow.fs as pafs

        with store_errors(self, "delete", rel):
            fs = self.filesystem()
            if fs.get_file_info(self.path(rel)).type == pafs.FileType.NotFound:
                return False
            fs.delete_file(self.path(rel))
        return True

    # --- reading -------------------------------------------------------------------------------------------------

    def read_bytes(self, rel: str) -> bytes:
        if self.is_local:
            return Path(self.path(rel)).read_bytes()
        with store_errors(self, "read", rel):
            with self.filesystem().open_input_stream(self.path(rel)) as fh:
                return bytes(fh.read())

    def info(self, rel: str) -> ObjectInfo | None:
        """The file `rel`, or None if there is none."""
        import pyarrow.fs as pafs

        with store_errors(self, "look up", rel):
            found = self.filesystem().get_file_info(self.path(rel))
        if found.type != pafs.FileType.File:
            return None
        return ObjectInfo(rel, found.size or 0, found.mtime.timestamp() if found.mtime else 0.0)

    def exists(self, rel: str) -> bool:
        return self.info(rel) is not None

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every file under `prefix` (a folder path relative to the root, "" for all), recursively, as paths
        relative to the root. A store is listed page by page (1000 keys a request), so this costs requests in
        proportion to what lies under the prefix: sweeps list, queries never do."""
        import pyarrow.fs as pafs

        base = self.path(prefix) if prefix else self.base
        selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        with store_errors(self, "list", prefix):
            found = self.filesystem().get_file_info(selector)
        cut = len(self.base) + 1
        for item in found:
            if item.type == pafs.FileType.File:
                yield ObjectInfo(item.path[cut:], item.size or 0, item.mtime.timestamp() if item.mtime else 0.0)


def _check_rel(rel: str) -> None:
    """A relative path this code built: no leading `/`, no `.`/`..` segment (a bug otherwise: user text never
    reaches here unchecked)."""
    if rel.startswith("/") or any(part in (".", "..") for part in rel.split("/")) or "\x00" in rel:
        raise ValueError(f"not a relative path under a root: {rel!r}")


_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]*@|(?<=^s3:)[^/@\s]*@")
"""A URL's user and password (`s3://key:secret@`), and a misspelt `s3:key:secret@` as a whole text."""
_URL_QUERY = re.compile(r"(://[^\s?#]*)[?#]\S*")


def hide_credentials(text: str) -> str:
    """`text` (a message naming what a user gave) with every URL's user and password, query and fragment hidden:
    what a message may repeat of a location that might carry a credential."""
    return _URL_USERINFO.sub("<credentials hidden>@", _URL_QUERY.sub(r"\1?...", text))


def parse_root(text: str, *, what: str = "the location") -> Root:
    """`text` (an absolute local folder or `s3://BUCKET/PREFIX`) as a `Root`; BadInputError saying why not."""
    if is_uri(text):
        problem = uri_problem(text)
        if problem is not None:
            # A URI with an `@` may hold a secret anywhere before it: then it is not repeated, not even in part.
            shown = "(not shown: it holds `@`)" if "@" in text else repr(hide_credentials(text)[:120])
            raise BadInputError(f"{what} {shown} is refused: {problem}")
        bucket_and_prefix = text[len(S3):].strip("/")
        return Root(S3 + bucket_and_prefix)
    if not text.startswith("/"):
        raise BadInputError(f"{what} {text[:120]!r} is refused: give an absolute path or s3://BUCKET/PREFIX")
    return Root(str(Path(text).resolve()))


def local_root(path: Path) -> Root:
    return Root(str(path.resolve()))


# --- the filesystems ----------------------------------------------------------------------------------------------


def _first_set(*names: str) -> str | None:
    """The first of the standard AWS settings `names` (in the SDK's order of precedence) that is set, non-empty."""
    return next((os.environ[name] for name in names if os.environ.get(name)), None)


def _endpoint() -> str | None:
    return _first_set("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


def _region() -> str | None:
    return _first_set("AWS_REGION", "AWS_DEFAULT_REGION")


@functools.lru_cache(maxsize=1)
def _local_fs() -> "pafs.FileSystem":
    import pyarrow.fs as pafs

    return pafs.LocalFileSystem()


@functools.lru_cache(maxsize=4)
def _s3_fs(endpoint: str | None, region: str | None) -> "pafs.FileSystem":
    """pyarrow's S3 filesystem with the endpoint and region of the standard settings (pyarrow's AWS SDK reads the
    credentials itself: environment, profile, instance role). Keyed by endpoint and region, so a test that
    changes them gets a new one; credentials are never arguments, so a pickled filesystem carries none."""
    import pyarrow.fs as pafs

    # allow_delayed_open: an output stream opens nothing until it is written or closed, so an object smaller than
    # a part is ONE PutObject at close (measured: without it, even a 5-byte object is a create, a part and a
    # complete of a multipart upload); failures then surface at close, inside the same `store_errors` block.
    options: dict[str, object] = {"allow_bucket_creation": False, "allow_bucket_deletion": False,
                                  "check_directory_existence_before_creation": True, "allow_delayed_open": True}
    if region:
        options["region"] = region
    if endpoint:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadInputError(f"AWS_ENDPOINT_URL {endpoint[:80]!r} is not an http:// or https:// URL")
        if parts.username or parts.password or "@" in parts.netloc:
            raise BadInputError("AWS_ENDPOINT_URL carries credentials: give them in the AWS credential settings")
        options["endpoint_override"] = parts.netloc
        options["scheme"] = parts.scheme
        options["force_virtual_addressing"] = False
    return pafs.S3FileSystem(**options)


class store_errors:
    """Turn a store's failure (connection refused, timeout, 5xx, an access denied) into `StoreUnavailableError`,
    the retryable error (exit 75), naming the root and the file but never a credential; a missing file stays a
    `FileNotFoundError` for the caller to word."""

    def __init__(self, root: Root, doing: str, rel: str) -> None:
        self.root, self.doing, self.rel = root, doing, rel

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> Literal[False]:
        if exc is None or self.root.is_local or not isinstance(exc, OSError):
            return False
        if isinstance(exc, FileNotFoundError):
            return False
        where = self.root.uri_of(self.rel) if self.rel else self.root.uri
        if _not_found(str(exc)):
            # pyarrow reports a key deleted between its lookup and its GET as a plain OSError: a missing file
            # (the caller words it), not a store that went away.
            raise FileNotFoundError(f"{where} does not exist") from exc
        raise StoreUnavailableError(f"the object store did not answer ({self.doing} {where}): "
                                    f"{_first_line(str(exc))}; try again once it answers") from exc


_NOT_FOUND = ("RESOURCE_NOT_FOUND", "NoSuchKey")
"""How the AWS SDK under pyarrow says a GET found no key (a read opened with a known size skips the lookup that
would have raised FileNotFoundError); a missing bucket is `NoSuchBucket`, a different word."""


def _not_found(message: str) -> bool:
    return any(word in message for word in _NOT_FOUND)


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "no detail"
    return line[:300]
