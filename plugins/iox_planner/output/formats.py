"""Results at the edge: RFC 3339 text for timestamps (nanoseconds where the table's `time` passes through), and
writing the output formats (`OutputFormat`, in output/__init__.py; publication itself is publish.py's)."""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import io
import json
from typing import Any, Callable, Iterator, TextIO

import pyarrow as pa

from iox_planner.errors import BadInputError
from iox_planner.objectstore import Root
from iox_planner.output import Destination, OutputFormat, shown
from iox_planner.output.publish import staged_file
from iox_planner.model import NS_PREFIX
from iox_planner.timeutil import format_time


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


class JsonText(str):
    """A value that is JSON text already (a VARIANT, as Spark's `to_json` wrote it: `arrow.json` in the result):
    a text format writes it as it is, never quoted as a string."""


def _json_marker(kind: pa.DataType) -> Callable[[Any], Any] | None:
    """What turns a Python value of Arrow type `kind` into one whose `arrow.json` parts, however deep, are
    `JsonText`; None when `kind` holds none."""
    if isinstance(kind, pa.JsonType):
        return lambda v: None if v is None else JsonText(v)
    if pa.types.is_map(kind):  # as a list of (key, item) pairs
        key, item = _json_marker(kind.key_type), _json_marker(kind.item_type)
        if key is None and item is None:
            return None
        k, i = key or (lambda v: v), item or (lambda v: v)
        return lambda v: None if v is None else [(k(a), i(b)) for a, b in v]
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        inner = _json_marker(kind.value_type)
        return None if inner is None else (lambda v: None if v is None else [inner(x) for x in v])
    if pa.types.is_struct(kind):
        marks = {f.name: _json_marker(f.type) for f in kind}
        if not any(marks.values()):
            return None
        return lambda v: None if v is None else {n: (marks[n] or (lambda x: x))(x) for n, x in v.items()}
    return None


def json_text(value: Any, *, ensure_ascii: bool = False) -> str:
    """`value` (from `rows`) as JSON, as `json.dumps` writes it, its `JsonText` parts as they are."""
    if isinstance(value, JsonText):
        return str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k), ensure_ascii=ensure_ascii)}: "
                               f"{json_text(v, ensure_ascii=ensure_ascii)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(json_text(v, ensure_ascii=ensure_ascii) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ensure_ascii, allow_nan=False)


def rows(table: pa.Table, ns_cols: set[str]) -> Iterator[list[Any]]:
    names = table.column_names
    flags = [n in ns_cols for n in names]
    marks = [_json_marker(f.type) for f in table.schema]
    for batch in table.to_batches(max_chunksize=65_536):
        columns = [col.to_pylist() if mark is None else [mark(v) for v in col.to_pylist()]
                   for col, mark in zip(batch.columns, marks)]
        for i in range(batch.num_rows):
            yield [_text(columns[j][i], flags[j]) for j in range(len(names))]


def _holds_json(table: pa.Table) -> bool:
    return any(_json_marker(f.type) is not None for f in table.schema)


def write_jsonl(table: pa.Table, ns_cols: set[str], out: TextIO) -> None:
    names = table.column_names
    if _holds_json(table):
        for row in rows(table, ns_cols):
            out.write(json_text(dict(zip(names, row))) + "\n")
        return
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
        return json_text(value, ensure_ascii=True)
    return value


def render_table(table: pa.Table, ns_cols: set[str]) -> Any:
    from iox_planner.output.terminal import PlainTable

    grid = PlainTable(show_lines=False)
    for f in table.schema:  # by position: a result may hold two columns of one name
        grid.add_column(f.name, justify="right" if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
                        else "left")
    for row in rows(table, ns_cols):
        grid.add_row(*["NULL" if v is None else str(_csv_cell(v)) for v in row])
    grid.caption = f"{table.num_rows} row{'s' if table.num_rows != 1 else ''}"
    return grid


def print_table(table: pa.Table, ns_cols: set[str], stdout: TextIO) -> None:
    """`--format table`: the result for a person to read, every value and name shown as the text it is."""
    from iox_planner.output.terminal import console

    console(stdout).print(render_table(table, ns_cols))


def write_text_output(table: pa.Table, ns_cols: set[str], fmt: OutputFormat, path: Destination | None,
                      stdout: TextIO) -> None:
    """The result as csv or jsonl on `stdout`, in a local file (written aside, published), or as one object on a
    store (rendered here, then put in one request: text results are driver-sized already)."""
    writer = write_csv if fmt is OutputFormat.CSV else write_jsonl
    if path is None:
        writer(table, ns_cols, stdout)
        return
    if isinstance(path, Root):
        from iox_planner.output.store import publish_file

        text = io.StringIO(newline="")
        writer(table, ns_cols, text)
        publish_file(path, text.getvalue().encode("utf-8"))
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


def describe(path: Destination | None) -> str:
    return "standard output" if path is None else shown(path)

