"""Deleting many files under a root (`objectstore.Root`): the sweeps' garbage and a dropped database's files. A
local folder's go one unlink after another; a store's a few requests at a time, since a store answers each in a
round trip and one after another a sweep of thousands of objects would take minutes; a whole prefix in batches
(pyarrow's `delete_dir`: one listing, one request per thousand keys).

pyarrow's S3 filesystem emulates folders: deleting an object puts an empty marker for its parent "folder"
(`<prefix>/`), so a partition whose files a sweep deleted keeps a zero-byte marker object; listings of files
(`Root.list`) never show it, and deleting the folder (`delete_folder`) takes it too."""

from __future__ import annotations

import contextlib
import shutil
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from iox_planner.objectstore import Root, store_errors

STORE_DELETERS = 8
"""Deletes kept in flight on a store."""


def delete_files(root: Root, rels: Sequence[str]) -> None:
    """Delete the files `rels` (relative to `root`); one already gone is fine. A store's failure raises
    `StoreUnavailableError` (the files not yet deleted stay, for the next sweep)."""
    if root.is_local:
        for rel in rels:
            (root.local_path / rel).unlink(missing_ok=True)
        return
    if len(rels) < 2:
        for rel in rels:
            _delete_object(root, rel)
        return
    with ThreadPoolExecutor(max_workers=min(STORE_DELETERS, len(rels))) as pool:
        list(pool.map(lambda rel: _delete_object(root, rel), rels))


def _delete_object(root: Root, rel: str) -> None:
    """One object, gone already being fine: pyarrow's `delete_file` looks it up itself, so not `Root.delete`,
    which looks it up first (a request more per object)."""
    with contextlib.suppress(FileNotFoundError), store_errors(root, "delete", rel):
        root.filesystem().delete_file(root.path(rel))


def delete_folder(root: Root, rel: str) -> None:
    """Every file under the folder `rel`, removed whole: a local folder, or every object under a store's prefix
    (its folder markers too)."""
    if root.is_local:
        shutil.rmtree(root.local_path / rel, ignore_errors=True)
        return
    with contextlib.suppress(FileNotFoundError), store_errors(root, "delete", rel):
        root.filesystem().delete_dir(root.path(rel))
