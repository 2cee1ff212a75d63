"""Line protocol input read in blocks of whole lines, so a write of any size holds one block at a time.

A block ends at a LF (never inside a UTF-8 sequence: LF is one byte that no multi-byte sequence contains), is
decoded strictly as UTF-8 with the first bad byte reported by its line and column in the whole input (as
`lineprotocol.decode_utf8` does for a whole text), and is split into physical lines without their LF. The last
block is whatever follows the last LF (possibly an empty line, as `str.split` gives for a text ending in LF).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import BinaryIO, Iterator

from iox_planner.errors import BadInputError

BLOCK_BYTES = 4 * 1024 * 1024


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


def _decode(data: bytes, name: str, line_before: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        start = data.rfind(b"\n", 0, err.start) + 1
        line = line_before + data.count(b"\n", 0, err.start) + 1
        column = len(data[start:err.start].decode("utf-8", "replace")) + 1
        bad = data[err.start:err.end].hex(" ")
        raise BadInputError(
            f"cannot read {name}: it is not UTF-8 text: line {line}, column {column}: byte(s) {bad} {err.reason}. "
            "Line protocol is UTF-8; convert the input (for example with iconv -t UTF-8) and write again"
        ) from None


def line_blocks(stream: BinaryIO, name: str, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[list[str], bool]]:
    """(physical lines, whether this is the last block) for the whole stream, in order."""
    pending = b""
    lines_before = 0
    while True:
        data = stream.read(block_bytes)
        if not data:
            yield _decode(pending, name, lines_before).split("\n"), True
            return
        pending += data
        cut = pending.rfind(b"\n")
        if cut < 0:
            continue  # one line longer than a block: keep reading (the parser's line limit bounds what it keeps)
        whole, pending = pending[:cut], pending[cut + 1:]
        lines = _decode(whole, name, lines_before).split("\n")
        lines_before += len(lines)
        yield lines, False


def text_blocks(text: str, block_lines: int = 65_536) -> Iterator[tuple[list[str], bool]]:
    """The same blocks over a text already in memory."""
    lines = text.split("\n")
    for start in range(0, len(lines), block_lines):
        yield lines[start:start + block_lines], start + block_lines >= len(lines)
