"""Results at the edge: `formats.py` writes them (csv, jsonl, parquet, the terminal table), `publish.py` publishes
files and folders atomically, `terminal.py` renders text for terminals.

`OutputFormat` is the one list of formats, for the CLI, the runs and the Spark jobs alike. It lives here, with no
heavy import, because the DAG files read it at parse time (a materialized definition's `format`)."""

from __future__ import annotations

from enum import Enum


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
