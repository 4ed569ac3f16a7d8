"""Live progress while `diagnose` runs: where it is (warmup k/K, measured n/N, then each post-run
measurement) and the answer forming, from each closed step's host figures: the typical step so
far as the report decides it (gpuprof.report.live), the last step, tokens/s, the phase shares,
and on a GPU its utilization (the NVML sampler's latest sample).

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

from gpuprof.report.live import live_figures
from gpuprof.units import gib, pct

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
            self.console.print(f"gpuprof: after the run: {line}", highlight=False, markup=False)

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
            self.console.print(f"gpuprof: {self._where()}{self._figures_line()}", highlight=False, markup=False)

    def _where(self) -> str:
        if self._done <= self.warmup:
            return f"warmup {self._done}/{self.warmup}"
        n = self._done - self.warmup
        return f"measured {n}/{self.steps}" if self.steps is not None else f"measured {n}"

    def _figures_line(self) -> str:
        figures = live_figures(self._records)
        return f": {figures.line()}" if figures is not None else ""

    def _render(self) -> Panel:
        lines = [Text(f"{self.what}: {self._where()}", style="bold")]
        figures = live_figures(self._records)
        if figures is not None:
            lines.append(Text(figures.headline()))
            for p, share in figures.shares:
                lines.append(Text(f"{p:<9} {'█' * max(1, round(share * BAR)):<{BAR}} {pct(share)}"))
            lines.append(Text("host time, the typical step's phase shares so far (the GPU timeline is read "
                              "after the run)", style="dim"))
        if self.gpu_sample is not None:
            sample = None
            try:
                sample = self.gpu_sample()
            except Exception:  # noqa: BLE001 - a display
                sample = None
            util = (sample or {}).get("gpu_util_pct")
            if util is not None:  # only where a GPU is sampled, once it has a sample
                mem = (sample or {}).get("mem_used_bytes")
                lines.append(Text(f"GPU utilization {util:.0f}% (NVML, latest sample)"
                                  + (f" · memory used {gib(mem)}" if mem is not None else "")))
        if self._post:
            lines.append(Text(f"after the run: {self._post}"))
        return Panel(Group(*lines), title="gpuprof diagnose", title_align="left")


def _stdout_is_terminal() -> bool:
    import sys

    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False
