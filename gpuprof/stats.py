"""Statistics of measured steps, and the quantiles every layer uses (numpy's, linear interpolation:
one definition of a median and a p90 for the whole tool). Pure: no torch, no I/O.

The typical step, and the slow ones. A run's steps are not all alike: an eval or a checkpoint
inside the loop, a garbage collection, DataLoader workers respawned at an epoch boundary or a
recompilation make one step far slower than the others. Such a step is *irregular* when it is
both more than IRREGULAR_RATIO × the median step and more than IRREGULAR_MADS robust deviations
above it (1.4826 × the median absolute deviation): ordinary jitter never is. The *typical step*
is the mean of the other steps, and each phase's seconds are its mean over those same steps, so
the phase table adds up to the headline step exactly; every saving is judged on it, so one pause
cannot inflate a fix. What the irregular steps cost the run is the mean of all steps minus the
typical step (rules name them: analysis.rules.irregular).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

PHASES = ("data", "h2d", "forward", "backward", "comm", "optimizer", "other", "eval")
# Phases a step has only in some runs, shown only where a step has them: `comm` (a sharded
# model's collectives, gpuprof.measure.collective_hooks), `eval` (an evaluation inside the step).
OPTIONAL_PHASES = ("comm", "eval")
# Phases that enqueue no GPU work of their own: their GPU span is idle time the host exposed.
HOST_ONLY_PHASES = ("data", "other")

IRREGULAR_RATIO = 1.5
IRREGULAR_MADS = 5.0
MAD_TO_SIGMA = 1.4826  # a normal distribution's standard deviation per median absolute deviation


def quantile(xs: Iterable[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation between the nearest ranks (numpy's
    default); None values are skipped; None for no values. [1, 2, 3, 4, 10]: p90 7.6, p10 1.4."""
    if isinstance(xs, np.ndarray):
        vals = np.asarray(xs, dtype=float).ravel()
    else:
        vals = np.asarray([float(x) for x in xs if x is not None], dtype=float)
    return float(np.quantile(vals, q)) if vals.size else None


def median(xs: Iterable[float]) -> float | None:
    """The median: the middle value, or the mean of the two middle ones ([1, 2, 3, 4] -> 2.5);
    always a float (wrap a count in int(round(...))); None for no values."""
    return quantile(xs, 0.5)


@dataclass(frozen=True)
class PhaseTime:
    """One phase over the typical steps: mean seconds per step on the step's timeline, its share
    of the typical step, the host's seconds, and on the GPU timeline the GPU idle time a
    host-only phase exposed."""

    seconds: float
    share: float
    host_seconds: float
    idle_exposed_s: float | None = None  # GPU timeline only, host-only phases

    def to_dict(self) -> dict:
        d = {"seconds": self.seconds, "share": self.share, "host_seconds": self.host_seconds}
        if self.idle_exposed_s is not None:
            d["idle_exposed_s"] = self.idle_exposed_s
        return d


@dataclass(frozen=True)
class IrregularStep:
    """A step far slower than the typical one: its index, seconds, how many times the typical
    step it took, and the phase that grew most (seconds over that phase's typical mean)."""

    index: int
    seconds: float
    times_typical: float
    phase: str
    phase_extra_s: float

    def to_dict(self) -> dict:
        return {"index": self.index, "seconds": self.seconds, "times_typical": self.times_typical,
                "phase": self.phase, "phase_extra_s": self.phase_extra_s}


@dataclass(frozen=True)
class StepStats:
    """What the measured steps say, on one timeline ("gpu" when every step has its CUDA span,
    else "host" wall time). `step_s` is the typical step (see the module docstring); `phases`
    add up to it. The other figures are over all measured steps."""

    timeline: str
    n_steps: int
    step_s: float  # the typical step: the mean of the regular steps = the sum of `phases`
    phases: dict[str, PhaseTime]
    median_s: float
    p10_s: float
    p90_s: float
    min_s: float
    max_s: float
    mean_s: float  # all measured steps, the irregular ones included
    host_step_s: float  # the typical steps' mean host wall time
    tokens_per_step: int
    micro_steps: int
    typical: tuple[int, ...]  # indices of the steps the typical step is the mean of
    irregular: tuple[IrregularStep, ...] = field(default_factory=tuple)
    # (p90 − p10) ÷ median over the typical steps alone: the run's noise, an eval step aside
    typical_spread: float = 0.0

    @property
    def spread(self) -> float:
        """(p90 − p10) ÷ median over all steps: how much the steps vary."""
        return (self.p90_s - self.p10_s) / self.median_s if self.median_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        """At the typical step."""
        return self.tokens_per_step / self.step_s if self.step_s else 0.0

    @property
    def run_tokens_per_s(self) -> float:
        """Over the whole measured run, irregular steps included."""
        return self.tokens_per_step / self.mean_s if self.mean_s else 0.0

    @property
    def irregular_cost_s(self) -> float:
        """Per measured step, what the irregular steps added on average: mean − typical."""
        return max(0.0, self.mean_s - self.step_s) if self.irregular else 0.0

    def seconds(self, phase: str) -> float:
        p = self.phases.get(phase)
        return p.seconds if p is not None else 0.0

    def share(self, phase: str) -> float:
        p = self.phases.get(phase)
        return p.share if p is not None else 0.0

    def to_dict(self) -> dict:
        return {"timeline": self.timeline, "n_steps": self.n_steps, "step_s": self.step_s,
                "phases": {k: v.to_dict() for k, v in self.phases.items()},
                "median_s": self.median_s, "p10_s": self.p10_s, "p90_s": self.p90_s,
                "min_s": self.min_s, "max_s": self.max_s, "mean_s": self.mean_s,
                "spread": self.spread, "typical_spread": self.typical_spread, "host_step_s": self.host_step_s,
                "tokens_per_step": self.tokens_per_step, "micro_steps": self.micro_steps,
                "tokens_per_s": self.tokens_per_s, "typical": list(self.typical),
                "irregular": [s.to_dict() for s in self.irregular]}


def step_times(steps: Sequence, gpu: bool) -> list[float]:
    return [float(s.gpu_s if gpu else s.wall_s) for s in steps]


def on_gpu_timeline(steps: Sequence) -> bool:
    return bool(steps) and all(s.gpu_s is not None and s.gpu_phases is not None for s in steps)


def irregular_indices(times: Sequence[float]) -> list[int]:
    """Positions of the steps far slower than the others (module docstring): none with fewer
    than 3 steps, and never half of them or more (then slow is the run's normal, not a pause)."""
    n = len(times)
    if n < 3:
        return []
    med = median(times)
    mad = median(abs(t - med) for t in times)
    slow = [i for i, t in enumerate(times)
            if t > IRREGULAR_RATIO * med and t - med > IRREGULAR_MADS * MAD_TO_SIGMA * mad]
    return slow if len(slow) * 2 < n else []


def step_stats(steps: Sequence) -> StepStats | None:
    """StepStats of measured StepRecords (gpuprof.profile), or None when there are none."""
    if not steps:
        return None
    gpu = on_gpu_timeline(steps)
    times = step_times(steps, gpu)
    slow = set(irregular_indices(times))
    regular = [s for i, s in enumerate(steps) if i not in slow]

    def phases_of(s) -> dict:
        return (s.gpu_phases if gpu else s.phases) or {}

    names = [p for p in PHASES if p not in OPTIONAL_PHASES or any(phases_of(s).get(p) for s in steps)]
    names += sorted({p for s in steps for p in phases_of(s)} - set(names))
    n = len(regular)
    mean = {p: sum(phases_of(s).get(p, 0.0) for s in regular) / n for p in names}
    total = sum(mean.values())
    phases = {}
    for p, sec in mean.items():
        idle = None
        if gpu and p in HOST_ONLY_PHASES:
            idle = sum((s.gpu_phases or {}).get(p, 0.0) for s in regular) / n
        phases[p] = PhaseTime(seconds=sec, share=sec / total if total else 0.0,
                              host_seconds=sum(s.phases.get(p, 0.0) for s in regular) / n,
                              idle_exposed_s=idle)
    irregular = []
    for i in sorted(slow):
        s = steps[i]
        grew = {p: phases_of(s).get(p, 0.0) - mean.get(p, 0.0) for p in names}
        phase = max(grew, key=grew.get)
        irregular.append(IrregularStep(index=int(s.index), seconds=times[i],
                                       times_typical=times[i] / total if total else 0.0,
                                       phase=phase, phase_extra_s=grew[phase]))
    return StepStats(
        timeline="gpu" if gpu else "host", n_steps=len(steps), step_s=total, phases=phases,
        median_s=median(times), p10_s=quantile(times, 0.1), p90_s=quantile(times, 0.9),
        min_s=min(times), max_s=max(times), mean_s=sum(times) / len(times),
        host_step_s=sum(s.wall_s for s in regular) / n,
        tokens_per_step=int(round(median(s.tokens for s in regular) or 0)),
        micro_steps=int(round(median(s.micro_steps for s in regular) or 0)),
        typical=tuple(int(s.index) for s in regular), irregular=tuple(irregular),
        typical_spread=_spread([t for i, t in enumerate(times) if i not in slow]))


def _spread(times: list[float]) -> float:
    """(p90 − p10) ÷ median of some step times (0 for none)."""
    med = median(times) if times else 0.0
    return (quantile(times, 0.9) - quantile(times, 0.1)) / med if med else 0.0
