"""The live view's figures while a run goes, decided as the report decides them: the typical step
(gpuprof.stats.step_stats over the measured steps so far: irregular ones left out), tokens/s at
it and the phase shares of the typical steps, from the same statistics the final report prints.
The live display (gpuprof.render.live) lays them out."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof.profile import StepRecord
from gpuprof.stats import PHASES, step_stats
from gpuprof.units import pct, seconds


@dataclass(frozen=True)
class LiveFigures:
    last: str  # the last step
    typical: str  # the typical step so far, as the report's headline step
    tokens_per_s: str  # "" where no tokens were counted
    shares: tuple  # ((phase, share), ...) of the typical step, largest first

    def line(self) -> str:
        """One plain line (a pipe or a log file): the typical step, tokens/s, the top phases."""
        parts = [f"step {self.typical} typical", self.tokens_per_s,
                 ", ".join(f"{p} {pct(s, 0)}" for p, s in self.shares[:3])]
        return "; ".join(x for x in parts if x)

    def headline(self) -> str:
        return f"step {self.last} last, {self.typical} typical · {self.tokens_per_s or 'tokens/s not measured'}"


def live_figures(records: list[dict]) -> LiveFigures | None:
    """The figures of the measured steps so far (PhaseTimer listener records: wall_s, phases,
    tokens), or None before the first."""
    steps = [StepRecord(index=i, wall_s=r["wall_s"], phases=dict(r.get("phases") or {}), tokens=r.get("tokens") or 0)
             for i, r in enumerate(records)]
    stats = step_stats(steps)
    if stats is None:
        return None
    tps = f"{stats.tokens_per_s:,.0f} tokens/s" if stats.tokens_per_step else ""
    order = {p: i for i, p in enumerate(PHASES)}
    shares = sorted(((p, e.share) for p, e in stats.phases.items() if e.share > 0),
                    key=lambda x: (-x[1], order.get(x[0], len(order))))
    return LiveFigures(seconds(steps[-1].wall_s), seconds(stats.step_s), tps, tuple(shares))
