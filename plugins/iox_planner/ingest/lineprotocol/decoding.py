"""An input as text: strict UTF-8 with the first bad byte reported by line and column, a byte order mark
skipped at the very start only, a lone surrogate refused."""

from __future__ import annotations

from iox_planner.catalog.names import describe_char
from iox_planner.errors import BadInputError


BOM = b"\xef\xbb\xbf"
"""U+FEFF in UTF-8. At the very start of an input (a file, standard input, a text) it is a byte order mark, which
Windows tools write, and is skipped; the reference would make it part of the first measurement name. Anywhere else
it is refused in names and tag values (`catalog.names.UNPRINTABLE`), so that concatenated files cannot hide it
either."""


def skip_bom(data: bytes) -> bytes:
    """`data`, the start of an input, without its byte order mark."""
    return data[len(BOM):] if data.startswith(BOM) else data


def check_text(text: str, source: str) -> None:
    """Refuse a text holding a lone surrogate (a YAML escape or a Python caller can make one; no UTF-8 encodes
    it), naming its line and column, as `decode_utf8` names a bad byte."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        start = text.rfind("\n", 0, err.start) + 1
        line = text.count("\n", 0, err.start) + 1
        raise BadInputError(
            f"cannot read {source}: it is not Unicode text: line {line}, column {err.start - start + 1}: "
            f"{describe_char(text[err.start])}, which no UTF-8 encodes. Line protocol is UTF-8; fix the input (a "
            "YAML \\u escape?) and try again"
        ) from None


def decode_utf8(data: bytes, source: str, lines_before: int = 0) -> str:
    """The text of `data`, strictly UTF-8: the first byte that is not is reported by line and column (in
    characters) and nothing is read. A byte order mark stays: the reader of an input skips one at its very start
    (`skip_bom`), the parser refuses one anywhere else. CR bytes stay as they are: the parser decides what a CR
    means. `lines_before`: lines of the input before `data` (a block of a streamed input), so the line number
    counts in the whole input."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        start = data.rfind(b"\n", 0, err.start) + 1
        line = lines_before + data.count(b"\n", 0, err.start) + 1
        column = len(data[start:err.start].decode("utf-8", "replace")) + 1
        bad = data[err.start:err.end].hex(" ")
        raise BadInputError(
            f"cannot read {source}: it is not UTF-8 text: line {line}, column {column}: byte(s) {bad} {err.reason}. "
            "Line protocol is UTF-8; convert the input (for example with iconv -t UTF-8) and write again"
        ) from None
