"""Live progress while `diagnose` runs: where it is (warmup k/K, measured n/N, then each post-run
measurement) and the answer forming, from each closed step's host figures: the typical step so
far as the report decides it, the last step, tokens/s, the phase shares, and on a GPU its
utilization (the NVML sampler's latest sample): gpuprof.report.live words every line, this
module lays them out.

On a terminal (stdout and stderr both), a rich Live panel on stderr; the script's stdout and
stderr are redirected through rich while it is up, so their lines print whole above the panel
instead of being overwritten by it. Otherwise, plain lines on stderr: one when warmup ends, one
every few seconds of measured steps, one per post-run part. Nothing at all under --json (the
caller passes enabled=False).
"""

from __future__ import annotations

import time
from typing import Callable

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from gpuprof.report.live import LiveView, live_view, post_plain_line

PLAIN_EVERY_S = 5.0  # plain mode: at most one step line this often
BAR = 30


class LiveProgress:
    def __init__(self, console: Console, *, what: str, warmup: int, steps: int | None, enabled: bool = True,
                 live: bool | None = None, gpu_sample: Callable[[], dict | None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.console = console
        self.what = what
        self.warmup, self.steps = warmup, steps
        self.enabled = enabled
        self.live = (console.is_terminal and _stdout_is_terminal()) if live is None else live
        self.gpu_sample = gpu_sample
        self._clock = clock
        self._done = 0
        self._records: list[dict] = []  # the measured steps' listener records
        self._post: str | None = None
        self._live: Live | None = None
        self._last_line = -1e9

    def watch(self, instruments: list) -> None:
        """Show the NVML sampler's latest sample, when the run carries one (a GPU run)."""
        nvml = next((i for i in instruments if getattr(i, "name", None) == "nvml"), None)
        if nvml is not None and hasattr(nvml, "latest"):
            self.gpu_sample = nvml.latest

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> "LiveProgress":
        if self.enabled and self.live:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True,
                              redirect_stdout=True, redirect_stderr=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    # -- callbacks ------------------------------------------------------------------------------

    def on_step(self, rec: dict) -> None:
        """A closed step (PhaseTimer.listener): counts it; measured steps feed the figures."""
        self._done += 1
        if self._done > self.warmup:
            self._records.append(rec)
        self._show(final=self.steps is not None and self._done == self.warmup + self.steps)

    def on_post(self, line: str) -> None:
        """A post-run measurement started or ended (measure.budget's progress line)."""
        self._post = line
        if not self.enabled:
            return
        if self._live is not None:
            self._live.update(self._render())
        else:
            self.console.print(post_plain_line(line), highlight=False, markup=False)

    # -- output ---------------------------------------------------------------------------------

    def _show(self, final: bool = False) -> None:
        if not self.enabled:
            return
        if self._live is not None:
            self._live.update(self._render())
            return
        now = self._clock()
        if self._done == self.warmup or final or now - self._last_line >= PLAIN_EVERY_S:
            self._last_line = now
            self.console.print(self._view().plain_line, highlight=False, markup=False)

    def _view(self, sample: dict | None = None) -> LiveView:
        return live_view(self.what, self._done, self.warmup, self.steps, self._records, sample, self._post)

    def _sample(self) -> dict | None:
        if self.gpu_sample is None:
            return None
        try:
            return self.gpu_sample()
        except Exception:  # noqa: BLE001 - a display
            return None

    def _render(self) -> Panel:
        v = self._view(self._sample())
        lines = [Text(v.heading, style="bold")]
        f = v.figures
        if f is not None:
            lines.append(Text(f.headline))
            for row in f.shares:
                lines.append(Text(f"{row.phase:<9} {'█' * max(1, round(row.share * BAR)):<{BAR}} {row.share_text}"))
            lines.append(Text(f.caption, style="dim"))
        if v.gpu_line is not None:  # only where a GPU is sampled, once it has a sample
            lines.append(Text(v.gpu_line))
        if v.post_line is not None:
            lines.append(Text(v.post_line))
        return Panel(Group(*lines), title=v.title, title_align="left")


def _stdout_is_terminal() -> bool:
    import sys

    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False
