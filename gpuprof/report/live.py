"""The live view's figures while a run goes, decided as the report decides them: the typical step
(gpuprof.stats.step_stats over the measured steps so far: irregular ones left out), tokens/s at
it and the phase shares of the typical steps, from the same statistics the final report prints;
where the run is (warmup k/K, measured n/N), the GPU's latest NVML sample and the post-run part,
in words. The live display (gpuprof.render.live) lays them out and words none of its own."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof.profile import StepRecord
from gpuprof.stats import PHASES, step_stats
from gpuprof.units import NM, gib, pct, seconds

TITLE = "gpuprof diagnose"  # the panel's title
PLAIN = "gpuprof: "  # what starts a plain line (a pipe, a log file)
AFTER_RUN = "after the run: "  # what starts the line of a post-run measurement
SHARES_CAPTION = "host time, the typical step's phase shares so far (the GPU timeline is read after the run)"


@dataclass(frozen=True)
class ShareRow:
    """One phase's share of the typical step: the share (drawn as a bar) and its figure."""

    phase: str
    share: float
    share_text: str


@dataclass(frozen=True)
class LiveFigures:
    last: str  # the last step
    typical: str  # the typical step so far, as the report's headline step
    tokens_per_s: str  # "" where no tokens were counted
    shares: tuple[ShareRow, ...]  # of the typical step, largest first
    line: str  # one plain line: the typical step, tokens/s, the top phases
    headline: str  # the panel's line: the last step, the typical step, tokens/s
    caption: str = SHARES_CAPTION  # under the shares: what they are


@dataclass(frozen=True)
class LiveView:
    """What the live display shows at one moment, every line in words."""

    title: str  # the panel's title
    heading: str  # what runs and where it is: "train.py: measured 3/10"
    plain_line: str  # the plain line of the same moment: "gpuprof: measured 3/10: step …"
    figures: LiveFigures | None  # None before the first measured step
    gpu_line: str | None  # the GPU's latest sample; None off a GPU or before its first sample
    post_line: str | None  # the post-run measurement under way or just ended


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
    last, typical = seconds(steps[-1].wall_s), seconds(stats.step_s)
    parts = [f"step {typical} typical", tps, ", ".join(f"{p} {pct(s, 0)}" for p, s in shares[:3])]
    return LiveFigures(last, typical, tps, tuple(ShareRow(p, s, pct(s)) for p, s in shares),
                       line="; ".join(x for x in parts if x),
                       headline=f"step {last} last, {typical} typical · {tps or 'tokens/s ' + NM}")


def where(done: int, warmup: int, steps: int | None) -> str:
    """Where the run is after `done` closed steps: "warmup 1/2", "measured 3/10" (or "measured 3"
    with no set number of steps)."""
    if done <= warmup:
        return f"warmup {done}/{warmup}"
    n = done - warmup
    return f"measured {n}/{steps}" if steps is not None else f"measured {n}"


def gpu_line(sample: dict | None) -> str | None:
    """The NVML sampler's latest sample in words; None without a utilization figure (off a GPU,
    before its first sample)."""
    util = (sample or {}).get("gpu_util_pct")
    if util is None:
        return None
    mem = (sample or {}).get("mem_used_bytes")
    return (f"GPU utilization {util:.0f}% (NVML, latest sample)"
            + (f" · memory used {gib(mem)}" if mem is not None else ""))


def post_plain_line(line: str) -> str:
    """A post-run measurement's plain line: "gpuprof: after the run: FLOP count (…)"."""
    return f"{PLAIN}{AFTER_RUN}{line}"


def live_view(what: str, done: int, warmup: int, steps: int | None, records: list[dict],
              sample: dict | None = None, post: str | None = None) -> LiveView:
    """The live view after `done` closed steps (`records`: the measured ones), the GPU's latest
    sample (None: none shown) and the post-run part under way (None: none yet)."""
    at = where(done, warmup, steps)
    figures = live_figures(records)
    return LiveView(TITLE, f"{what}: {at}", f"{PLAIN}{at}" + (f": {figures.line}" if figures is not None else ""),
                    figures, gpu_line(sample), f"{AFTER_RUN}{post}" if post else None)
