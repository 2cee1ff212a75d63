"""The vectorized path of line protocol: a whole block of regular lines parsed with Arrow compute kernels and
numpy into Arrow tables per (measurement, day), with no Python object per line or value.

It takes a block only when every line in it is plain: no backslash, no double quote, no control character (CR
included), single spaces, three sections (a timestamp given), heads and field layouts the scalar parser would
accept, every value of a field of one type in the plain forms (decimal floats without underscores, `12i` up to
18 digits, `12u` up to 19, the boolean words), and names that agree with the schema known so far. Anything else,
errors included, returns None and the block goes to `StreamParser.feed`, the exact parser, which alone words
error messages. So this path only has to be right about what it accepts, and `tests/ingest/test_lp_vector.py` checks it
against the scalar parser on random and hostile lines.

The fields of a block are read one of two ways. The usual block, every line with the same field keys in the same
order (`_uniform_fields`), is read from the bytes: the `=` and `,` of every line found at once, the keys checked
byte for byte against the first line's, and every value cut out into one array that a single cast parses when all
are floats. Any other block takes the general way (`_general_fields`): layouts by keys, one field at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iox_planner.catalog.names import UNPRINTABLE
from iox_planner.ingest.arrow_np import from_numpy, scatter, spread_strings, strings, to_numpy
from iox_planner.ingest.files import arrow_schema
from iox_planner.ingest.lineprotocol.limits import Limits
from iox_planner.ingest.lineprotocol.names import name_ok
from iox_planner.ingest.lineprotocol.parser import StreamParser
from iox_planner.ingest.lineprotocol.values import BOOLS
from iox_planner.model import TIME, WRITE_SEQ, ColumnType
from iox_planner.timeutil import NS_PER_DAY, TIME_MAX, TIME_MIN, partition_of

_FLOAT_RE = r"^-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"
_INT_RE = r"^-?[0-9]{1,18}i$"
_UINT_RE = r"^[0-9]{1,19}u$"
# In range for int64 whatever the digits: up to 18 digits, or 19 starting with 1-8.
_STAMP_RE = r"^-?(?:[0-9]{1,18}|[1-8][0-9]{18})$"
# Arrow values built through `arrow_np`, never from Python lists or numbers (pyarrow's converters import pandas).
_TRUE = strings([k for k, v in BOOLS.items() if v])
_ALL_BOOLS = strings(list(BOOLS))
_HEAD, _BODY, _STAMP = from_numpy(np.arange(3, dtype=np.int32))
_ARROW = {ColumnType.FLOAT: pa.float64(), ColumnType.INTEGER: pa.int64(), ColumnType.UNSIGNED: pa.uint64(),
          ColumnType.BOOLEAN: pa.bool_()}
_EQUALS, _COMMA, _PLUS, _HASH = ord("="), ord(","), ord("+"), ord("#")

# Bytes a float value may hold on the uniform path. Over these, Arrow's string-to-float cast accepts exactly the
# tokens Go's float grammar (the exact parser) does, with the same values, except a leading '+' (refused
# separately): `tests/ingest/test_lp_vector.py` pins that against the exact parser.
_FLOAT_BYTES = b"0123456789.eE+-"

# Fields: the keys of each layout, each row's layout, the rows of each layout, and per layout its fields as
# (type, values in the layout's row order).
_Fields = tuple[list[list[str]], np.ndarray, list[np.ndarray], list[dict[str, tuple[ColumnType, pa.Array]]]]


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


def _buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A string array's offsets (int64, from 0) and its UTF-8 bytes, both read in place."""
    wide = pa.types.is_large_string(arr.type)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64 if wide else np.int32)[
        arr.offset:arr.offset + len(arr) + 1]
    start, end = int(offsets[0]), int(offsets[-1])
    data = arr.buffers()[2]
    raw = np.frombuffer(data, dtype=np.uint8)[start:end] if data is not None and end > start else np.zeros(0, np.uint8)
    return offsets.astype(np.int64) - start, raw


def _field_column(values: pa.Array) -> tuple[ColumnType, pa.Array] | None:
    """One field's values (all rows of a layout) as one typed array, or None if not all plain and of one type."""
    if _all(pc.match_substring_regex(values, _FLOAT_RE)):
        out = pc.cast(values, pa.float64())
        return (ColumnType.FLOAT, out) if _all(pc.is_finite(out)) else None
    if _all(pc.match_substring_regex(values, _INT_RE)):
        return ColumnType.INTEGER, pc.cast(pc.utf8_slice_codeunits(values, 0, -1), pa.int64())
    if _all(pc.match_substring_regex(values, _UINT_RE)):
        return ColumnType.UNSIGNED, pc.cast(pc.utf8_slice_codeunits(values, 0, -1), pa.uint64())
    if _all(pc.is_in(values, value_set=_ALL_BOOLS)):
        return ColumnType.BOOLEAN, pc.is_in(values, value_set=_TRUE)
    return None


def _has_special_bytes(raw: np.ndarray) -> bool:
    """Whether the lines' UTF-8 bytes hold one that sends a block to the exact parser: backslash, double quote,
    or a control character (CR included). A multi-byte character never contains a byte below 0x80."""
    if not raw.size:
        return False
    if bool((raw < 0x20).any()):
        return True
    data = raw.tobytes()  # bytes.find is a memchr: far faster than three numpy comparisons
    return b"\\" in data or b'"' in data or b"\x7f" in data


def _keys_ok(keys: list[str], lim: Limits) -> bool:
    """A layout's field keys as the scalar parser checks them on their own (against tags and the schema later)."""
    return len(set(keys)) == len(keys) and all(name_ok("field", k, lim) for k in keys)


def _uniform_fields(body: pa.Array, lim: Limits) -> _Fields | None:
    """The fields of a block whose every line has the first line's field keys, in its order, read from the bytes;
    None for any other block (or anything unusual: the general way, then the exact parser, decide)."""
    n = len(body)
    offsets, raw = _buffers(body)
    if raw.size >= 2**31 - 1:
        return None
    delims = np.flatnonzero((raw == _COMMA) | (raw == _EQUALS))
    per_row = int(np.searchsorted(delims, offsets[1]))  # the first line's '=' and ','
    if per_row % 2 == 0 or len(delims) != n * per_row:
        return None
    at = delims.reshape(n, per_row)
    # Every line holds exactly its share (so the same count), alternating '=' ',' ... '=': key=value,key=value.
    if not (bool((at[:, 0] >= offsets[:-1]).all()) and bool((at[:, -1] < offsets[1:]).all())):
        return None
    pattern = np.where(np.arange(per_row) % 2 == 0, _EQUALS, _COMMA).astype(np.uint8)
    if not bool((raw[at] == pattern).all()):
        return None
    width = (per_row + 1) // 2
    equals, commas = at[:, 0::2], at[:, 1::2]
    key_start = np.empty((n, width), dtype=np.int64)
    key_start[:, 0] = offsets[:-1]
    key_start[:, 1:] = commas + 1
    key_len = equals - key_start
    if not bool((key_len == key_len[0]).all()):
        return None  # an early way out: the byte comparison below would refuse it too
    value_start = equals + 1
    value_end = np.empty((n, width), dtype=np.int64)
    value_end[:, :-1] = commas
    value_end[:, -1] = offsets[1:]
    value_len = value_end - value_start
    if not bool((value_len > 0).all()):
        return None  # an empty value is an error (the cast would refuse it too; this does not rely on that)
    keys = [raw[key_start[0, j]:equals[0, j]].tobytes().decode("utf-8") for j in range(width)]
    if not _keys_ok(keys, lim):
        return None

    # Every line's bytes outside its values (keys, '=' and ',') must be the first line's, byte for byte.
    runs = np.empty((n, 2 * width), dtype=np.int64)
    runs[:, 0] = value_start[:, 0] - offsets[:-1]
    runs[:, 2::2] = value_start[:, 1:] - value_end[:, :-1]
    runs[:, 1::2] = value_len
    in_value = np.repeat(np.tile(np.array([False, True]), n * width), runs.ravel())
    outside = raw[~in_value]
    sig = int(runs[0, 0::2].sum())
    if outside.size != n * sig or not bool((outside.reshape(n, sig) == outside[:sig]).all()):
        return None

    # All values, line by line, as one string array over their bytes.
    data = raw[in_value]
    value_offsets = np.zeros(n * width + 1, dtype=np.int32)
    np.cumsum(value_len.ravel(), out=value_offsets[1:])
    values = pa.StringArray.from_buffers(n * width, pa.py_buffer(value_offsets), pa.py_buffer(data))
    columns: dict[str, tuple[ColumnType, pa.Array]] = {}
    floats = None
    if not data.tobytes().translate(None, _FLOAT_BYTES) and not bool((data[value_offsets[:-1]] == _PLUS).any()):
        try:
            floats = to_numpy(pc.cast(values, pa.float64()))
        except pa.ArrowInvalid:
            floats = None  # not all numbers after all: field by field below
    if floats is not None:
        if not bool(np.isfinite(floats).all()):
            return None  # out of range: the exact parser words it
        grid = floats.reshape(n, width)
        for j, key in enumerate(keys):
            columns[key] = (ColumnType.FLOAT, from_numpy(grid[:, j]))
    else:
        for j, key in enumerate(keys):
            found = _field_column(values.take(from_numpy(np.arange(j, n * width, width))))
            if found is None:
                return None
            columns[key] = found
    return [keys], np.zeros(n, dtype=np.int64), [np.arange(n)], [columns]


def _layouts_by_count(body: pa.Array) -> tuple[list[str], np.ndarray] | None:
    """Without a regex: bodies with the same number of fields that all have the same keys in the same order
    (checked with `starts_with`); as (layout texts like `a=,b=`, each row's layout index), or None when rows with
    the same field count differ in keys (then the general regex way decides)."""
    items = pc.split_pattern(body, ",")
    counts = to_numpy(pc.list_value_length(items))
    texts: list[str] = []
    codes = np.empty(len(counts), dtype=np.int64)
    for count in np.unique(counts):
        rows = np.flatnonzero(counts == count)
        subset = items.take(from_numpy(rows))
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


def _general_fields(body: pa.Array, lim: Limits) -> _Fields | None:
    """The fields of any block of plain bodies: its layouts (key lists) found, then each field of each layout
    typed on its own; None if a layout or a value is not plain."""
    found_layouts = _layouts_by_count(body)
    if found_layouts is None:
        sig_enc = pc.dictionary_encode(pc.replace_substring_regex(body, "=[^,]*", "="))
        sig_texts = sig_enc.dictionary.to_pylist()
        sig_codes = to_numpy(sig_enc.indices).astype(np.int64)
    else:
        sig_texts, sig_codes = found_layouts
    layouts: list[list[str]] = []
    for text in sig_texts:
        items = text.split(",")
        if any(not item.endswith("=") for item in items):
            return None
        keys = [item[:-1] for item in items]
        if not _keys_ok(keys, lim):
            return None
        layouts.append(keys)
    typed: list[dict[str, tuple[ColumnType, pa.Array]]] = []
    # Each layout's rows, in line order, from one stable sort (a mask per layout is quadratic over many layouts).
    order = np.argsort(sig_codes, kind="stable")
    sig_rows: list[np.ndarray] = np.split(order, np.cumsum(np.bincount(sig_codes, minlength=len(layouts)))[:-1])
    for s, keys in enumerate(layouts):
        idx = sig_rows[s]
        items = pc.split_pattern(body.take(from_numpy(idx)), ",")
        columns: dict[str, tuple[ColumnType, pa.Array]] = {}
        for j, key in enumerate(keys):
            values = pc.utf8_slice_codeunits(pc.list_element(items, j), len(key) + 1)
            found = _field_column(values)
            if found is None:
                return None
            columns[key] = found
        typed.append(columns)
    return layouts, sig_codes, sig_rows, typed


def _head(text: str, parser: StreamParser) -> tuple[str, dict[str, str]] | None:
    lim = parser.limits
    # The block holds no C0 control character, but a name or tag value may hold another unprintable one.
    if UNPRINTABLE.search(text):
        return None
    parts = text.split(",")
    measurement = parts[0]
    if not name_ok("measurement", measurement, lim):
        return None
    tags: dict[str, str] = {}
    for part in parts[1:]:
        key, _, value = part.partition("=")
        if not value or "=" in value or key in tags or not name_ok("tag", key, lim):
            return None
        tags[key] = value
    return measurement, tags


def parse_block(arr: pa.Array | None, parser: StreamParser,
                catalog: Callable[[str], Mapping[str, ColumnType]] | None = None) -> list[Piece] | None:
    """The block's rows as pieces per (measurement, day), committing names to `parser`'s schema and moving its
    line count on; None (nothing changed) if any line needs the exact parser, or if a column disagrees with
    `catalog(measurement)` (the table's columns in the catalog: the writer words that error, by line)."""
    if arr is None or parser.pending or not len(arr) or arr.null_count:
        return None
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        return None
    lim = parser.limits
    base = parser.lines_read
    offsets, raw = _buffers(arr)
    lengths = np.diff(offsets)
    if int(lengths.max()) > lim.max_line_bytes // 4:
        return None
    if _has_special_bytes(raw):
        return None
    present = lengths > 0
    rows = np.flatnonzero(present)
    if len(rows) == 0:
        return None
    if bool((raw[offsets[:-1][present]] == _HASH).any()):
        return None  # a comment line: the exact parser skips it (this path would store it as a table `#...`)
    live = arr.take(from_numpy(rows)) if len(rows) != len(arr) else arr
    parts = pc.split_pattern(live, " ")
    if not bool((to_numpy(pc.list_value_length(parts)) == 3).all()):
        return None  # leading, trailing or double spaces, a missing timestamp, a missing section
    head = pc.list_element(parts, _HEAD)
    body = pc.list_element(parts, _BODY)
    stamp = pc.list_element(parts, _STAMP)
    if not _all(pc.match_substring_regex(stamp, _STAMP_RE)):
        return None
    times = to_numpy(pc.cast(stamp, pa.int64()))
    multiplier = parser.precision.multiplier
    # Bounded in the input's unit, before scaling (a product past int64 would wrap around, not fail).
    if np.any(times < -(-TIME_MIN // multiplier)) or np.any(times > TIME_MAX // multiplier):
        return None  # a time out of range: the exact parser words the error
    times = times * multiplier

    # Heads: few distinct ones (series), each checked once as the scalar path would.
    head_enc = pc.dictionary_encode(head)
    head_texts = head_enc.dictionary.to_pylist()
    head_codes = to_numpy(head_enc.indices).astype(np.int64)
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

    # Fields: the common block with one layout straight from the bytes, any other the general way.
    fields = _uniform_fields(body, lim) or _general_fields(body, lim)
    if fields is None:
        return None
    layouts, sig_codes, sig_rows, typed = fields

    # Which (measurement -> tags, fields) the block uses; every combination must fit the column limit. Heads
    # with the same tag keys are checked once.
    tag_keys = [tuple(tags) for _, tags in heads]
    if len(layouts) == 1:
        pairs = [(h, 0) for h in range(len(heads))]
    else:
        pairs = [divmod(int(p), len(layouts))
                 for p in np.unique(head_codes * len(layouts) + sig_codes)]
    checked: set[tuple[tuple[str, ...], int]] = set()
    for h, s in pairs:
        if (tag_keys[h], s) in checked:
            continue
        checked.add((tag_keys[h], s))
        if len(tag_keys[h]) + len(layouts[s]) > lim.max_columns or not set(tag_keys[h]).isdisjoint(layouts[s]):
            return None

    # Names against each other and against the schema known so far (earlier blocks and the catalog).
    first_row_of_head = np.full(len(heads), len(live), dtype=np.int64)
    np.minimum.at(first_row_of_head, head_codes, np.arange(len(live)))
    # Each measurement's index, and each row's: the (measurement, layout) pairs and their first rows in one sort
    # (a mask per pair would cost a pass over the block per pair: quadratic over many measurements or layouts).
    names = sorted({measurement for measurement, _ in heads})
    index_of = {m: i for i, m in enumerate(names)}
    row_measurement = np.array([index_of[m] for m, _ in heads], dtype=np.int64)[head_codes]
    plan: dict[str, dict[str, tuple[ColumnType, int]]] = {}
    # A tag's line is the first line of any head holding it: found per (measurement, tag keys), heads in order.
    first_of_keys: dict[tuple[str, tuple[str, ...]], int] = {}
    for h, (measurement, _) in enumerate(heads):
        combo = (measurement, tag_keys[h])
        row = int(first_row_of_head[h])
        if combo not in first_of_keys or row < first_of_keys[combo]:
            first_of_keys[combo] = row
    for (measurement, keys), row in first_of_keys.items():
        cols = plan.setdefault(measurement, {})
        line = base + int(rows[row]) + 1
        for key in keys:
            prior = cols.get(key)
            if prior is None or line < prior[1]:
                cols[key] = (ColumnType.TAG, line)
    combos, first_rows = np.unique(row_measurement * len(layouts) + sig_codes, return_index=True)
    for combo_code, first in zip(combos.tolist(), first_rows.tolist()):
        m, s = divmod(combo_code, len(layouts))
        cols = plan[names[m]]
        line = base + int(rows[first]) + 1  # the first line of this layout with this measurement
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
    return _pieces(plan, names, row_measurement, heads, head_codes, sig_codes, sig_rows, typed, times,
                   base + rows + 1)


def _pieces(plan: Mapping[str, Mapping[str, tuple[ColumnType, int]]], names: list[str], row_measurement: np.ndarray,
            heads: list[tuple[str, dict[str, str]]], head_codes: np.ndarray, sig_codes: np.ndarray,
            sig_rows: list[np.ndarray], typed: list[dict[str, tuple[ColumnType, pa.Array]]], times: np.ndarray,
            line_numbers: np.ndarray) -> list[Piece]:
    """The accepted block's rows as one table per (measurement, day), in line order, each with the columns its
    rows have (as the exact path gives them). Rows are grouped in one stable sort, and every column is built from
    the values its rows hold: the cost is the pieces' own size, never (pieces or columns) x (rows of the block)."""
    n = len(times)
    days = np.floor_divide(times, NS_PER_DAY)
    if len(names) == 1 and days.min() == days.max():
        groups = [np.arange(n)]  # the usual block: one measurement, one day
    else:
        unique_days, day_index = np.unique(days, return_inverse=True)
        key = row_measurement * len(unique_days) + day_index
        order = np.argsort(key, kind="stable")
        groups = np.split(order, np.flatnonzero(np.diff(key[order])) + 1)
    # Each row's position among its layout's rows: where its field values lie in `typed`.
    at_in_layout = np.empty(n, dtype=np.int64)
    for rows_of in sig_rows:
        at_in_layout[rows_of] = np.arange(len(rows_of))
    pieces: list[Piece] = []
    for sel in groups:
        first = int(sel[0])
        measurement = names[int(row_measurement[first])]
        kinds = plan[measurement]
        count = len(sel)
        arrays: dict[str, pa.Array] = {}
        types: dict[str, ColumnType] = {}
        # Tags: each distinct head of the piece once, then each key's values spread over the rows.
        head_list, head_of_row = np.unique(head_codes[sel], return_inverse=True)
        by_key: dict[str, tuple[list[int], list[str]]] = {}
        for local, h in enumerate(head_list.tolist()):
            for tag, value in heads[h][1].items():
                slot = by_key.setdefault(tag, ([], []))
                slot[0].append(local)
                slot[1].append(value)
        # Every row its own head, in head order (each line a new series): the values per head are those per row.
        one_head_per_row = len(head_list) == count and bool((np.diff(head_list) > 0).all()) and bool(
            (head_of_row == np.arange(count)).all())
        for tag, (owners, values) in by_key.items():
            per_head = spread_strings(len(head_list), np.array(owners, dtype=np.int64), values)
            arrays[tag] = (per_head if one_head_per_row
                           else per_head.take(from_numpy(head_of_row.astype(np.int64))))
            types[tag] = ColumnType.TAG
        # Fields: each layout of the piece once, its rows' values taken, each key's parts spread over the rows.
        sigs = sig_codes[sel]
        if len(typed) == 1:
            by_layout = [(0, np.arange(count))]
        else:  # the piece's rows of each layout, in line order, from one stable sort
            order = np.argsort(sigs, kind="stable")
            cuts = np.flatnonzero(np.diff(sigs[order])) + 1
            by_layout = [(int(sigs[rows_of[0]]), rows_of) for rows_of in np.split(order, cuts)]
        parts: dict[str, list[tuple[np.ndarray, pa.Array]]] = {}
        for s, mine in by_layout:
            where = from_numpy(at_in_layout[sel[mine]])
            for field_key, (kind, values) in typed[s].items():
                if kinds[field_key][0] is kind:
                    parts.setdefault(field_key, []).append((mine, values.take(where)))
        for field_key, found in parts.items():
            if len(found) == 1 and len(found[0][0]) == count:
                arrays[field_key] = found[0][1]
            else:
                positions = np.concatenate([p for p, _ in found])
                arrays[field_key] = scatter(count, positions, pa.concat_arrays([v for _, v in found]))
            types[field_key] = kinds[field_key][0]
        types[TIME] = ColumnType.TIME
        arrays[TIME] = from_numpy(times[sel])
        schema = arrow_schema(types, with_seq=True)
        data = [arrays[f.name] if f.name != WRITE_SEQ else from_numpy(np.arange(count, dtype=np.int64))
                for f in schema]
        table = pa.Table.from_arrays(data, schema=schema)
        pieces.append(Piece(measurement, partition_of(int(days[first]) * NS_PER_DAY), types, table,
                            int(line_numbers[first]), int(line_numbers[int(sel[-1])])))
    return pieces  # in (measurement, day) order: the groups' sort key


def columns_of(pieces: list[Piece]) -> Mapping[str, Mapping[str, ColumnType]]:
    out: dict[str, dict[str, ColumnType]] = {}
    for p in pieces:
        out.setdefault(p.measurement, {}).update(p.columns)
    return out
