"""The terminal timeline of one typical step (gpuprof.report.timeline decides the step, its spans
and its caption): a row per phase on a common time axis, and on CUDA a GPU row, drawn to the
width there is. Builds renderables; never prints."""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text

from gpuprof.report.timeline import IDLE, TimelineView

COLORS = {"data": "yellow", "h2d": "magenta", "forward": "cyan", "backward": "blue", "comm": "bright_red",
          "optimizer": "green", "other": "white", "eval": "red"}
GLYPHS = "░▒▓█"  # the share of a character's time the phase ran: < 25%, < 50%, < 75%, more
MIN_BAR = 10


def coverage(spans: list[tuple[float, float]], total: float, width: int) -> list[float]:
    """For each of `width` equal cells of [0, total), the fraction of it the spans cover."""
    cells = [0.0] * width
    if total <= 0 or width <= 0:
        return cells
    w = total / width
    for a, b in spans:
        i = max(int(a / w), 0)
        while i < width and i * w < b:
            lo, hi = max(a, i * w), min(b, (i + 1) * w)
            if hi > lo:
                cells[i] += (hi - lo) / w
            i += 1
    return [min(c, 1.0) for c in cells]


def glyph(c: float) -> str:
    if c <= 1e-9:
        return " "
    return GLYPHS[min(int(c * 4), 3)]


class FillBar:
    """A one-line bar that fills the width it is given (a table's expanding column): `draw(width)`
    returns the characters for that width."""

    def __init__(self, draw, style: str):
        self.draw = draw  # width -> str of that length
        self.style = style

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(MIN_BAR, options.max_width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(options.max_width, 1)
        yield Segment(self.draw(width), Style.parse(self.style))
        yield Segment.line()


class _Axis(FillBar):
    def __init__(self, right: str):
        def draw(width: int) -> str:
            inner = width - 1 - len(right) - 2
            if inner < 1:
                return ("0" + " " * width)[:width]
            return "0 " + "─" * (inner - 1) + "┤ " + right
        super().__init__(draw, "dim")


def timeline_panel(v: TimelineView) -> Group:
    """The rows of a TimelineView on the width there is, its axis, its title and caption."""
    t = Table.grid(padding=(0, 1), expand=True)
    t.add_column(no_wrap=True)
    t.add_column(ratio=1, no_wrap=True)
    for name, spans in v.rows:
        t.add_row(Text(name), FillBar(lambda w, spans=spans: "".join(glyph(c) for c in coverage(spans, v.total_s, w)),
                                   COLORS.get(name, "white")))
    if v.gpu_busy is not None:
        def gpu_row(w: int) -> str:
            b, i = coverage(v.gpu_busy, v.total_s, w), coverage(v.gpu_idle or (), v.total_s, w)
            return "".join(IDLE if ib > bb and ib > 1e-9 else glyph(bb) for bb, ib in zip(b, i))

        t.add_row(Text(v.gpu_label, style="bold"), FillBar(gpu_row, "green"))
    t.add_row(Text(""), _Axis(v.total_text))
    return Group(Text(v.title, style="bold"), t, Text(v.caption, style="dim"))
