"""Reading planner fixture files: chunks in PRODUCT.md's scenario metadata form (or line protocol) into
`model.Chunk`s and a `StaticSource`, plus the rows of chunks given as lines.

A fixture file is `{defaults: {...}, cases: [...]}`; `defaults` are merged into every chunk of every case.
Line protocol here is the plain subset the fixtures use (no escapes): `table,tag=v,... field=v,... ns`; integers
end in `i`, unsigned in `u`, strings are double-quoted, `t`/`f`/`true`/`false` are booleans.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import yaml

from iox_planner.model import Chunk, ChunkKind, ColumnType, StaticSource

from reference_support import dedup_rows

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NS_PER_DAY = 86_400 * 10**9


def day_of(ns: int) -> str:
    return (dt.date(1970, 1, 1) + dt.timedelta(days=ns // NS_PER_DAY)).isoformat()


def parse_value(text: str) -> tuple[Any, ColumnType]:
    if text.startswith('"'):
        return text[1:-1], ColumnType.STRING
    if text in ("t", "true", "T", "True"):
        return True, ColumnType.BOOLEAN
    if text in ("f", "false", "F", "False"):
        return False, ColumnType.BOOLEAN
    if text.endswith("i"):
        return int(text[:-1]), ColumnType.INTEGER
    if text.endswith("u"):
        return int(text[:-1]), ColumnType.UNSIGNED
    return float(text), ColumnType.FLOAT


def parse_lines(text: str) -> list[tuple[str, dict[str, Any], dict[str, ColumnType]]]:
    """(table, row, column types) per line."""
    out = []
    for line in text.strip().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        series, fields, stamp = line.split(" ")
        table, *tags = series.split(",")
        row: dict[str, Any] = {"time": int(stamp)}
        types: dict[str, ColumnType] = {"time": ColumnType.TIME}
        for tag in tags:
            k, v = tag.split("=", 1)
            row[k] = v
            types[k] = ColumnType.TAG
        for f in fields.split(","):
            k, v = f.split("=", 1)
            row[k], types[k] = parse_value(v)
        out.append((table, row, types))
    return out


def load_chunks(specs: list[dict[str, Any]], defaults: dict[str, Any] | None = None
                ) -> tuple[list[Chunk], dict[str, list[dict[str, Any]]]]:
    """Chunks from scenario entries; rows (in write order) for those given as `lines`."""
    chunks: list[Chunk] = []
    rows: dict[str, list[dict[str, Any]]] = {}
    for position, raw in enumerate(specs, start=1):
        spec = {**(defaults or {}), **raw}
        kind = ChunkKind(spec.get("kind", "parquet"))
        order = int(spec.get("order", position))
        if "lines" in spec:
            parsed = parse_lines(spec["lines"])
            table = parsed[0][0]
            columns: dict[str, ColumnType] = {}
            data = []
            for _, row, types in parsed:
                columns.update(types)
                data.append(row)
            if kind is ChunkKind.PARQUET:  # a persisted file holds no duplicates
                tags = sorted(c for c, t in columns.items() if t is ColumnType.TAG)
                data = dedup_rows(data, [*tags, "time"])
            times = [r["time"] for r in data]
            lo, hi = min(times), max(times)
            tag_ranges = {}
            partition = day_of(lo)
        else:
            table = spec["table"]
            columns = {k: ColumnType(v) for k, v in spec["columns"].items()}
            time = spec.get("time")
            lo, hi = (time if time is not None else (None, None))
            partition = spec.get("partition") or day_of(lo)
            tag_ranges = {k: (v[0], v[1]) for k, v in spec.get("tag_ranges", {}).items()}
            data = None
        chunk = Chunk(
            id=str(spec["id"]), kind=kind, table=table, partition=str(partition), order=order, time_min=lo,
            time_max=hi, columns=columns, rows=spec.get("rows", len(data) if data is not None else None),
            tag_ranges=tag_ranges, sort_key=tuple(spec.get("sort_key", ())), store=spec.get("store", "file://"),
        )
        chunks.append(chunk)
        if data is not None:
            rows[chunk.id] = data
    return chunks, rows


def source_of(chunks: list[Chunk], sort_keys: dict[str, dict[str, list[str]]] | None = None) -> StaticSource:
    keys = {t: {p: tuple(k) for p, k in parts.items()} for t, parts in (sort_keys or {}).items()}
    return StaticSource(tuple(chunks), partition_sort_keys=keys)


# Fixture files of the planner besides those named after a pass (tests/fixtures/ is shared with other suites).
OTHER_PLANNER_FIXTURES = {"initial_plan", "pruning", "limits", "sql"}


def fixture_files() -> list[Path]:
    """The planner's fixture files: `<pass>.yaml`, `<pass>__invalid.yaml` and the few others above."""
    from iox_planner.planner import PASSES

    names = {p.name for p in PASSES} | OTHER_PLANNER_FIXTURES
    return sorted(p for p in FIXTURES.glob("*.yaml") if p.stem.split("__")[0] in names)


def read_fixture(path: Path) -> dict[str, Any]:
    with path.open() as f:
        doc = yaml.safe_load(f)
    return {"defaults": doc.get("defaults") or {}, "cases": doc.get("cases") or []}
