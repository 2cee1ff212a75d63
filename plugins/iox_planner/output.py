"""Results at the edge: RFC 3339 text for timestamps (nanoseconds where the table's `time` passes through),
the four output formats, and atomic publication that never replaces what iox-batch did not write."""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import decimal
import json
import os
import shutil
import uuid
from enum import Enum
from pathlib import Path
from typing import Any, Iterator, TextIO

import pyarrow as pa

from .errors import BadInputError
from .timeutil import format_time

MARKER = ".iox-batch"
NS_PREFIX = "__iox_ns_"


class OutputFormat(str, Enum):
    TABLE = "table"
    CSV = "csv"
    JSONL = "jsonl"
    PARQUET = "parquet"


def finish_columns(table: pa.Table) -> tuple[pa.Table, set[str]]:
    """Fold `__iox_ns_<name>` helper columns into `<name>` (int64 ns) and drop exactly those helpers: they are
    the only columns the planner adds to a result, and the planner refuses any user name starting with
    `__iox_`, so every other column (`__v` included) is the user's and stays.
    Returns the table and the names of its nanosecond time columns."""
    ns_cols: set[str] = set()
    for name in table.column_names:
        if name.startswith(NS_PREFIX):
            target = name[len(NS_PREFIX):]
            if target in table.column_names:
                idx = table.column_names.index(target)
                table = table.set_column(idx, target, table[name].cast(pa.int64()))
                ns_cols.add(target)
    keep = [n for n in table.column_names if not n.startswith(NS_PREFIX)]
    return table.select(keep), ns_cols


def _text(value: Any, ns: bool) -> Any:
    """A value as JSON/CSV wants it: timestamps RFC 3339 UTC with Z, decimals of integers as integers."""
    if value is None:
        return None
    if ns:
        return format_time(int(value))
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        delta = value - dt.datetime(1970, 1, 1)
        micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        return format_time(micros * 1000)
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, (list, tuple)):
        return [_text(v, False) for v in value]
    if isinstance(value, dict):
        return {k: _text(v, False) for k, v in value.items()}
    return value


def rows(table: pa.Table, ns_cols: set[str]) -> Iterator[list[Any]]:
    names = table.column_names
    flags = [n in ns_cols for n in names]
    for batch in table.to_batches(max_chunksize=65_536):
        columns = [col.to_pylist() for col in batch.columns]
        for i in range(batch.num_rows):
            yield [_text(columns[j][i], flags[j]) for j in range(len(names))]


def write_jsonl(table: pa.Table, ns_cols: set[str], out: TextIO) -> None:
    names = table.column_names
    for row in rows(table, ns_cols):
        out.write(json.dumps(dict(zip(names, row)), ensure_ascii=False, allow_nan=False) + "\n")


def write_csv(table: pa.Table, ns_cols: set[str], out: TextIO) -> None:
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(table.column_names)
    for row in rows(table, ns_cols):
        writer.writerow(["" if v is None else _csv_cell(v) for v in row])


def _csv_cell(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return value


def render_table(table: pa.Table, ns_cols: set[str]) -> Any:
    from rich.table import Table

    grid = Table(show_lines=False)
    for name in table.column_names:
        grid.add_column(name, justify="right" if pa.types.is_integer(table.schema.field(name).type)
                        or pa.types.is_floating(table.schema.field(name).type) else "left")
    for row in rows(table, ns_cols):
        grid.add_row(*["NULL" if v is None else str(_csv_cell(v)) for v in row])
    grid.caption = f"{table.num_rows} row{'s' if table.num_rows != 1 else ''}"
    return grid


# --- atomic publication ------------------------------------------------------------------------------------------


def _marker_for(path: Path) -> Path:
    return path / MARKER if path.is_dir() else path.with_name(f".{path.name}{MARKER}")


def check_destination(path: Path, *, folder: bool) -> None:
    """`path` must be free, or something iox-batch wrote (it carries a marker). Anything else is an error."""
    if not path.exists() and not path.is_symlink():
        parent = path.parent
        if not parent.exists():
            raise BadInputError(f"cannot write {path}: its folder {parent} does not exist")
        return
    if folder and not path.is_dir():
        raise BadInputError(f"cannot write a folder at {path}: a file is there (iox-batch never deletes what it "
                            "did not write); remove it or choose another path")
    if not folder and path.is_dir():
        raise BadInputError(f"cannot write a file at {path}: a folder is there; remove it or choose another path")
    if not _marker_for(path).exists():
        raise BadInputError(f"{path} exists and was not written by iox-batch, so it is not replaced; remove it or "
                            "choose another path")


@contextlib.contextmanager
def staged_file(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling to write; publish it over `path` atomically when the block succeeds."""
    path = path.resolve()
    check_destination(path, folder=False)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        yield tmp
        _marker_for(path).touch()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def staged_folder(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder to fill; swap it in for `path` when the block succeeds."""
    path = path.resolve()
    check_destination(path, folder=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        yield tmp
        (tmp / MARKER).write_text("written by iox-batch\n")
        publish_folder(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def publish_folder(tmp: Path, path: Path) -> None:
    """Swap a finished folder in: the old one (ours) moves aside, the new one takes its name, the old goes."""
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.{uuid.uuid4().hex}.old")
        os.replace(path, old)
    os.replace(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_text_output(table: pa.Table, ns_cols: set[str], fmt: OutputFormat, path: Path | None,
                      stdout: TextIO) -> None:
    writer = write_csv if fmt is OutputFormat.CSV else write_jsonl
    if path is None:
        writer(table, ns_cols, stdout)
        return
    with staged_file(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="") as fh:
            writer(table, ns_cols, fh)


def arrow_for_parquet(table: pa.Table, ns_cols: set[str]) -> pa.Table:
    """Parquet output: nanosecond time columns become UTC microsecond timestamps, unsigned decimals uint64."""
    import numpy as np

    for i, f in enumerate(table.schema):
        if f.name in ns_cols:
            column = table[f.name].combine_chunks()
            values = column.fill_null(0).to_numpy()
            micros = pa.array(np.floor_divide(values, 1000), mask=column.is_null().to_numpy(zero_copy_only=False))
            table = table.set_column(i, f.name, micros.cast(pa.timestamp("us", tz="UTC")))
    return table


def describe(path: Path | None) -> str:
    return "standard output" if path is None else str(path)

