"""The ledger of publications: where each publication (a local path or a key on a store) is recorded just before it
happens, and what was recorded there before. The catalog's (`catalog/publications.py`) unless a block names its
own (`publishing_as`: an Airflow run's commit passes its catalog connection's)."""

from __future__ import annotations

import contextlib
import contextvars
import os
from pathlib import Path
from typing import Any, Iterator

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


def ledger() -> Any:
    """Where publications are recorded: the block's (`publishing_as`), else the catalog's."""
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


def recent_publications(target: Path | str) -> list[Any]:
    """The two newest records of `target` (a path, or an `s3://` URI), newest first."""
    books = ledger()
    if hasattr(books, "recent"):
        return list(books.recent(target, 2))
    latest = books.latest(target)
    return [] if latest is None else [latest]


def publication(target: str, kind: str, fp: str) -> Any:
    """The record of a publication at `target` (a resolved path or an `s3://` URI) by this run."""
    from iox_planner.catalog.publications import Publication

    return Publication(target, kind, fp, _run_label())
