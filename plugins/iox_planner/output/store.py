"""Publication on an object store (an output `s3://BUCKET/KEY` under an output root on a store), where nothing can
be renamed: a reader never sees a half-written result because

- a text result (csv, jsonl) is one object, written whole in one request (S3 shows all of it or nothing);
- a Parquet result (a folder) is a fresh prefix per publication, `KEY/<publication id>/part-*.parquet`, and the
  manifest `KEY/_iox_manifest.json`, written last in one request, names its files. Readers read the manifest,
  then the files it names. The files of the publication before stay until the next one, so a reader that read the
  previous manifest still finds its files for a whole publication's time; the next publication deletes them.

The catalog's publication record (catalog/publications.py) is the commit, as for a local output: recorded just
before the object (or manifest) is put, taken back when the put fails. What is at KEY is replaced only when it
matches one of the two newest records of KEY (a file: its sha256; a folder: its manifest's sha256, which names
every file of it). Objects a query's own output could plant are never "ours": a record is only written here.
S3 has no conditional put here, so a foreign writer racing a publication between its check and its put is not
caught; iox-batch's own runs of one output never race (a run holds the output's run lock)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator

from iox_planner.errors import BadInputError
from iox_planner.faults import kill_point
from iox_planner.objectstore import Root, parse_root, store_errors

MANIFEST = "_iox_manifest.json"
MANIFEST_FORMAT = "iox-batch parquet publication"
_PUBLICATION = re.compile(r"[0-9a-f]{32}")
_PART = re.compile(r"[0-9a-f]{32}/part-[0-9]{5,10}-[0-9a-f]{32}\.parquet")
"""A file of a publication: `<publication id>/part-<k>-<random>.parquet` (the only names iox-batch writes)."""
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.=+-]{0,199}")
"""Each name of a store output below its root: `objectstore`'s key allow-list, no leading dot, at most 200."""


def store_output_roots() -> list[Root]:
    """The output roots on a store (IOX_OUTPUT_ROOT, IOX_OUTPUT_ROOTS): where an `s3://` output may go."""
    from iox_planner import config

    roots = [config.OUTPUT_ROOT.read(), *config.OUTPUT_ROOTS.read()]
    return list(dict.fromkeys(r for r in roots if r is not None and not r.is_local))


def store_target(text: str, roots: list[Root] | None = None) -> Root:
    """`text`, an `s3://BUCKET/KEY` output, checked: a key this product writes (`objectstore.uri_problem`: no
    credentials, no port, no query, segments of an allow-list), strictly under an output root on a store (`roots`,
    default `store_output_roots()`), names without a leading dot, never the manifest's name, and neither inside the
    warehouse nor containing it."""
    target = parse_root(text, what="output")
    roots = store_output_roots() if roots is None else roots
    root = next((r for r in roots if target.uri.startswith(r.uri + "/")), None)
    if root is None:
        where = ", ".join(r.uri for r in roots) if roots else "none is configured"
        raise BadInputError(f"output {target.uri} lies under no output root on an object store ({where}); an "
                            "s3:// output goes under IOX_OUTPUT_ROOT or IOX_OUTPUT_ROOTS set to s3://BUCKET/PREFIX: "
                            "set one, or give a key under one")
    for name in target.uri[len(root.uri) + 1:].split("/"):
        if not _NAME.fullmatch(name) or name == MANIFEST:
            raise BadInputError(f"output {target.uri}: the name {name[:60]!r} is not allowed; names start with a "
                                "letter, digit or '_' and hold letters, digits and _ . = + - (at most 200)")
    from iox_planner.config import warehouse_root

    warehouse = warehouse_root()
    if not warehouse.is_local:
        inside = target.uri == warehouse.uri or target.uri.startswith(warehouse.uri + "/")
        if inside or warehouse.uri.startswith(target.uri + "/"):
            relation = "lies inside" if inside else "contains"
            raise BadInputError(f"output {target.uri} {relation} the warehouse (IOX_WAREHOUSE={warehouse.uri}), "
                                "where iox-batch never writes a result; choose a key outside it")
    return target


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_fingerprint(data: bytes) -> str:
    """A file's fingerprint, as `publish.fingerprint_at` words a local file's (so one record form serves both)."""
    return f"sha256:{len(data)}:{_sha(data)}"


def folder_fingerprint(manifest: bytes) -> str:
    """A published folder's fingerprint: its manifest's, which names every file (and the files' sizes)."""
    return f"manifest:sha256:{_sha(manifest)}"


def _vouch(target: Root, kind: str, fingerprint: str) -> None:
    """What is at `target` is one of iox-batch's two newest publications there, else the one paragraph."""
    from iox_planner.output.ledger import recent_publications

    records = [r for r in recent_publications(target.uri) if r.kind == kind]
    if not records:
        raise BadInputError(f"{target.uri} exists and was not written by iox-batch, so it is not replaced; remove it "
                            "or choose another key")
    # Recorded just BEFORE the put: a run killed between the two left the previous publication in place, so the
    # two newest records both vouch for what iox-batch put there.
    if fingerprint not in {r.fingerprint for r in records}:
        raise BadInputError(f"{target.uri} was written by iox-batch but changed since (by someone else), so it is "
                            "not replaced; remove it or choose another key")


def check_store_at(target: Root, *, folder: bool) -> dict[str, Any] | None:
    """`target` is free, or exactly what iox-batch published there; for a folder, its current manifest (None:
    nothing published yet). A few requests: one look-up, then the object's bytes or the folder's listing."""
    import pyarrow.fs as pafs

    fs = target.filesystem()
    with store_errors(target, "look up", ""):
        found = fs.get_file_info(target.base).type
    if found == pafs.FileType.NotFound:
        return None
    if found == pafs.FileType.File:
        if folder:
            raise BadInputError(f"cannot write a folder at {target.uri}: an object is there (iox-batch never deletes "
                                "what it did not write); remove it or choose another key")
        _vouch(target, "file", file_fingerprint(target.read_bytes("")))
        return None
    if not folder:
        raise BadInputError(f"cannot write a file at {target.uri}: objects lie under it (a folder); remove them or "
                            "choose another key")
    objects = list(target.list(""))
    strays = [o.rel for o in objects if o.rel != MANIFEST and not _PART.fullmatch(o.rel)]
    if strays:
        raise BadInputError(f"{target.uri} holds objects iox-batch did not publish ({strays[0][:80]!r}, ...), so it "
                            "is not replaced; remove them or choose another key")
    if not any(o.rel == MANIFEST for o in objects):
        # Only files of publications that died before their manifest (nothing a reader reads): free to publish.
        return None
    data = target.read_bytes(MANIFEST)
    _vouch(target, "folder", folder_fingerprint(data))
    manifest: dict[str, Any] = json.loads(data)
    return manifest


def check_store_destination(text: str, *, folder: bool) -> Root:
    """`store_target`, then `check_store_at`: the checked target."""
    target = store_target(text)
    check_store_at(target, folder=folder)
    return target


@contextlib.contextmanager
def _recorded(target: Root, kind: str, fingerprint: str) -> Iterator[None]:
    """The catalog's record of this publication around its put: recorded before, withdrawn if the put fails."""
    from iox_planner.output.ledger import ledger, publication

    books = ledger()
    record = books.record(publication(target.uri, kind, fingerprint))
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):  # a catalog gone meanwhile keeps a record that matches nothing
            books.withdraw(record)
        raise


def publish_file(target: Root, data: bytes) -> None:
    """`data` as the object `target`, in one request, if `target` is free or ours."""
    check_store_at(target, folder=False)
    with _recorded(target, "file", file_fingerprint(data)):
        kill_point("publish.store_before_put")
        target.put_bytes(data, "")


@dataclass
class StoreStage:
    """A Parquet publication in progress: its fresh prefix `<target>/<id>/`, the files written there so far, and
    the manifest it replaces (None: none)."""

    target: Root
    previous: dict[str, Any] | None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    files: list[dict[str, Any]] = field(default_factory=list)

    def part_rel(self, index: int) -> str:
        """A fresh name, relative to the target, for the part file `index` (random: a retried task writes anew)."""
        return f"{self.id}/part-{index:05d}-{uuid.uuid4().hex}.parquet"

    def add(self, rel: str, size: int, rows: int) -> None:
        """Count the written file `rel` in the publication."""
        if not _PART.fullmatch(rel) or not rel.startswith(f"{self.id}/"):
            raise ValueError(f"not a part of publication {self.id}: {rel!r}")
        self.files.append({"key": rel, "size": int(size), "rows": int(rows)})

    def put_table(self, table: Any, index: int = 0) -> None:
        """`table` as one part file of the publication."""
        rel = self.part_rel(index)
        self.add(rel, self.target.put_parquet(table, rel), table.num_rows)

    def manifest(self) -> bytes:
        previous = [f["key"] for f in (self.previous or {}).get("files", [])]
        return json.dumps({"format": MANIFEST_FORMAT, "version": 1, "publication": self.id,
                           "rows": sum(f["rows"] for f in self.files), "files": self.files,
                           "previous": previous}, indent=1, sort_keys=True).encode()

    def publish(self) -> None:
        """Put the manifest (last, one request) under the catalog's record; then delete the files of the
        publication before the previous one (the previous manifest named them as its own `previous`)."""
        if not self.files:
            raise BadInputError(f"the result for {self.target.uri} wrote no file")
        # What is there now is still what was checked (or ours again): the manifest it replaces is re-read.
        self.previous = check_store_at(self.target, folder=True)
        data = self.manifest()
        with _recorded(self.target, "folder", folder_fingerprint(data)):
            kill_point("publish.store_before_manifest")
            self.target.put_bytes(data, MANIFEST)
        kill_point("publish.store_after_manifest")
        older = {rel.split("/")[0] for rel in (self.previous or {}).get("previous", [])
                 if isinstance(rel, str) and _PART.fullmatch(rel)} - {self.id}
        for publication in sorted(older):
            # The whole prefix, in a listing and a batched delete: the files the manifest named and any a retried
            # task wrote there too. (pyarrow's S3 filesystem then leaves an empty `KEY/` marker: no reader's file.)
            with contextlib.suppress(Exception), store_errors(self.target, "delete", publication):
                self.target.filesystem().delete_dir(self.target.path(publication))

    def discard(self) -> None:
        """Best effort: remove the files of a publication that did not happen (a store gone keeps them; they lie
        under a prefix no manifest names, which no reader reads)."""
        for entry in self.files:
            with contextlib.suppress(Exception):
                self.target.delete(entry["key"])


@contextlib.contextmanager
def staged_folder(target: Root) -> Iterator[StoreStage]:
    """A Parquet publication at `target`: checked first, the block writes its parts (`StoreStage.put_table`, or
    writers that report theirs with `add`), published (manifest last) when the block succeeds, else discarded."""
    stage = StoreStage(target, check_store_at(target, folder=True))
    kill_point("publish.before_write")
    try:
        yield stage
        stage.publish()
    except BaseException:
        stage.discard()
        raise


def read_manifest(target: Root) -> dict[str, Any]:
    """The current manifest of the Parquet output `target` (what a reader reads first)."""
    manifest: dict[str, Any] = json.loads(target.read_bytes(MANIFEST))
    return manifest
