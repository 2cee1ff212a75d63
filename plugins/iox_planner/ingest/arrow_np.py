"""Arrow arrays to and from numpy through their buffers, never through pyarrow's converters.

`pa.array(...)`, `Array.to_numpy()` and a Python number passed to a compute function all go through pyarrow's
pandas shim, which imports pandas the first time: about a third of a CPU-second, more than the whole parse of
100,000 lines. The write path (blocks, the vectorized parser, chunk building) uses these instead, and
`tests/ingest/test_stream_write.py` checks that a write imports neither pandas nor the planner.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

_TYPES: dict[np.dtype[Any], pa.DataType] = {
    np.dtype(np.int64): pa.int64(), np.dtype(np.int32): pa.int32(), np.dtype(np.uint64): pa.uint64(),
    np.dtype(np.float64): pa.float64()}
_DTYPES = {v: k for k, v in _TYPES.items()}


def from_numpy(values: np.ndarray) -> pa.Array:
    """A 1-D numpy array of int64, int32, uint64 or float64 as an Arrow array without nulls (no copy when it is
    contiguous)."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(_TYPES[values.dtype], len(values), [None, pa.py_buffer(values)])


def to_numpy(arr: pa.Array) -> np.ndarray:
    """A primitive Arrow array without nulls (int, uint, float; not boolean) as a read-only numpy view."""
    if arr.null_count:
        raise ValueError("to_numpy: the array has nulls")
    dtype = _DTYPES[arr.type]
    view: np.ndarray = np.frombuffer(arr.buffers()[1], dtype=dtype)
    return view[arr.offset:arr.offset + len(arr)]


def strings(values: Sequence[str | None]) -> pa.Array:
    """Python strings (None for null) as an Arrow string array."""
    n = len(values)
    texts = [v if v is not None else "" for v in values]
    joined = "".join(texts)
    if joined.isascii():  # the usual case: one encode, lengths in characters are lengths in bytes
        data = joined.encode("ascii")
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=n)
    else:
        encoded = [t.encode("utf-8") for t in texts]
        data = b"".join(encoded)
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    wide = int(offsets[-1]) >= 2**31
    return pa.Array.from_buffers(pa.large_string() if wide else pa.string(), n,
                                 [_validity(values), pa.py_buffer(offsets if wide else offsets.astype(np.int32)),
                                  pa.py_buffer(data)])


def _validity(values: Sequence[object]) -> pa.Buffer | None:
    """Arrow's validity bitmap of Python values (None: null), or None when none is null."""
    if None not in values:
        return None
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def column(values: Sequence[Any], type: pa.DataType) -> pa.Array:
    """Python values (None for null) as an Arrow array of `type`: int64, uint64, float64, bool or string, the
    types of line protocol's columns. What `pa.array(values, type)` gives, without its pandas check."""
    n = len(values)
    if type == pa.string():
        return strings(values)
    if type == pa.bool_():
        bits = np.fromiter((v is True for v in values), dtype=bool, count=n)
        return pa.Array.from_buffers(pa.bool_(), n, [_validity(values),
                                                     pa.py_buffer(np.packbits(bits, bitorder="little"))])
    dtype = _DTYPES[type]
    zero = dtype.type(0)
    data = np.fromiter((zero if v is None else v for v in values), dtype=dtype, count=n)
    return pa.Array.from_buffers(type, n, [_validity(values), pa.py_buffer(data)])


def scatter(n: int, positions: np.ndarray, values: pa.Array) -> pa.Array:
    """An array of `n` nulls with `values[i]` at `positions[i]` (distinct positions): one take whose missing
    indices are null. Builds a sparse column in time proportional to `n`, never through Python objects per row."""
    if len(positions) == n and bool((positions == np.arange(n)).all()):
        return values
    index = np.zeros(n, dtype=np.int64)
    index[positions] = np.arange(len(positions), dtype=np.int64)
    valid = np.zeros(n, dtype=bool)
    valid[positions] = True
    indices = pa.Array.from_buffers(pa.int64(), n, [pa.py_buffer(np.packbits(valid, bitorder="little")),
                                                    pa.py_buffer(index)])
    return values.take(indices)


def spread_strings(n: int, positions: np.ndarray, values: Sequence[str]) -> pa.Array:
    """A string array of `n` rows, `values[i]` at `positions[i]` (ascending), null elsewhere, built from its
    buffers: a few numpy passes over `n`, far cheaper than a take (a wide table's columns are mostly null)."""
    if len(positions) == n:
        return strings(values)
    texts = list(values)
    joined = "".join(texts)
    if joined.isascii():
        data = joined.encode("ascii")
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    else:
        encoded = [t.encode("utf-8") for t in texts]
        data = b"".join(encoded)
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    wide = len(data) >= 2**31
    per_row = np.zeros(n + 1, dtype=np.int64 if wide else np.int32)
    per_row[positions + 1] = lengths
    offsets = np.cumsum(per_row, dtype=per_row.dtype)
    valid = np.zeros(n, dtype=bool)
    valid[positions] = True
    return pa.Array.from_buffers(pa.large_string() if wide else pa.string(), n,
                                 [pa.py_buffer(np.packbits(valid, bitorder="little")), pa.py_buffer(offsets),
                                  pa.py_buffer(data)])
