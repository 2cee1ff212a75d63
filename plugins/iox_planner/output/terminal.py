"""What iox-batch shows a person: every string is text, never markup and never a terminal command.

All human output of the CLI (tables, messages, reports, progress lines) goes through `PlainConsole`. Its
`render_str` is the one place rich turns a `str` into styled text, for `print` and for every table cell, header,
title and caption alike; there it reads no markup and no `:emoji:` codes and shows control characters as escapes.
So a tag value `[/]`, an alias `[red]x[/]`, a name `:warning:` or a string field holding ESC sequences (a clear
screen, an OSC 8 hyperlink) is printed as the characters it is: it can neither fail the rendering nor rewrite the
user's terminal; bidi controls and zero-width characters print as escapes too, so a value cannot reorder a row on
screen. `PlainTable` also keeps each cell on one line, so a value cannot forge rows.

A console made `best_effort` never fails its command: it reports work that is already committed, and a reader
that went away or a terminal that cannot encode a name must not turn a committed write into a failed one
(`lost` says what happened, for the caller to mention once)."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from rich.console import Console, HighlighterType, JustifyMethod, OverflowMethod, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text

# Terminals act on C0 and C1 control characters (ESC starts CSI/OSC sequences, U+009B is an 8-bit CSI, CR moves
# the cursor back over what was printed); lone surrogates cannot be written as UTF-8 at all. Each is shown as the
# escape Python would write for it. A backslash is left as it is: escaping it too would double every backslash of
# ordinary data (Windows paths, regexes) to disambiguate a rare value that spells out `\x1b` itself.
_NAMED = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
_ONE_LINE = {cp: _NAMED.get(cp, f"\\x{cp:02x}") for cp in [*range(0x20), *range(0x7F, 0xA0)]}
_ONE_LINE.update({cp: f"\\u{cp:04x}" for cp in range(0xD800, 0xE000)})
# Characters that change how the text around them shows without being seen themselves: bidi embeddings, overrides
# and isolates (U+202A-U+202E, U+2066-U+2069, and the Arabic letter mark U+061C) reorder what follows them, so a
# row could display its cells in another order or a name read as another; zero-width characters (U+200B-U+200F,
# U+2060, U+FEFF) make two different names look alike. Each is shown as its escape too.
INVISIBLE = (0x061C, *range(0x200B, 0x2010), *range(0x202A, 0x202F), 0x2060, *range(0x2066, 0x206A), 0xFEFF)
_ONE_LINE.update({cp: f"\\u{cp:04x}" for cp in INVISIBLE})
# Messages and plans keep their own line breaks and indentation.
_LINES = {cp: text for cp, text in _ONE_LINE.items() if cp not in (0x09, 0x0A)}

# Off a terminal (pipes, files, CI logs) rich would wrap at 80 columns: never wrap there, since a reader of piped
# output wants whole lines.
_PIPE_WIDTH = 1000


def visible(text: str, *, one_line: bool = False) -> str:
    """`text` with every control character, lone surrogate, bidi control and zero-width character replaced by its
    escape; newlines and tabs kept unless `one_line`."""
    return text.translate(_ONE_LINE if one_line else _LINES)


class PlainConsole(Console):
    """A rich Console that renders every string literally (see the module docstring), whatever a caller asks."""

    def __init__(self, *, best_effort: bool = False, **options: Any) -> None:
        super().__init__(markup=False, emoji=False, highlight=False, **options)
        self.best_effort = best_effort
        self.lost: BaseException | None = None

    def reset(self) -> None:
        """Print again after a failure (the next command run in this process has its own streams)."""
        self.lost = None
        self.quiet = False

    def render_str(self, text: str, *, style: str | Style = "", justify: JustifyMethod | None = None,
                   overflow: OverflowMethod | None = None, emoji: bool | None = None, markup: bool | None = None,
                   highlight: bool | None = None, highlighter: HighlighterType | None = None) -> Text:
        # `markup`, `emoji` and `highlight` are ignored on purpose: no caller can turn interpretation back on.
        return Text(visible(text), style=style, justify=justify, overflow=overflow)

    def print(self, *objects: Any, **options: Any) -> None:
        if self.lost is not None:
            return  # the stream failed once: the rest of the report would fail the same way
        try:
            super().print(*objects, **options)
        except (OSError, UnicodeError, ValueError) as error:  # a closed pipe or file, a full disk, an encoding
            if not self.best_effort:
                raise
            self.lost = error

    def on_broken_pipe(self) -> None:
        # rich's default raises SystemExit(1): a reader that went away would make a committed write "fail".
        # Handled where the command's outcome is decided instead (`print` above, the CLI's main).
        self.quiet = True
        raise BrokenPipeError("the reader of the output went away")


def _is_terminal(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def console(file: TextIO | None = None, *, stderr: bool = False, best_effort: bool = False) -> PlainConsole:
    """The console for `file`, or for standard output (standard error) as it is when printing (`file=None`)."""
    stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
    return PlainConsole(file=file, stderr=stderr, best_effort=best_effort, soft_wrap=True,
                        width=None if _is_terminal(stream) else _PIPE_WIDTH)


class PlainTable(Table):
    """A rich Table whose text cells and headers are one line each, control characters escaped."""

    def add_column(self, header: RenderableType = "", footer: RenderableType = "", **options: Any) -> None:
        super().add_column(_cell(header), _cell(footer), **options)

    def add_row(self, *renderables: RenderableType | None, **options: Any) -> None:
        super().add_row(*[_cell(r) for r in renderables], **options)


def _cell(value: Any) -> Any:
    return visible(value, one_line=True) if isinstance(value, str) else value
