"""The layout of `gpuprof watch` beyond diagnose's: the live display (diagnose's, over the recent
steps only, so that it holds bounded memory), a line per window, change and periodic event as
the run goes, and the section after the final report. Words: gpuprof.report.watch."""

from __future__ import annotations

from rich.console import Console

from gpuprof.render.live import LiveProgress
from gpuprof.report.watch import WatchSection, event_lines

RECENT_STEPS = 256  # the live panel's figures are over the last steps (a run of days has millions)
RENDER_EVERY_S = 0.25  # the panel is redrawn at most this often (rich refreshes it 4 times a second)


class WatchDisplay(LiveProgress):
    """diagnose's live progress, its figures over the last RECENT_STEPS..2×RECENT_STEPS steps, and
    each window, change and periodic event printed as a line on stderr (above the panel on a
    terminal)."""

    _rendered = -1e9

    def on_step(self, rec: dict) -> None:
        super().on_step(rec)
        if len(self._records) > 2 * RECENT_STEPS:
            del self._records[:RECENT_STEPS]

    def _show(self, final: bool = False) -> None:
        """On a terminal, the panel's figures (the typical step over up to 2 × RECENT_STEPS steps)
        are computed at most every RENDER_EVERY_S, not at every step: a step of a few ms must not
        pay a few hundred µs of statistics each time."""
        if self._live is not None and not final:
            now = self._clock()
            if now - self._rendered < RENDER_EVERY_S:
                return
            self._rendered = now
        super()._show(final)

    def on_event(self, ev: dict) -> None:
        if not self.enabled:
            return
        for line in event_lines(ev):
            self.console.print(line, highlight=False, markup=False, soft_wrap=True)


def render_watch_section(view: WatchSection, console: Console) -> None:
    """The section after diagnose's report."""
    console.print()
    console.print(view.title, style="bold", highlight=False, markup=False)
    console.print(view.summary, highlight=False, markup=False)
    for i, (line, causes) in enumerate(view.changes, 1):
        console.print(f"{i}. {line}", highlight=False, markup=False)
        console.print(f"   {causes}", highlight=False, markup=False)
    if view.none_line:
        console.print(view.none_line, highlight=False, markup=False)
    for line in view.periodic:
        console.print(f"• {line}", highlight=False, markup=False)
    console.print(view.rule, style="dim", highlight=False, markup=False)
    if view.events_line:
        console.print(view.events_line, highlight=False, markup=False)
