"""Tables for the command line, drawn by rich: no borders, two spaces between columns, so scripts can
still split a row on whitespace.

A key is never cut or wrapped: columns wrap only where asked (free text such as notes or a payload),
and the console is never narrower than the table needs without wrapping the others. Written to a
pipe or a file, nothing wraps at all and no colour codes are written; bold headers are for a terminal.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterable, Sequence

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

# Wide enough for any row a ledger holds; rich then lays the table out at its natural width.
_NOT_A_TERMINAL_WIDTH = 100_000
_GAP = 2  # spaces between columns


def table_lines(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    wrap: Collection[str] = (),
    show_header: bool = True,
) -> list[str]:
    """`rows` under `headers`, one string a line; columns named in `wrap` may wrap in a terminal."""
    table = _borderless(show_header=show_header)
    for header in headers:
        table.add_column(header, no_wrap=header not in wrap, overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    wraps = [header in wrap for header in headers]
    cells = [list(headers)] if show_header else []
    return _render(table, [*cells, *map(list, rows)], wraps)


def field_lines(fields: Iterable[tuple[str, str]]) -> list[str]:
    """`label  value` lines, labels aligned; a long value wraps under itself in a terminal."""
    pairs = list(fields)
    grid = _borderless(show_header=False)
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    for label, value in pairs:
        grid.add_row(Text(label), Text(value))
    return _render(grid, [[label, value] for label, value in pairs], [False, True])


def _borderless(*, show_header: bool) -> Table:
    # Table.grid would collapse the padding of neighbouring cells to one space.
    return Table(
        box=None,
        show_header=show_header,
        show_edge=False,
        pad_edge=False,
        padding=(0, _GAP // 2),
        header_style="bold",
    )


def _least_width(cells: Sequence[Sequence[str]], wraps: Sequence[bool]) -> int:
    """The narrowest console that fits every unwrapped column whole (a wrapped one to its longest word)."""
    widths = [0] * len(wraps)
    for row in cells:
        for i, cell in enumerate(row):
            longest = max((len(word) for word in cell.split()), default=0) if wraps[i] else len(cell)
            widths[i] = max(widths[i], longest)
    return sum(widths) + _GAP * (len(widths) - 1)


def _render(renderable: RenderableType, cells: Sequence[Sequence[str]], wraps: Sequence[bool]) -> list[str]:
    terminal = sys.stdout.isatty()
    width = _NOT_A_TERMINAL_WIDTH
    if terminal:
        width = max(Console().width, _least_width(cells, wraps))
    console = Console(
        width=width,
        no_color=not terminal,
        color_system="auto" if terminal else None,
        highlight=False,
        markup=False,
        emoji=False,
    )
    with console.capture() as captured:
        console.print(renderable)
    return [line.rstrip() for line in captured.get().splitlines()]
