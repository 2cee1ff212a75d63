"""Scenario files: chunks described in YAML, loaded into the catalog (`iox-batch load`) or used as metadata alone
(`iox-batch explain --chunks`). Every error names the chunk and the field."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from iox_planner import config
from iox_planner.errors import BadInputError
from iox_planner.ingest.lineprotocol import Point, parse
from iox_planner.model import LOCAL_STORE, MAX_ORDER, TIME, Chunk, ChunkKind, ColumnType, StaticSource
from iox_planner.timeutil import now_ns, partition_bounds, partition_of
from iox_planner.userfiles import open_regular
from iox_planner.objectstore import Root


def _excerpt(value: object, size: int = 60) -> str:
    """At most a short excerpt of a user's input in an error message."""
    text = repr(value)
    return text if len(text) <= size else text[: size - 3] + "..."


def _where(event: Any) -> str:
    mark = getattr(event, "start_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""


class _NoAliasLoader(yaml.SafeLoader):
    """yaml's SafeLoader without anchors and aliases (expanded aliases are how a 'billion laughs' file of a few
    hundred bytes becomes gigabytes), without duplicate keys (YAML forbids them; PyYAML keeps the last silently, so
    a second `sql:` would replace the query a reader sees first) and with a bound on nesting depth. `what` names the
    kind of file in errors."""

    def __init__(self, stream: str, what: str, max_depth: int, depth_note: str) -> None:
        super().__init__(stream)
        self._what, self._max_depth, self._depth_note, self._depth = what, max_depth, depth_note, 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise BadInputError(
                f"{_where(event)}YAML anchors and aliases (&name, *name) are not "
                f"allowed in {self._what}s; write each value out"
            )
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            self._depth += 1
            if self._depth > self._max_depth:
                raise BadInputError(f"{_where(event)}nested deeper than {self._max_depth} levels {self._depth_note}")
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        first: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue  # a collection as a key: the constructor refuses it as unhashable
            key = self.construct_object(key_node)
            earlier = first.setdefault(key, key_node)
            if earlier is not key_node:
                raise BadInputError(
                    f"{_where(key_node)}key {_excerpt(key)} appears twice in one mapping (first at line "
                    f"{earlier.start_mark.line + 1}); YAML allows each key once: keep one"
                )
        return super().construct_mapping(node, deep)


def read_yaml(path: str | Path, what: str, *, max_bytes: int, size_note: str, max_depth: int,
              depth_note: str) -> Any:
    """A YAML file that is hostile input (scenario files, materialized definitions): a regular file (never a FIFO
    or a device, `userfiles.open_regular`), at most `max_bytes` read, UTF-8, plain YAML types only, no anchors or
    aliases, no key twice in one mapping, collections nested at most `max_depth` deep. Every error is one paragraph starting with `what` and the path;
    `size_note` and `depth_note` end the errors of the two limits (which setting raises them, say)."""
    name = str(path)
    try:
        with open_regular(path, f"{what} {name}") as fh:
            raw = fh.read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise BadInputError(f"{what} {name} is larger than {max_bytes} bytes {size_note}")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else type(err).__name__
        raise BadInputError(f"cannot read {what} {name}: {reason}") from err
    loader = _NoAliasLoader(text, what, max_depth, depth_note)
    try:
        return loader.get_single_data()
    except BadInputError as err:
        raise BadInputError(f"{what} {name}: {err}") from err
    except yaml.MarkedYAMLError as err:
        where = f" at line {err.problem_mark.line + 1}, column {err.problem_mark.column + 1}" if err.problem_mark else ""
        raise BadInputError(f"{what} {name} is not valid YAML{where}: {err.problem or err.context}") from err
    except (yaml.YAMLError, RecursionError, ValueError) as err:  # ValueError: e.g. an int of 5,000 digits
        raise BadInputError(f"{what} {name} is not valid YAML ({type(err).__name__})") from err
    finally:
        loader.dispose()


_LINE_KEYS = {"id", "kind", "order", "store", "sort_key", "lines"}
_META_KEYS = {"id", "kind", "order", "store", "sort_key", "table", "partition", "time", "columns", "tag_ranges", "rows"}


@dataclass(frozen=True)
class ScenarioChunk:
    """One entry of `chunks:`. Either `lines` (data) or metadata (table, partition, time, columns...)."""

    id: str
    kind: ChunkKind
    order: int | None
    store: str
    sort_key: tuple[str, ...] | None
    points: tuple[Point, ...] = ()
    table: str | None = None
    partition: str | None = None
    time: tuple[int, int] | None = None
    columns: Mapping[str, ColumnType] = field(default_factory=dict)
    tag_ranges: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    rows: int | None = None

    @property
    def has_lines(self) -> bool:
        return bool(self.points)

    def groups(self) -> list[tuple[str, str, str, list[Point]]]:
        """(suffixed id, table, partition, points) per (table, day) the lines span; ids get `.1`, `.2`... when a
        chunk spans several."""
        by_key: dict[tuple[str, str], list[Point]] = defaultdict(list)
        for point in self.points:
            by_key[(point.measurement, partition_of(point.time))].append(point)
        keys = sorted(by_key)
        return [
            (self.id if len(keys) == 1 else f"{self.id}.{n}", table, part, by_key[(table, part)])
            for n, (table, part) in enumerate(keys, start=1)
        ]


@dataclass(frozen=True)
class Scenario:
    db: str | None
    chunks: tuple[ScenarioChunk, ...]
    source: str


def _fail(where: str, message: str) -> BadInputError:
    return BadInputError(f"{where}: {message}")


def read_scenario(path: str | Path) -> Scenario:
    """Parse and validate a scenario file (no catalog needed), within the IOX_SCENARIO_MAX_* limits: a hostile one
    fails fast instead of exhausting memory (scenarios are hand-written test and demo data, far below them)."""
    doc = read_yaml(path, "scenario file", max_bytes=config.SCENARIO_MAX_BYTES.read(),
                    size_note="(IOX_SCENARIO_MAX_BYTES); split it or raise the limit",
                    max_depth=config.SCENARIO_MAX_DEPTH.read(),
                    depth_note="(IOX_SCENARIO_MAX_DEPTH); a scenario needs 4")
    return parse_scenario(doc, str(path))


def parse_scenario(doc: Any, name: str = "scenario") -> Scenario:
    if not isinstance(doc, dict):
        raise BadInputError(f"{name}: a scenario file is a mapping with `db:` and `chunks:`")
    unknown = set(doc) - {"db", "chunks"}
    if unknown:
        raise BadInputError(f"{name}: unknown top-level key(s) {_excerpt(', '.join(sorted(map(str, unknown))))}; "
                            "allowed: db, chunks")
    db = doc.get("db")
    if db is not None and not isinstance(db, str):
        raise BadInputError(f"{name}: `db` must be a string")
    entries = doc.get("chunks")
    if not isinstance(entries, list) or not entries:
        raise BadInputError(f"{name}: `chunks` must be a non-empty list")
    max_chunks = config.SCENARIO_MAX_CHUNKS.read()
    if len(entries) > max_chunks:
        raise BadInputError(f"{name}: {len(entries)} chunks; a scenario holds at most {max_chunks} "
                            "(IOX_SCENARIO_MAX_CHUNKS)")
    max_lines = config.SCENARIO_MAX_LINES.read()
    lines = sum(e["lines"].count("\n") + 1 for e in entries if isinstance(e, dict) and isinstance(e.get("lines"), str))
    if lines > max_lines:
        raise BadInputError(f"{name}: {lines} lines of line protocol; a scenario holds at most {max_lines} "
                            "(IOX_SCENARIO_MAX_LINES)")
    chunks = []
    seen: set[str] = set()
    for index, entry in enumerate(entries, start=1):
        chunk = _parse_chunk(entry, f"{name}: chunk #{index}")
        if chunk.id in seen:
            raise BadInputError(f"{name}: chunk id {chunk.id!r} is used twice; ids must be unique")
        seen.add(chunk.id)
        chunks.append(chunk)
    return Scenario(db, tuple(chunks), name)


def _parse_chunk(entry: Any, where: str) -> ScenarioChunk:
    if not isinstance(entry, dict):
        raise _fail(where, "each chunk is a mapping with at least `id` and `kind`")
    cid = entry.get("id")
    if not isinstance(cid, (str, int)) or isinstance(cid, bool) or str(cid) == "":
        raise _fail(where, "`id` is required (a short name shown in plans)")
    cid = str(cid)
    if len(cid) > 64 or any(ord(ch) < 32 or ord(ch) == 127 for ch in cid):
        raise _fail(where, f"`id` {_excerpt(cid, 40)} must be at most 64 printable characters")
    where = f"{where.rsplit(': ', 1)[0]}: chunk {cid}"
    try:
        kind = ChunkKind(entry.get("kind"))
    except ValueError:
        raise _fail(where, f"field `kind` is {_excerpt(entry.get('kind'))}; use parquet or ingester") from None
    order = entry.get("order")
    if order is not None and (not isinstance(order, int) or isinstance(order, bool) or not 1 <= order <= MAX_ORDER):
        raise _fail(where, f"field `order` is {_excerpt(order)}; use an integer from 1 to {MAX_ORDER} (2^31 - 1; "
                           "higher = newer)")
    store = entry.get("store", LOCAL_STORE)
    if not isinstance(store, str) or not store:
        raise _fail(where, "field `store` must be a non-empty string")
    if kind is ChunkKind.INGESTER and "store" in entry:
        raise _fail(where, "field `store` applies to parquet chunks only")
    sort_key = entry.get("sort_key")
    if sort_key is not None:
        if kind is ChunkKind.INGESTER:
            raise _fail(where, "field `sort_key` applies to parquet chunks only (ingester chunks are unsorted)")
        if not isinstance(sort_key, list) or not all(isinstance(c, str) for c in sort_key) or not sort_key:
            raise _fail(where, "field `sort_key` must be a list of column names")
        sort_key = tuple(sort_key)
    if "lines" in entry:
        extra = set(entry) - _LINE_KEYS
        if extra:
            raise _fail(where, f"has both `lines` and metadata ({', '.join(sorted(extra))}); a chunk is described "
                               "by its lines or by its metadata, not both")
        lines = entry["lines"]
        if not isinstance(lines, str) or not lines.strip():
            raise _fail(where, "field `lines` must be line protocol text")
        result = parse(lines, default_time=now_ns(), source=f"{where}: field `lines`")
        if result.errors:
            shown = "; ".join(_excerpt(str(e), 200)[1:-1] for e in result.errors[:3])
            more = f" (and {len(result.errors) - 3} more)" if len(result.errors) > 3 else ""
            raise _fail(where, f"field `lines`: {shown}{more}")
        if not result.points:
            raise _fail(where, "field `lines` holds no points")
        if sort_key is not None:
            names = {n for p in result.points for n in (*p.tags, *p.fields)} | {TIME}
            unknown = [c for c in sort_key if c not in names]
            if unknown:
                raise _fail(where, f"field `sort_key` names {', '.join(unknown)}, which the lines do not have")
        return ScenarioChunk(cid, kind, order, store, sort_key, points=tuple(result.points))
    return _parse_metadata(entry, where, cid, kind, order, store, sort_key)


def _parse_metadata(entry: Mapping[str, Any], where: str, cid: str, kind: ChunkKind, order: int | None,
                    store: str, sort_key: tuple[str, ...] | None) -> ScenarioChunk:
    extra = set(entry) - _META_KEYS
    if extra:
        raise _fail(where, f"unknown field(s) {_excerpt(', '.join(sorted(map(str, extra))))}")
    table = entry.get("table")
    if not isinstance(table, str) or not table:
        raise _fail(where, "field `table` is required for a chunk given by metadata (or give `lines`)")
    partition = entry.get("partition")
    if not isinstance(partition, str):
        raise _fail(where, "field `partition` is required for a chunk given by metadata, as \"YYYY-MM-DD\"")
    try:
        lo, hi = partition_bounds(partition)
    except BadInputError as err:
        raise _fail(where, f"field `partition`: {err}") from None
    time = entry.get("time")
    bounds: tuple[int, int] | None = None
    if time is not None:
        if (not isinstance(time, list) or len(time) != 2
                or not all(isinstance(t, int) and not isinstance(t, bool) for t in time)):
            raise _fail(where, "field `time` must be [min_ns, max_ns] (inclusive integers) or null for unknown")
        if time[0] > time[1]:
            raise _fail(where, f"field `time`: min {time[0]} is after max {time[1]}")
        if time[0] < lo or time[1] > hi:
            raise _fail(where, f"field `time` {_excerpt(time)} lies outside partition {partition} ([{lo}, {hi}])")
        bounds = (time[0], time[1])
    cols = entry.get("columns")
    if not isinstance(cols, dict) or not cols:
        raise _fail(where, "field `columns` is required: a mapping of column name to tag, float, integer, "
                           "unsigned, boolean, string or time")
    columns: dict[str, ColumnType] = {}
    for cname, ctype in cols.items():
        try:
            columns[str(cname)] = ColumnType(ctype)
        except ValueError:
            raise _fail(where, f"field `columns`: column {_excerpt(cname)} has type {_excerpt(ctype)}; use one of "
                               + ", ".join(t.value for t in ColumnType)) from None
    if columns.get(TIME) is not ColumnType.TIME:
        raise _fail(where, "field `columns` must include `time: time`")
    ranges: dict[str, tuple[str, str]] = {}
    for tag, rng in (entry.get("tag_ranges") or {}).items():
        if columns.get(tag) is not ColumnType.TAG:
            raise _fail(where, f"field `tag_ranges` names {_excerpt(tag)}, which is not a tag column of the chunk")
        if not isinstance(rng, list) or len(rng) != 2 or not all(isinstance(v, str) for v in rng):
            raise _fail(where, f"field `tag_ranges`: {tag} must be [min, max] strings")
        ranges[tag] = (rng[0], rng[1])
    rows = entry.get("rows")
    if rows is not None and (not isinstance(rows, int) or rows < 0):
        raise _fail(where, "field `rows` must be a non-negative integer")
    if sort_key is not None:
        unknown = [c for c in sort_key if c not in columns]
        if unknown:
            raise _fail(where, f"field `sort_key` names {', '.join(unknown)}, which are not among its columns")
    return ScenarioChunk(cid, kind, order, store, sort_key, table=table, partition=partition, time=bounds,
                         columns=columns, tag_ranges=ranges, rows=rows)


def assign_orders(chunks: Sequence[ScenarioChunk], base: int) -> list[int]:
    """Given orders stay; a missing one is the chunk's position in the list counted from 1 after `base`."""
    return [c.order if c.order is not None else base + n for n, c in enumerate(chunks, start=1)]


def check_unique_orders(chunks: Sequence[Chunk], existing: Mapping[tuple[str, str], set[int]] | None = None) -> None:
    """Orders are unique per (table, partition)."""
    seen: dict[tuple[str, str, int], str] = {}
    for chunk in chunks:
        key = (chunk.table, chunk.partition, chunk.order)
        if key in seen:
            raise BadInputError(
                f"chunks {seen[key]} and {chunk.id} both have order {chunk.order} in {chunk.table} partition "
                f"{chunk.partition}; orders must be unique per table and partition"
            )
        if existing and chunk.order in existing.get((chunk.table, chunk.partition), set()):
            raise BadInputError(
                f"chunk {chunk.id} has order {chunk.order}, which a chunk already in {chunk.table} partition "
                f"{chunk.partition} holds; orders must be unique per table and partition"
            )
        seen[key] = chunk.id


def scenario_source(scenario: Scenario) -> StaticSource:
    """The scenario's chunks as planner metadata alone: no catalog, no data files."""
    from iox_planner.ingest import files as chunk_files

    orders = assign_orders(scenario.chunks, 0)
    out: list[Chunk] = []
    schemas: dict[str, dict[str, ColumnType]] = defaultdict(dict)
    sort_keys: dict[str, dict[str, tuple[str, ...]]] = defaultdict(dict)
    for spec, order in zip(scenario.chunks, orders):
        if spec.has_lines:
            for cid, table, partition, points in spec.groups():
                columns = chunk_files.chunk_columns(points)
                _merge_schema(schemas[table], columns, cid)
                data = chunk_files.points_to_table(points, columns)
                if spec.kind is ChunkKind.PARQUET:
                    data = chunk_files.deduplicate([(0, data)], columns)
                    derived = tuple(chunk_files.derive_sort_key(data, columns))
                    key = sort_keys[table].setdefault(partition, derived)
                    file_key = spec.sort_key or tuple(c for c in key if c in columns)
                else:
                    file_key = ()
                times = [p.time for p in points]
                out.append(Chunk(
                    id=cid, kind=spec.kind, table=table, partition=partition, order=order,
                    time_min=min(times), time_max=max(times), columns=columns, rows=data.num_rows,
                    tag_ranges=chunk_files.tag_ranges(data, columns), sort_key=file_key, store=spec.store,
                ))
        else:
            assert spec.table is not None and spec.partition is not None
            _merge_schema(schemas[spec.table], spec.columns, spec.id)
            out.append(Chunk(
                id=spec.id, kind=spec.kind, table=spec.table, partition=spec.partition, order=order,
                time_min=spec.time[0] if spec.time else None, time_max=spec.time[1] if spec.time else None,
                columns=dict(spec.columns), rows=spec.rows, tag_ranges=dict(spec.tag_ranges),
                sort_key=spec.sort_key or (), store=spec.store,
            ))
    check_unique_orders(out)
    return StaticSource(tuple(out), partition_sort_keys={t: dict(k) for t, k in sort_keys.items()})


def _merge_schema(schema: dict[str, ColumnType], columns: Mapping[str, ColumnType], cid: str) -> None:
    for name, ctype in columns.items():
        if name in schema and schema[name] is not ctype:
            raise BadInputError(
                f"chunk {cid}: column {name!r} is {ctype.value} here but {schema[name].value} in an earlier chunk "
                "of the same table"
            )
        schema[name] = ctype


@dataclass(frozen=True)
class LoadedChunk:
    id: str
    kind: ChunkKind
    table: str
    partition: str
    rows: int
    order: int


def load_scenario(catalog: Any, scenario: Scenario, db: str | None = None,
                  warehouse: Root | Path | None = None) -> tuple[str, list[LoadedChunk]]:
    """`iox-batch load`: every chunk of the scenario into the catalog, in one transaction (all or nothing).

    `db` (from --db) wins over the file's `db:`. Loading into an existing database adds to it; default orders
    count on from the highest order it holds, and the catalog's order sequence moves past what was loaded.
    """
    from iox_planner import storage
    from iox_planner.catalog import locks
    from iox_planner.catalog.changes import record_gap
    from iox_planner.catalog.freshness import WriteEvent, committed_order, fresh_order, record_writes
    from iox_planner.catalog.limits import check_write
    from iox_planner.ingest.files import chunk_columns
    from iox_planner.ingest import write as ingest
    from iox_planner.catalog.names import check_db_name

    name = db or scenario.db
    if not name:
        raise BadInputError(f"{scenario.source}: no database: give --db DB or `db:` in the file")
    check_db_name(name)
    meta_only = [c.id for c in scenario.chunks if not c.has_lines]
    if meta_only:
        raise BadInputError(
            f"{scenario.source}: chunk(s) {', '.join(meta_only)} are metadata only (no `lines`), so there is no "
            "data to load; such scenarios are for `iox-batch explain --chunks`"
        )
    root = storage.warehouse_of(warehouse)
    staged = storage.Staged(root)
    loaded: list[LoadedChunk] = []
    events: list[WriteEvent] = []
    try:
        with catalog.engine.begin() as conn:
            db_id = catalog.ensure_database(conn, name)
            locks.lock_orders(conn, db_id)
            counter = committed_order(conn, db_id)
            taken = catalog.labels(conn, db_id)
            existing: dict[tuple[str, str], set[int]] = defaultdict(set)
            for row in catalog.chunk_rows(conn, db_id):
                existing[(row.table, row.partition)].add(row.order)
            orders = assign_orders(scenario.chunks, catalog.max_order(conn, db_id))
            if max(orders) > MAX_ORDER:
                raise BadInputError(f"{scenario.source}: the default orders would pass {MAX_ORDER} (2^31 - 1), "
                                    f"the highest order; database {name!r} already holds orders near it")
            planned: list[Chunk] = []
            for spec, order in zip(scenario.chunks, orders):
                for cid, table, partition, _ in spec.groups():
                    if cid in taken:
                        raise BadInputError(
                            f"{scenario.source}: chunk {cid}: database {name!r} already has a chunk with this id; "
                            "give it another id"
                        )
                    planned.append(Chunk(cid, spec.kind, table, partition, order, None, None, {}))
            check_unique_orders(planned, existing)
            # The catalog limits over the whole load (one write), under the order lock, before anything is stored.
            check_write(catalog, conn, name, db_id, [
                (table, chunk_columns(points), partition)
                for spec in scenario.chunks for _, table, partition, points in spec.groups()])
            for spec, order in zip(scenario.chunks, orders):
                for cid, table, partition, points in spec.groups():
                    try:
                        result = ingest.write_points(
                            catalog, name, points, orders={(table, partition): order},
                            labels={(table, partition): cid}, kind=spec.kind, sort_key=spec.sort_key,
                            store=spec.store, conn=conn, staged=staged, warehouse=root, log_writes=False,
                            check_limits=False,
                        )
                    except BadInputError as err:
                        raise BadInputError(f"{scenario.source}: chunk {cid}: {err}") from err
                    loaded.extend(LoadedChunk(c.id, spec.kind, c.table, c.partition, c.rows, c.order)
                                  for c in result.chunks)
                    events.extend(c.event() for c in result.chunks)
            # Only this database's counter moves (orders are per database): a scenario cannot touch others.
            catalog.advance_orders(conn, db_id, max(orders))
            # The load is new data. Its write events need an order above every watermark a materialized run took
            # before this load committed (at most `counter`, read under the order lock): the load's highest order
            # if it is above that, else (explicit orders below it) one fresh order from the counter.
            top = max(orders)
            logged = top if top > counter else fresh_order(conn, db_id)
            record_writes(conn, db_id, events, order=logged, source="load")
            # Chunks given orders at or below the counter were written "in the past": a changes read since a
            # watermark at or above the lowest of them would miss them, so such watermarks are refused from now on.
            if min(orders) <= counter:
                record_gap(conn, db_id, min(orders), logged, "load")
            staged.sync()  # the chunk files on disk before the COMMIT names them
    except BaseException:
        staged.rollback()
        raise
    return name, loaded
