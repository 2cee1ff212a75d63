"""The catalog's migrations: numbered, append-only SQL files in `catalog_sql/`, checked to form one linear
history. `Catalog.migrate` applies them under an advisory lock and records each one's checksum, so an edited
shipped migration is refused."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from iox_planner.config import project_root
from iox_planner.errors import CatalogError

MIGRATION_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def migration_files(folder: Path | None = None) -> list[Migration]:
    """The numbered migrations, checked to form one linear history: 0001, 0002, ... with no gap or twin."""
    folder = folder or project_root() / "catalog_sql"
    found: list[Migration] = []
    for path in sorted(folder.glob("*.sql")):
        match = MIGRATION_FILE.fullmatch(path.name)
        if not match:
            raise CatalogError(f"catalog migration {path.name} is not named NNNN_lowercase_name.sql")
        found.append(Migration(int(match[1]), match[2], path.read_text()))
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise CatalogError(
                f"catalog migrations do not form one linear history: expected version {expected:04d}, "
                f"found {migration.version:04d}_{migration.name}.sql"
            )
    return found
