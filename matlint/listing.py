"""Rows that print as a table on a terminal wide enough for it, else as a list.

`matlint rule` and the runtime guard's report use it. A table with a wrapped last column is only
readable when that column is wide; below that, and whenever the output is not a terminal (a pipe,
a file), each row prints as a block: its key (a rule code) and a head line, then the rest
indented under the head, wrapped at spaces to the console's width. Nothing is cut with an
ellipsis, and the list draws no box characters.
"""
from __future__ import annotations

import re
from typing import NamedTuple, Optional

# The table is used only where its last column (a summary, a fix) gets this many cells.
MIN_LAST_COLUMN = 60


class Entry(NamedTuple):
    """One row in the list layout: `key  head`, then each of `below` indented under the head."""

    key: str
    head: object  # str or rich Text
    below: tuple = ()


def _cells(value) -> int:
    from rich.cells import cell_len

    return max((cell_len(line) for line in str(value).splitlines()), default=0)


def table_fits(console, headers, rows) -> bool:
    """Whether a boxed table of `rows` leaves its last column MIN_LAST_COLUMN cells on `console`."""
    if not console.is_terminal:
        return False
    widths = [max(_cells(cell) for cell in column) for column in zip(headers, *rows)][:-1]
    # Each column takes a cell of padding on both sides and one border; the table one more border.
    last = console.width - sum(w + 3 for w in widths) - 4
    return last >= MIN_LAST_COLUMN


def print_listing(console, headers, rows, entries, title: Optional[str] = None) -> None:
    """`rows` under `headers` as a table when it fits, else `entries` (None for a blank line) as a list."""
    from rich.table import Table
    from rich.text import Text

    if table_fits(console, headers, rows):
        table = Table(title=title)
        for i, header in enumerate(headers):
            table.add_column(header, no_wrap=i < len(headers) - 1, overflow="fold")
        for row in rows:
            table.add_row(*map(Text, row))  # text as it is: a `[i]` in it is no markup
        console.print(table)
        return
    margin = max((len(entry.key) for entry in entries if entry), default=0) + 2
    for entry in entries:
        if entry is None:
            console.print()
            continue
        block = Text.assemble(entry.head)
        for line in entry.below:
            block.append("\n")
            block.append(line)
        print_hanging(console, Text(entry.key, "bold"), block, margin)


def _line_starts(text: str, width: int) -> list:
    """Where the lines of `text` wrapped at `width` cells start: at spaces only, so a word longer
    than a line (a deep path) stays whole on a line of its own."""
    from rich.cells import cell_len

    starts, used = [], 0
    for word in re.finditer(r"\s*\S+\s*", text):
        if used and used + cell_len(word.group().rstrip()) > width:
            starts.append(word.start())
            used = 0
        used += cell_len(word.group())
    return starts


def print_hanging(console, key, text, margin: int) -> None:
    """`key` then `text` wrapped at spaces, its lines indented by `margin` cells under the first.

    A line too long for the terminal (a path longer than it) is left to the terminal to wrap as it
    shows it: the text copied from the screen or read from a log has the path whole.
    """
    from rich.text import Text

    width = max(console.width - margin, 20)
    lines = [part for line in Text.assemble(text).split(allow_blank=True)
             for part in line.divide(_line_starts(line.plain, width))]
    for i, line in enumerate(lines):
        line = Text.assemble(Text.assemble(key, " " * (margin - len(key))) if i == 0 else " " * margin, line)
        line.rstrip()
        console.print(line, soft_wrap=True)
