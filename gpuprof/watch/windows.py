"""Windows of a watched run: how long one is (`--every 30s`, `--every 100steps`), the steps it
collects from the timer's listener, and its figures, from gpuprof.stats (the typical step, its
phases, the irregular steps: the same definitions as diagnose's report).

Pure: no torch, no I/O. A window keeps at most MAX_WINDOW_STEPS steps' figures (a uniform
random sample beyond that, seeded); its step count, first and last step and wall time are exact.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from gpuprof.errors import GpuprofError
from gpuprof.profile import StepRecord
from gpuprof.stats import step_stats

MAX_WINDOW_STEPS = 4096
_UNITS_S = {"s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0, "m": 60.0, "min": 60.0,
            "mins": 60.0, "minute": 60.0, "minutes": 60.0, "h": 3600.0, "hour": 3600.0, "hours": 3600.0}
_STEP_UNITS = ("step", "steps")


@dataclass(frozen=True)
class Every:
    """A window's length: seconds of wall time or a number of steps (exactly one is set)."""

    seconds: float | None = None
    steps: int | None = None

    def to_dict(self) -> dict:
        return {"seconds": self.seconds} if self.seconds is not None else {"steps": self.steps}

    @property
    def text(self) -> str:
        return f"{self.seconds:g}s" if self.seconds is not None else f"{self.steps}steps"


def parse_every(text: str) -> Every:
    """'30s', '2m', '1h', '100steps' (also '100 steps', '30 seconds') -> Every; anything else is a
    one-line GpuprofError (exit 2)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*", str(text or ""))
    if not m:
        raise GpuprofError(f"--every {text!r}: give a duration or a step count, e.g. 30s, 5m or 100steps")
    value, unit = float(m.group(1)), m.group(2).lower()
    if unit in _STEP_UNITS:
        if value != int(value) or value < 1:
            raise GpuprofError(f"--every {text!r}: a window needs a whole number of steps, at least 1")
        return Every(steps=int(value))
    if unit in _UNITS_S:
        seconds = value * _UNITS_S[unit]
        if seconds <= 0:
            raise GpuprofError(f"--every {text!r}: a window must last longer than 0 s")
        return Every(seconds=seconds)
    raise GpuprofError(f"--every {text!r}: unknown unit {m.group(2)!r} (s, m, h or steps)")


@dataclass
class OpenWindow:
    """The window being filled: its steps' listener records (a sample of at most `cap`), the
    exact count, first and last step, and when it opened (seconds on the run's clock)."""

    number: int
    t_start: float
    cap: int = MAX_WINDOW_STEPS
    steps: list = field(default_factory=list)
    n: int = 0
    first: int | None = None
    last: int | None = None
    wall_s: float = 0.0
    tokens: int = 0
    _rng: random.Random = field(default_factory=lambda: random.Random(0))

    def add(self, rec: dict) -> None:
        self.n += 1
        if self.first is None:
            self.first = rec["index"]
        self.last = rec["index"]
        self.wall_s += rec["wall_s"]
        self.tokens += rec.get("tokens") or 0
        if len(self.steps) < self.cap:
            self.steps.append(rec)
        else:  # Algorithm R within the window
            j = self._rng.randrange(self.n)
            if j < self.cap:
                self.steps[j] = rec

    def full(self, every: Every, now: float) -> bool:
        if every.steps is not None:
            return self.n >= every.steps
        return self.n > 0 and now - self.t_start >= every.seconds


def records(steps: list[dict]) -> list[StepRecord]:
    """Listener records as StepRecords (for gpuprof.stats), in step order."""
    return [StepRecord(index=r["index"], wall_s=r["wall_s"], phases=dict(r["phases"]),
                       tokens=r.get("tokens") or 0, micro_steps=r.get("micro_steps") or 0)
            for r in sorted(steps, key=lambda r: r["index"])]


def window_figures(w: OpenWindow, t_end: float, *, partial: bool = False) -> dict:
    """The window's event (without the samplers' figures): steps (first, last), their count, the
    typical step and its phases (gpuprof.stats), the median/p10/p90/mean step, tokens/s at the
    typical step and over the window, the irregular steps with the phase that grew."""
    st = step_stats(records(w.steps))
    span = max(t_end - w.t_start, 1e-9)
    out = {
        "kind": "window", "window": w.number, "steps": [w.first, w.last], "n_steps": w.n,
        "sampled_steps": len(w.steps), "t_s": [round(w.t_start, 6), round(t_end, 6)],
        "step_s": st.step_s, "median_s": st.median_s, "p10_s": st.p10_s, "p90_s": st.p90_s,
        "mean_s": w.wall_s / w.n, "spread": st.typical_spread,
        "phases": {p: {"seconds": v.seconds, "share": v.share} for p, v in st.phases.items()},
        "tokens_per_step": st.tokens_per_step, "micro_steps": st.micro_steps,
        "tokens_per_s": st.tokens_per_s if st.tokens_per_step else None,
        "window_tokens_per_s": w.tokens / span if w.tokens else None,
        "irregular": [{"step": s.index, "seconds": s.seconds, "times_typical": s.times_typical,
                       "phase": s.phase, "phase_extra_s": s.phase_extra_s} for s in st.irregular],
    }
    if partial:
        out["partial"] = True
    return out
