"""Line protocol input read in blocks of whole lines, so a write of any size holds one block at a time.

A block ends at a LF (never inside a UTF-8 sequence: LF is one byte that no multi-byte sequence contains), is
decoded strictly as UTF-8 by `lineprotocol.decode_utf8`, the first bad byte reported by its line and column in
the whole input, and is split into physical lines without their LF. The last block is whatever follows the last
LF (possibly an empty line, as `str.split` gives for a text ending in LF).
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import BinaryIO, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from iox_planner.errors import BadInputError
from iox_planner.ingest.lineprotocol import decode_utf8

BLOCK_BYTES = 16 * 1024 * 1024


def open_input(source: str) -> tuple[BinaryIO, str]:
    """FILE or `-` (standard input) as a binary stream, with a name for messages."""
    if source == "-":
        return sys.stdin.buffer, "standard input"
    try:
        return open(Path(source), "rb"), source
    except FileNotFoundError as err:
        raise BadInputError(f"cannot read {source}: no such file") from err
    except IsADirectoryError as err:
        raise BadInputError(f"cannot read {source}: it is a folder, not a file") from err
    except PermissionError as err:
        raise BadInputError(f"cannot read {source}: permission denied") from err


class Block:
    """Whole lines of the input: the bytes between two LFs (without the last), or lines already split (a text
    that was never bytes). `lines()` gives Python strings for the exact parser, `arrow()` an Arrow string array
    for the vectorized one; both check UTF-8 and number a bad byte in the whole input."""

    __slots__ = ("data", "text_lines", "final", "lines_before", "name")

    def __init__(self, data: bytes | None, final: bool, lines_before: int, name: str,
                 text_lines: list[str] | None = None) -> None:
        self.data = data
        self.text_lines = text_lines
        self.final = final
        self.lines_before = lines_before
        self.name = name

    def lines(self) -> list[str]:
        if self.text_lines is not None:
            return self.text_lines
        assert self.data is not None
        return decode_utf8(self.data, self.name, self.lines_before).split("\n")

    def arrow(self) -> pa.Array | None:
        """The lines as one Arrow string array (None for a block given as Python strings)."""
        if self.data is None:
            return None
        try:
            text = pa.array([self.data], pa.binary()).cast(pa.string())
        except pa.ArrowInvalid:
            decode_utf8(self.data, self.name, self.lines_before)  # raises, naming the line and column
            raise
        return pc.split_pattern(text, "\n").flatten()


def line_blocks(stream: BinaryIO, name: str, block_bytes: int = BLOCK_BYTES) -> Iterator[Block]:
    """The whole stream as blocks of whole lines, in order."""
    pending = b""
    lines_before = 0
    while True:
        data = stream.read(block_bytes)
        if not data:
            yield Block(pending, True, lines_before, name)
            return
        pending += data
        cut = pending.rfind(b"\n")
        if cut < 0:
            continue  # one line longer than a block: keep reading (the parser's line limit bounds what it keeps)
        whole, pending = pending[:cut], pending[cut + 1:]
        yield Block(whole, False, lines_before, name)
        lines_before += whole.count(b"\n") + 1


def text_blocks(text: str, name: str = "input", block_bytes: int = BLOCK_BYTES) -> Iterator[Block]:
    """The same blocks over a text already in memory."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: never from decoded input, but the exact parser takes any str
        yield Block(None, True, 0, name, text.split("\n"))
        return
    yield from line_blocks(io.BytesIO(data), name, block_bytes)
