"""Line protocol input read in blocks of whole lines, so a write of any size holds one block at a time.

A block ends at a LF (never inside a UTF-8 sequence: LF is one byte that no multi-byte sequence contains), is
decoded strictly as UTF-8 by `lineprotocol.decode_utf8`, the first bad byte reported by its line and column in
the whole input, and is split into physical lines without their LF. The last block is whatever follows the last
LF (possibly an empty line, as `str.split` gives for a text ending in LF). A byte order mark at the very start of
the input is skipped here, once (a block or a bulk load's byte range that starts later is not the input's start).

Memory is bounded by the block and the longest line: a line longer than both the block and
`IOX_LP_MAX_LINE_BYTES` (so a bad line whatever it holds) stops the read with an error instead of being held
whole. A shorter line over the limit reaches the parser, which reports it as one bad line.
"""

from __future__ import annotations

import io
import sys
from typing import BinaryIO, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iox_planner.errors import BadInputError
from iox_planner.ingest.lineprotocol import BOM, Limits, check_text, decode_utf8, skip_bom
from iox_planner.userfiles import open_regular

BLOCK_BYTES = 16 * 1024 * 1024
_LF = 0x0A


def open_input(source: str) -> tuple[BinaryIO, str]:
    """FILE or `-` (standard input) as a binary stream, with a name for messages."""
    if source == "-":
        return sys.stdin.buffer, "standard input"
    return open_regular(source, source), source


class Block:
    """Whole lines of the input: the bytes between two LFs (without the last). `lines()` gives Python strings for
    the exact parser, `arrow()` an Arrow string array for the vectorized one; both check UTF-8 and number a bad
    byte in the whole input.

    The reader hands over its read buffer and where the block ends in it (`_end`), so the vectorized path reads
    the bytes where they are; `data` copies them out only for a caller that asks."""

    __slots__ = ("_buf", "_end", "_newlines", "final", "lines_before", "name")

    def __init__(self, data: bytes | None, final: bool, lines_before: int, name: str) -> None:
        self._buf: bytes | bytearray | None = data
        self._end = 0 if data is None else len(data)
        self._newlines: int | None = None
        self.final = final
        self.lines_before = lines_before
        self.name = name

    @classmethod
    def _of(cls, buf: bytes | bytearray, end: int, final: bool, lines_before: int, name: str) -> Block:
        block = cls(None, final, lines_before, name)
        block._buf, block._end = buf, end
        return block

    @property
    def data(self) -> bytes | None:
        """The block's bytes (a copy when the block is the front of a larger read buffer)."""
        if self._buf is None:
            return None
        if self._end == len(self._buf) and isinstance(self._buf, bytes):
            return self._buf
        return bytes(memoryview(self._buf)[:self._end])

    def lines(self) -> list[str]:
        data = self.data
        assert data is not None
        return decode_utf8(data, self.name, self.lines_before).split("\n")

    def arrow(self) -> pa.Array | None:
        """The lines as one Arrow string array."""
        if self._buf is None:
            return None
        # One binary value over the read buffer itself (no copy); the cast to string checks UTF-8.
        whole = pa.py_buffer(self._buf).slice(0, self._end)
        offsets = pa.py_buffer(np.array([0, self._end], dtype=np.int64 if self._end >= 2**31 else np.int32))
        kind = pa.large_binary() if self._end >= 2**31 else pa.binary()
        try:
            text = pa.Array.from_buffers(kind, 1, [None, offsets, whole]).cast(
                pa.large_string() if self._end >= 2**31 else pa.string())
        except pa.ArrowInvalid:
            data = self.data
            assert data is not None
            decode_utf8(data, self.name, self.lines_before)  # raises, naming the line and column
            raise
        lines = pc.split_pattern(text, "\n").flatten()
        self._newlines = len(lines) - 1
        return lines

    def newlines(self) -> int:
        """How many LFs the block holds (known without a pass once `arrow()` has split it)."""
        if self._newlines is None:
            self._newlines = 0 if self._buf is None else int(
                np.count_nonzero(np.frombuffer(self._buf, dtype=np.uint8, count=self._end) == _LF))
        return self._newlines


def _line_too_long(name: str, line: int, size: int, limit: int) -> BadInputError:
    return BadInputError(
        f"cannot read {name}: line {line} is more than {size:,} bytes long without a line end, over the "
        f"maximum line length of {limit:,} bytes (IOX_LP_MAX_LINE_BYTES); reading stopped there rather than hold "
        "it whole in memory and nothing was written. Is the input line protocol (lines ending in LF)? Split the "
        "line, or raise IOX_LP_MAX_LINE_BYTES if such lines are expected")


def _read_start(stream: BinaryIO, block_bytes: int) -> bytes:
    """The first read of an input, without its byte order mark (read on until the mark is whole or ruled out)."""
    data = stream.read(block_bytes)
    while data and len(data) < len(BOM) and BOM.startswith(data):
        more = stream.read(block_bytes)
        if not more:
            break
        data += more
    if data.startswith(BOM):
        data = skip_bom(data) or stream.read(block_bytes)
    return data


def line_blocks(stream: BinaryIO, name: str, block_bytes: int = BLOCK_BYTES,
                max_line_bytes: int | None = None, start_of_input: bool = True) -> Iterator[Block]:
    """The whole stream as blocks of whole lines, in order. A line that grows past both `block_bytes` and
    `max_line_bytes` (default `IOX_LP_MAX_LINE_BYTES`) without a LF raises `BadInputError`. `start_of_input`: the
    stream starts where the input does, so a byte order mark there is skipped (False for a later byte range)."""
    limit = Limits.from_env().max_line_bytes if max_line_bytes is None else max_line_bytes
    bound = max(block_bytes, limit)
    pending = b""
    lines_before = 0
    first = start_of_input
    while True:
        data = _read_start(stream, block_bytes) if first else stream.read(block_bytes)
        first = False
        if not data:
            yield Block(pending, True, lines_before, name)
            return
        buf = pending + data if pending else data
        cut = buf.rfind(b"\n", len(pending))
        if cut < 0:
            if len(buf) > bound:
                raise _line_too_long(name, lines_before + 1, bound, limit)
            pending = buf  # one line longer than a block: keep reading, up to the bound
            continue
        # The block is the front of `buf` up to its last LF; what follows is the start of the next block.
        block = Block._of(buf, cut, False, lines_before, name)
        pending = buf[cut + 1:]
        yield block
        lines_before += block.newlines() + 1  # counted by the consumer's arrow() already, or counted here


def text_blocks(text: str, name: str = "input", block_bytes: int = BLOCK_BYTES) -> Iterator[Block]:
    """The same blocks over a text already in memory (a lone surrogate in it is refused: `check_text`)."""
    check_text(text, name)
    yield from line_blocks(io.BytesIO(text.encode("utf-8")), name, block_bytes)
