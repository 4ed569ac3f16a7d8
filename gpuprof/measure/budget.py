"""One time budget for everything measured after the stop: copy bandwidths, the matmul ceiling
and precisions, the FLOP count, the compute fixes timed changed, the micro-batch curve.

These run after the measured steps and cost time the user waits through; on a slow step (a
model whose step takes a minute) an unbounded FLOP count and micro-batch curve once ran 2.5
minutes in silence, longer than the run. By default the budget is max(15 s, 25% of the measured
run); `diagnose --post-budget S` sets it. Each part asks for a share of what is left
(`allot`), shrinks its own work to fit (fewer sizes, fewer repeats, skipping a count that
would not fit), says what it skipped (`done`), and the budget reports every part: allotted,
spent, skipped. A progress callback gets a line as each part starts, and one for what it skipped.
"""

from __future__ import annotations

import time
from typing import Callable

MIN_S = 15.0
RUN_SHARE = 0.25
# The share of the whole budget each part may take at most (what is left caps it too).
SHARES = {"experiments": 0.5, "copies": 0.05, "probe": 0.45, "flops": 0.2, "kernels": 0.25, "microbatch": 1.0,
          "settle": 1.0}
LABELS = {"experiments": "fixes switched on in your own loop (experiment steps)",
          "copies": "host-to-device copy bandwidths", "probe": "matmul ceiling and precisions",
          "flops": "FLOP count", "kernels": "attention, vocabulary and optimizer timed changed",
          "microbatch": "micro-batch curve",
          "settle": "more paired rounds where two fixes are tied"}


class PostRunBudget:
    """The seconds the post-run measurements share, and what each of them did with its part."""

    def __init__(self, total_s: float, *, clock: Callable[[], float] = time.perf_counter,
                 on_progress: Callable[[str], None] | None = None, source: str = ""):
        self.total_s = max(0.0, float(total_s))
        self.source = source
        self._clock = clock
        self._on_progress = on_progress
        self._t0 = clock()
        self._open: dict[str, tuple[float, float]] = {}
        self.parts: dict[str, dict] = {}
        self.interrupted = False

    @classmethod
    def for_run(cls, run_wall_s: float, seconds: float | None = None, **kw) -> "PostRunBudget":
        """The default budget, max(15 s, 25% of the measured run), unless `seconds` is given."""
        if seconds is not None:
            return cls(seconds, source="--post-budget", **kw)
        total = max(MIN_S, RUN_SHARE * float(run_wall_s or 0.0))
        return cls(total, source=f"max({MIN_S:g} s, {RUN_SHARE:.0%} of the {run_wall_s or 0:.1f} s run)", **kw)

    @classmethod
    def none(cls, why: str, **kw) -> "PostRunBudget":
        """No time at all, and why (nothing after the run may touch the GPU)."""
        return cls(0.0, source=f"none: {why}", **kw)

    def left(self) -> float:
        if self.interrupted:
            return 0.0
        return max(0.0, self.total_s - (self._clock() - self._t0))

    def interrupt(self) -> None:
        """Ctrl-C (or the launcher stopping a rank) during the post-run work: nothing is left;
        the remaining parts skip their work and the run's profile is still written."""
        self.interrupted = True
        self.close_open("interrupted (Ctrl-C or the launcher)")

    def allot(self, name: str, share: float | None = None) -> float:
        """Seconds `name` may spend now: its share of the whole budget, capped by what is left."""
        share = SHARES.get(name, 1.0) if share is None else share
        seconds = min(self.left(), self.total_s * share)
        self._open[name] = (self._clock(), seconds)
        self._say(f"{LABELS.get(name, name)} (up to {seconds:.1f} s of the {self.total_s:.0f} s budget)")
        return seconds

    def done(self, name: str, skipped: list[str] | None = None) -> None:
        """`name` finished; `skipped` says what it left out to stay within its part."""
        if name not in self._open and name in self.parts:  # already closed (interrupted): keep why
            return
        start, seconds = self._open.pop(name, (self._clock(), 0.0))
        spent = self._clock() - start
        self.parts[name] = {"allotted_s": seconds, "spent_s": spent, "skipped": list(skipped or [])}
        if skipped:
            self._say(f"{LABELS.get(name, name)}: skipped to stay in budget: {'; '.join(skipped)}")

    def close_open(self, why: str) -> None:
        """Parts that never reported (they raised): done, with why."""
        for name in list(self._open):
            self.done(name, [why])

    def report(self) -> dict:
        out = {"budget_s": self.total_s, "source": self.source,
               "spent_s": self._clock() - self._t0, "parts": self.parts}
        if self.interrupted:
            out["interrupted"] = True
        return out

    def say(self, line: str) -> None:
        """A progress line for work after the run that is not one of the budget's parts."""
        self._say(line)

    def _say(self, line: str) -> None:
        if self._on_progress is not None:
            try:
                self._on_progress(line)
            except Exception:  # noqa: BLE001 - a display problem never stops a measurement
                pass


def per_micro_s(ctx, phases=("forward", "backward")) -> float:
    """The run's own seconds of `phases` per micro-step (from the measured summary; 0 when not
    measured): what each post-run part sizes its work with."""
    stats = ctx.profile.stats if getattr(ctx, "profile", None) is not None else None
    if stats is None:
        return 0.0
    return sum(stats.seconds(p) for p in phases) / max(1, stats.micro_steps or 1)
