"""The vectorized path of line protocol: a whole block of regular lines parsed with Arrow compute kernels into
Arrow tables per (measurement, day), with no Python object per line or value.

It takes a block only when every line in it is plain: no backslash, no double quote, no control character (CR
included), single spaces, three sections (a timestamp given), heads and field layouts the scalar parser would
accept, every value of a field of one type in the plain forms (decimal floats without underscores, `12i` up to
18 digits, `12u` up to 19, the boolean words), and names that agree with the schema known so far. Anything else,
errors included, returns None and the block goes to `StreamParser.feed`, the exact parser, which alone words
error messages. So this path only has to be right about what it accepts, and `tests/test_lp_vector.py` checks it
against the scalar parser on random and hostile lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iox_planner.ingest.files import arrow_schema
from iox_planner.ingest.lineprotocol import _BOOLS, StreamParser, _reserved, _too_long
from iox_planner.model import TIME, WRITE_SEQ, ColumnType
from iox_planner.timeutil import INT64_MAX, NS_PER_DAY, partition_of

_FLOAT_RE = r"^-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"
_INT_RE = r"^-?[0-9]{1,18}i$"
_UINT_RE = r"^[0-9]{1,19}u$"
# In range for int64 whatever the digits: up to 18 digits, or 19 starting with 1-8.
_STAMP_RE = r"^-?(?:[0-9]{1,18}|[1-8][0-9]{18})$"
_TRUE = [k for k, v in _BOOLS.items() if v]
_ALL_BOOLS = list(_BOOLS)
_ARROW = {ColumnType.FLOAT: pa.float64(), ColumnType.INTEGER: pa.int64(), ColumnType.UNSIGNED: pa.uint64(),
          ColumnType.BOOLEAN: pa.bool_()}


@dataclass
class Piece:
    """The rows of one (measurement, day) of a block, in line order, with `__seq` their position in the piece."""

    measurement: str
    partition: str
    columns: dict[str, ColumnType]
    table: pa.Table
    first_line: int
    last_line: int


def _all(mask: pa.Array) -> bool:
    return bool(pc.all(mask).as_py()) if len(mask) else True


def _any(mask: pa.Array) -> bool:
    return bool(pc.any(mask).as_py()) if len(mask) else False


def _field_column(values: pa.Array) -> tuple[ColumnType, pa.Array] | None:
    """One field's values (all rows of a layout) as one typed array, or None if not all plain and of one type."""
    if _all(pc.match_substring_regex(values, _FLOAT_RE)):
        out = pc.cast(values, pa.float64())
        return (ColumnType.FLOAT, out) if _all(pc.is_finite(out)) else None
    if _all(pc.match_substring_regex(values, _INT_RE)):
        return ColumnType.INTEGER, pc.cast(pc.utf8_slice_codeunits(values, 0, -1), pa.int64())
    if _all(pc.match_substring_regex(values, _UINT_RE)):
        return ColumnType.UNSIGNED, pc.cast(pc.utf8_slice_codeunits(values, 0, -1), pa.uint64())
    if _all(pc.is_in(values, value_set=pa.array(_ALL_BOOLS))):
        return ColumnType.BOOLEAN, pc.is_in(values, value_set=pa.array(_TRUE))
    return None


# Bytes that send a block to the exact parser: backslash, double quote, and the control characters (CR included).
_SPECIAL = np.zeros(256, dtype=bool)
_SPECIAL[[*range(0x20), 0x7F, ord("\\"), ord('"')]] = True


def _has_special_bytes(arr: pa.Array) -> bool:
    """Whether any line holds a special byte: one table lookup over the array's UTF-8 bytes (a multi-byte
    character never contains a byte below 0x80)."""
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset:arr.offset + len(arr) + 1]
    data = arr.buffers()[2]
    if data is None or offsets[-1] == offsets[0]:
        return False
    raw = np.frombuffer(data, dtype=np.uint8)[offsets[0]:offsets[-1]]
    return bool(_SPECIAL[raw].any())


def _layouts_by_count(body: pa.Array) -> tuple[list[str], np.ndarray] | None:
    """The usual case without a regex: bodies with the same number of fields that all have the same keys in the
    same order (checked with `starts_with`); as (layout texts like `a=,b=`, each row's layout index), or None
    when rows with the same field count differ in keys (then the general regex way decides)."""
    items = pc.split_pattern(body, ",")
    counts = pc.list_value_length(items).to_numpy()
    texts: list[str] = []
    codes = np.empty(len(counts), dtype=np.int64)
    for count in np.unique(counts):
        rows = np.flatnonzero(counts == count)
        subset = items.take(pa.array(rows))
        keys = []
        for j, item in enumerate(subset[0].as_py()):
            key, sep, _ = item.partition("=")
            if not sep:
                return None
            if not _all(pc.starts_with(pc.list_element(subset, j), key + "=")):
                return None
            keys.append(key)
        codes[rows] = len(texts)
        texts.append(",".join(k + "=" for k in keys))
    return texts, codes


def _head(text: str, parser: StreamParser) -> tuple[str, dict[str, str]] | None:
    lim = parser.limits
    parts = text.split(",")
    measurement = parts[0]
    if not measurement or _too_long(measurement, lim.max_name_bytes):
        return None
    tags: dict[str, str] = {}
    for part in parts[1:]:
        key, _, value = part.partition("=")
        if (not key or not value or "=" in value or key in tags or _reserved("tag", key)
                or _too_long(key, lim.max_name_bytes)):
            return None
        tags[key] = value
    return measurement, tags


def parse_block(arr: pa.Array | None, parser: StreamParser,
                catalog: Callable[[str], Mapping[str, ColumnType]] | None = None) -> list[Piece] | None:
    """The block's rows as pieces per (measurement, day), committing names to `parser`'s schema and moving its
    line count on; None (nothing changed) if any line needs the exact parser, or if a column disagrees with
    `catalog(measurement)` (the table's columns in the catalog: the writer words that error, by line)."""
    if arr is None or parser._carry or not len(arr):
        return None
    lim = parser.limits
    base = parser.lines_read
    if _any(pc.greater(pc.utf8_length(arr), lim.max_line_bytes // 4)):
        return None
    if _has_special_bytes(arr):
        return None
    present = pc.not_equal(arr, "")
    rows = np.flatnonzero(present.to_numpy(zero_copy_only=False))
    if len(rows) == 0:
        return None
    live = arr.take(pa.array(rows)) if len(rows) != len(arr) else arr
    if _any(pc.starts_with(live, "#")):
        return None  # a comment line: the exact parser skips it (this path would store it as a table `#...`)
    parts = pc.split_pattern(live, " ")
    if not _all(pc.equal(pc.list_value_length(parts), 3)):
        return None  # leading, trailing or double spaces, a missing timestamp, a missing section
    head = pc.list_element(parts, 0)
    body = pc.list_element(parts, 1)
    stamp = pc.list_element(parts, 2)
    if not _all(pc.match_substring_regex(stamp, _STAMP_RE)):
        return None
    times = pc.cast(stamp, pa.int64()).to_numpy()
    multiplier = parser.precision.multiplier
    if multiplier != 1:
        if np.any(np.abs(times) > INT64_MAX // multiplier):
            return None
        times = times * multiplier

    # Heads: few distinct ones (series), each checked once as the scalar path would.
    head_enc = pc.dictionary_encode(head)
    head_texts = head_enc.dictionary.to_pylist()
    head_codes = head_enc.indices.to_numpy()
    heads = []
    # Checked heads, kept across blocks (a head's checks depend only on its text and the limits).
    cache: dict[str, tuple[str, dict[str, str]]] = parser.vector_heads
    for text in head_texts:
        parsed = cache.get(text)
        if parsed is None:
            parsed = _head(text, parser)
            if parsed is None:
                return None
            if len(cache) >= 100_000:
                cache.clear()
            cache[text] = parsed
        heads.append(parsed)

    # Field layouts: the keys of a body, its values blanked out.
    found_layouts = _layouts_by_count(body)
    if found_layouts is None:
        sig_enc = pc.dictionary_encode(pc.replace_substring_regex(body, "=[^,]*", "="))
        sig_texts = sig_enc.dictionary.to_pylist()
        sig_codes = sig_enc.indices.to_numpy()
    else:
        sig_texts, sig_codes = found_layouts
    layouts: list[list[str]] = []
    for text in sig_texts:
        items = text.split(",")
        if any(not item.endswith("=") for item in items):
            return None
        keys = [item[:-1] for item in items]
        if (len(set(keys)) != len(keys)
                or any(not k or _reserved("field", k) or _too_long(k, lim.max_name_bytes) for k in keys)):
            return None
        layouts.append(keys)

    # Which (measurement -> tags, fields) the block uses; every combination must fit the column limit.
    pairs = np.unique(head_codes.astype(np.int64) * len(layouts) + sig_codes)
    for pair in pairs:
        h, s = divmod(int(pair), len(layouts))
        if len(heads[h][1]) + len(layouts[s]) > lim.max_columns or set(heads[h][1]) & set(layouts[s]):
            return None

    # Values, one layout at a time; every field of a measurement must come out with one type.
    first_row_of_sig = np.full(len(layouts), len(live), dtype=np.int64)
    np.minimum.at(first_row_of_sig, sig_codes, np.arange(len(live)))
    typed: list[dict[str, tuple[ColumnType, pa.Array]]] = []
    sig_rows: list[np.ndarray] = []
    for s, keys in enumerate(layouts):
        idx = np.flatnonzero(sig_codes == s)
        sig_rows.append(idx)
        items = pc.split_pattern(body.take(pa.array(idx)), ",")
        columns: dict[str, tuple[ColumnType, pa.Array]] = {}
        for j, key in enumerate(keys):
            values = pc.utf8_slice_codeunits(pc.list_element(items, j), len(key) + 1)
            found = _field_column(values)
            if found is None:
                return None
            columns[key] = found
        typed.append(columns)

    # Names against each other and against the schema known so far (earlier blocks and the catalog).
    measurement_of_head = [m for m, _ in heads]
    plan: dict[str, dict[str, tuple[ColumnType, int]]] = {}
    first_row_of_head = np.full(len(heads), len(live), dtype=np.int64)
    np.minimum.at(first_row_of_head, head_codes, np.arange(len(live)))
    sigs_of_measurement: dict[str, set[int]] = {}
    for pair in pairs:
        h, s = divmod(int(pair), len(layouts))
        sigs_of_measurement.setdefault(measurement_of_head[h], set()).add(s)
    for h, (measurement, tags) in enumerate(heads):
        cols = plan.setdefault(measurement, {})
        line = base + int(rows[first_row_of_head[h]]) + 1
        for key in tags:
            prior = cols.get(key)
            if prior is None or line < prior[1]:
                cols[key] = (ColumnType.TAG, line)
    for measurement, sigs in sigs_of_measurement.items():
        cols = plan[measurement]
        for s in sigs:
            # The first line of this layout with this measurement.
            heads_here = [h for h, (m, _) in enumerate(heads) if m == measurement]
            mask = (sig_codes == s) & np.isin(head_codes, heads_here)
            line = base + int(rows[int(np.argmax(mask))]) + 1
            for key, (kind, _) in typed[s].items():
                prior = cols.get(key)
                if prior is not None and prior[0] is not kind:
                    return None  # a tag and a field, or two types: the exact parser words it
                if prior is None or line < prior[1]:
                    cols[key] = (kind, line)
    for measurement, cols in plan.items():
        known = parser.schema.get(measurement, {})
        stored = catalog(measurement) if catalog is not None else {}
        for key, (kind, _) in cols.items():
            prior = known.get(key)
            if prior is not None and prior[0] is not kind:
                return None
            if key in stored and stored[key] is not kind:
                return None

    # Accepted: commit names (keeping the earliest line that introduced each) and build the pieces.
    for measurement, cols in plan.items():
        known = parser.schema.setdefault(measurement, {})
        for key, value in cols.items():
            known.setdefault(key, value)
    parser.lines_read += len(arr)

    order = np.concatenate(sig_rows)
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    days = np.floor_divide(times, NS_PER_DAY)
    line_numbers = base + rows + 1
    pieces: list[Piece] = []
    for measurement in sorted(plan):
        cols = plan[measurement]
        in_measurement = np.isin(head_codes, np.array([h for h, (m, _) in enumerate(heads) if m == measurement]))
        for day in np.unique(days[in_measurement]):
            sel = np.flatnonzero(in_measurement & (days == day))
            take = pa.array(sel)
            arrays: dict[str, pa.Array] = {}
            types: dict[str, ColumnType] = {}
            for key, (kind, _) in cols.items():
                if kind is ColumnType.TAG:
                    values = pa.array([heads[h][1].get(key) for h in range(len(heads))], pa.string())
                    arrays[key] = values.take(pa.array(head_codes[sel]))
                else:
                    # Every layout's rows, in layout order (other measurements' rows are never taken): a
                    # layout without this field, or with it as another type elsewhere, gives NULLs.
                    parts_of = [typed[s][key][1] if key in typed[s] and typed[s][key][0] is kind
                                else pa.nulls(len(sig_rows[s]), _ARROW[kind]) for s in range(len(layouts))]
                    whole = pa.concat_arrays(parts_of)
                    arrays[key] = whole.take(pa.array(inverse[sel]))
                types[key] = kind
            types[TIME] = ColumnType.TIME
            arrays[TIME] = pa.array(times[sel], pa.int64())
            schema = arrow_schema(types, with_seq=True)
            data = [arrays[f.name] if f.name != WRITE_SEQ else pa.array(np.arange(len(sel), dtype=np.int64))
                    for f in schema]
            table = pa.Table.from_arrays(data, schema=schema)
            pieces.append(Piece(measurement, partition_of(int(day) * NS_PER_DAY), types, table,
                                int(line_numbers[sel[0]]), int(line_numbers[sel[-1]])))
    return pieces


def columns_of(pieces: list[Piece]) -> Mapping[str, Mapping[str, ColumnType]]:
    out: dict[str, dict[str, ColumnType]] = {}
    for p in pieces:
        out.setdefault(p.measurement, {}).update(p.columns)
    return out
