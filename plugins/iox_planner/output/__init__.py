"""Results at the edge: `formats.py` writes them (csv, jsonl, parquet, the terminal table), `publish.py` publishes
files and folders atomically, `terminal.py` renders text for terminals.

`OutputFormat` is the one list of formats, for the CLI, the runs and the Spark jobs alike. It lives here, with no
heavy import, because the DAG files read it at parse time (a materialized definition's `format`)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Union

from iox_planner.objectstore import Root, is_uri, parse_root


class OutputFormat(str, Enum):
    """`table` is for terminals only; `arrow` is the Arrow IPC file a Spark job hands back to the process that
    prints or converts it, never a user's choice; runs (triggered and materialized) write `RUN_FORMATS`."""

    TABLE = "table"
    CSV = "csv"
    JSONL = "jsonl"
    PARQUET = "parquet"
    ARROW = "arrow"

    @property
    def is_folder(self) -> bool:
        """Parquet is written as a folder (Spark's part files); every other format is one file."""
        return self is OutputFormat.PARQUET


RUN_FORMATS = (OutputFormat.PARQUET, OutputFormat.CSV, OutputFormat.JSONL)
"""What an Airflow run or a materialized definition may write (PRODUCT.md: `table` is for terminals only)."""
JOB_FORMATS = (OutputFormat.CSV, OutputFormat.JSONL, OutputFormat.PARQUET, OutputFormat.ARROW)
"""What a Spark job writes (`--format` of run_plan.py and run_parts.py): every format but the terminal's table."""


Destination = Union[Path, Root]
"""Where a result goes: a local path, or a key on an object store (a `Root` whose `uri` is `s3://BUCKET/KEY`)."""


def destination_of(text: str) -> Destination:
    """A destination as given (a job's `--output`, a recorded run's): an `s3://` URI as a store key (checked by
    `objectstore.parse_root`), anything else as a local path. Where it may go is `publish`'s business."""
    return parse_root(text, what="output") if is_uri(text) else Path(text)


def shown(destination: Destination) -> str:
    """The destination as text: the path, or the `s3://` URI (never a credential: URIs carry none)."""
    return destination.uri if isinstance(destination, Root) else str(destination)
