"""Tables that fit the terminal, for the terminal renderers. (The figures in words are
gpuprof.units: renderers import them from there.)"""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


class FitTable:
    """A table whose columns are never squeezed: every cell keeps its text on one line. When
    the columns do not fit the width, they are split into several tables, each repeating the
    first (label) column, so no cell is truncated ("backwa…") or wrapped ("1.07 / GB")."""

    def __init__(self, headers: list[tuple[str, str]], rows: list[list], **table_kwargs):
        self.headers = headers  # (header, justify)
        self.rows = rows
        self.kwargs = table_kwargs

    def _table(self, cols: list[int]) -> Table:
        t = Table(**self.kwargs)
        for i in cols:
            header, justify = self.headers[i]
            t.add_column(header, justify=justify, no_wrap=True)
        for row in self.rows:
            t.add_row(*[row[i] for i in cols])
        return t

    def _need(self, console: Console, options: ConsoleOptions, cols: list[int]) -> int:
        """The width a table of these columns needs on one line per cell (measured unclamped)."""
        return Measurement.get(console, options.update(width=10_000), self._table(cols)).maximum

    def _groups(self, console: Console, options: ConsoleOptions) -> list[list[int]]:
        width = options.max_width
        groups: list[list[int]] = []
        current = [0]
        for i in range(1, len(self.headers)):
            trial = current + [i]
            if len(current) > 1 and self._need(console, options, trial) > width:
                groups.append(current)
                current = [0, i]
            else:
                current = trial
        groups.append(current)
        return groups

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for i, group in enumerate(self._groups(console, options)):
            if i:
                yield Text("")  # a continuation: the next columns, under the first ones
            yield self._table(group)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        need = max(self._need(console, options, g) for g in self._groups(console, options))
        return Measurement(need, need).clamp(max_width=options.max_width)
