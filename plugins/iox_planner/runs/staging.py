"""A run's identity and its staging folder: where the plan step, the Spark jobs and the commit step hand files to
each other.

A run owns a staging folder beside its output (same filesystem, so publishing is a rename):
`<output parent>/.<output name>.iox-run-<hash of dag id and run id>/` holding `plan.json`, the Spark result
(`result.<format>`, or `result.arrow` when the commit step converts it), `metrics.json` (written by the Spark job
last, on success only), and, when fanned out, `part-<k>.json` plans and `parts/<k>/`. The plan step recreates it;
the commit step removes it whatever the outcome.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from iox_planner.errors import BadInputError
from iox_planner.output import Destination, OutputFormat

if TYPE_CHECKING:
    from iox_planner.output.publish import PinnedFolder


@dataclass(frozen=True)
class RunIdentity:
    dag_id: str
    run_id: str

    @property
    def holder(self) -> str:
        return f"{self.dag_id}/{self.run_id}"


@dataclass(frozen=True)
class Staging:
    root: Path

    @staticmethod
    def for_run(output: Destination, run: RunIdentity) -> Staging:
        digest = hashlib.sha1(f"{run.dag_id}\0{run.run_id}".encode()).hexdigest()[:16]
        anchor = staging_anchor(output)
        return Staging(anchor.parent / f".{anchor.name}.iox-run-{digest}")

    @property
    def plan_file(self) -> Path:
        return self.root / "plan.json"

    @property
    def reads(self) -> Path:
        return self.root / "reads.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.json"

    @property
    def parts(self) -> Path:
        return self.root / "parts"

    def result(self, fmt: OutputFormat) -> Path:
        """Where the Spark job writes the result in `fmt`: a folder `result` (Parquet) or a file `result.<fmt>`."""
        kind = OutputFormat(fmt)
        return self.root / ("result" if kind.is_folder else f"result.{kind.value}")

    def part_plan(self, k: int) -> Path:
        return self.root / f"part-{k}.json"

    def part_metrics(self, k: int) -> Path:
        return self.root / f"part-{k}.metrics.json"

    def reset(self) -> None:
        self.remove()
        self.root.mkdir(parents=True)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def errors(self) -> list[str]:
        """What failed Spark jobs reported (their operator leaves `<metrics>.error` files)."""
        if not self.root.is_dir():
            return []
        return [p.read_text().strip() for p in sorted(self.root.glob("*.error")) if p.read_text().strip()]


_STAGING_NAME = re.compile(r"\.iox-run-[0-9a-f]{16}")


def staging_anchor(output: Destination) -> Path:
    """The local path a run's staging folder goes beside: the output itself, or for a key on a store (which has
    no folder to stage in) `output/.store-runs/<hash of the key>/result` in the project (its `output/` is the one
    folder of the project outputs may use), one folder per key, so the dead stagings of one output are still
    found beside it."""
    if isinstance(output, Path):
        return output
    from iox_planner.config import project_root

    digest = hashlib.sha1(output.uri.encode()).hexdigest()[:16]
    return project_root() / "output" / ".store-runs" / digest / "result"


def remove_dead_stagings(output: Destination, ours: Staging) -> list[str]:
    """Other runs' staging folders beside `output`, removed. Called holding the output's run lock: a run writes
    its staging only while it holds that lock, and ours was free (or expired), so every other staging folder is a
    dead run's (a commit task killed, say) and nobody else would ever remove it."""
    anchor = staging_anchor(output)
    prefix = f".{anchor.name}"
    removed = []
    for entry in anchor.parent.iterdir():
        rest = entry.name[len(prefix):]
        if (entry.name.startswith(prefix) and _STAGING_NAME.fullmatch(rest) and entry != ours.root
                and entry.is_dir() and not entry.is_symlink()):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
    return removed


class RunFiles:
    """The run's staging folder, opened through the held output folder (never by its name from `/`), and the
    files the plan step and the Spark job left in it."""

    def __init__(self, folder: PinnedFolder, staging: Staging) -> None:
        self.folder, self.staging, self.name, self.where = folder, staging, staging.root.name, staging.root
        try:
            self.fd = folder.open_folder(self.name)
        except OSError:
            raise BadInputError(f"the Spark job left no result in {staging.root}; it did not finish") from None

    def open(self, name: str) -> int:
        """A descriptor of the file `name` in it (not a link), or a BadInputError naming what is missing."""
        try:
            return os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.fd)
        except OSError:
            raise BadInputError(f"the run's {name} is missing from {self.where}; the Spark job did not finish "
                                "writing it") from None

    def open_folder(self, name: str) -> int:
        """A descriptor of the folder `name` in it (not a link), or a BadInputError naming what is missing."""
        try:
            return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self.fd)
        except OSError:
            raise BadInputError(f"the run's {name} is missing from {self.where}; the Spark job did not finish "
                                "writing it") from None

    def read_text(self, name: str) -> str:
        with os.fdopen(self.open(name), encoding="utf-8") as fh:
            return fh.read()

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def remove(self) -> None:
        """Remove the folder, if its name in the held folder still is this folder."""
        found, held = self.folder.lstat(self.name), os.fstat(self.fd)
        if found is not None and (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino):
            shutil.rmtree(self.name, ignore_errors=True, dir_fd=self.folder.fd)

    def close(self) -> None:
        os.close(self.fd)
