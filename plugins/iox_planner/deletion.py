"""Deleting many files under a root (`objectstore.Root`): the sweeps' garbage and a dropped database's files. A
local folder's go one unlink after another; a store's a few requests at a time, since a store answers each in a
round trip and one after another a sweep of thousands of objects would take minutes."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from iox_planner.objectstore import Root

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
            root.delete(rel)
        return
    with ThreadPoolExecutor(max_workers=min(STORE_DELETERS, len(rels))) as pool:
        list(pool.map(root.delete, rels))


def delete_folder(root: Root, rel: str) -> None:
    """Every file under the folder `rel`: a local folder removed whole, a store's objects under the prefix one by
    one (a store has no folders to remove)."""
    if root.is_local:
        shutil.rmtree(root.local_path / rel, ignore_errors=True)
        return
    delete_files(root, [item.rel for item in root.list(rel)])
