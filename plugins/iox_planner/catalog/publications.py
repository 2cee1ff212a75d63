"""The catalog's record of what each publication wrote (`iox_output_publication`): the proof, which a query's
own output cannot forge, that the thing at an output path is iox-batch's and may be replaced."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from iox_planner.catalog.schema import output_publications
from iox_planner.catalog.store import Catalog


@dataclass(frozen=True)
class Publication:
    path: str
    kind: str
    """'file' or 'folder'"""
    fingerprint: str
    run: str


class CatalogLedger:
    """Publications recorded in the catalog (one connection per call: publishing is rare and short)."""

    def __init__(self, catalog: Catalog | None = None) -> None:
        self._catalog = catalog

    def _engine(self) -> Any:
        if self._catalog is None:
            self._catalog = Catalog()
            self._catalog.require_schema()
        return self._catalog.engine

    def latest(self, path: Path | str) -> Publication | None:
        """The newest record of `path` (a resolved, absolute path, or an `s3://` URI), if any."""
        t = output_publications
        with self._engine().connect() as conn:
            row = conn.execute(sa.select(t.c.path, t.c.kind, t.c.fingerprint, t.c.run)
                               .where(t.c.path == str(path)).order_by(t.c.id.desc()).limit(1)).first()
        return None if row is None else Publication(row.path, row.kind, row.fingerprint, row.run)

    def recent(self, path: Path | str, count: int) -> list[Publication]:
        """The `count` newest records of `path`, newest first."""
        t = output_publications
        with self._engine().connect() as conn:
            rows = conn.execute(sa.select(t.c.path, t.c.kind, t.c.fingerprint, t.c.run)
                                .where(t.c.path == str(path)).order_by(t.c.id.desc()).limit(count)).all()
        return [Publication(r.path, r.kind, r.fingerprint, r.run) for r in rows]

    def record(self, publication: Publication) -> int:
        """Record a publication about to happen; returns the record's id, for `withdraw`."""
        with self._engine().begin() as conn:
            return int(conn.execute(output_publications.insert().values(
                path=publication.path, kind=publication.kind, fingerprint=publication.fingerprint,
                run=publication.run, published_at=sa.func.now()).returning(output_publications.c.id)).scalar_one())

    def withdraw(self, record: int) -> None:
        """Take back a record whose publication did not happen (its rename failed or was refused)."""
        with self._engine().begin() as conn:
            conn.execute(output_publications.delete().where(output_publications.c.id == record))
