"""The timeline of one typical step, decided once: which step, its phase spans on one time axis
(host and, on CUDA, the GPU's), the axis's length and the caption that says how they were
obtained. The terminal lays it out (gpuprof.render.timeline); nothing here draws.

The host rows are the step's measured phase spans in the order they ran (StepRecord.extra
["spans"], from the timer). Where a profile has none that agree with its phase totals (an older
profile; a script whose `other` time was partly moved to `data` by sampling), the rows are laid
out in the loop's order per micro-step — the built-in loop's own (forward, then the next batch,
then backward, as nanoGPT), a script's assumed (data, copy, forward, backward) — and the caption
says so. The GPU row is the step's GPU spans from its CUDA events (StepRecord.extra["gpu_spans"])
where they exist, else laid out from its phase totals."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof.profile import Profile, StepRecord
from gpuprof.stats import HOST_ONLY_PHASES, PHASES
from gpuprof.units import seconds

# Within one micro-step, in the order the loop runs them. The built-in loop fetches the next
# batch between forward and backward (nanoGPT's prefetch); its copy to the device is inside it.
MICRO_ORDER = {"builtin": ("forward", "data", "h2d", "backward"),
               "script": ("data", "h2d", "forward", "backward")}
STEP_ORDER = ("eval", "optimizer", "other")  # once per step, after the micro-steps
IDLE = "·"  # the GPU row's mark where it sat idle while the host ran a host-only phase


@dataclass(frozen=True)
class TimelineView:
    """One step on one time axis: each phase's host spans, the GPU's busy and idle spans (None
    off the GPU timeline), the axis length and its label, the title, the caption and the GPU
    row's label."""

    title: str
    rows: tuple  # ((phase, ((start, end), ...)), ...) in the report's phase order
    gpu_busy: tuple | None
    gpu_idle: tuple | None
    total_s: float
    total_text: str
    caption: str
    gpu_label: str = "GPU"  # the GPU row's name, beside the phases' own


def typical_step(profile: Profile) -> tuple[StepRecord, int] | None:
    """The median of the typical steps (gpuprof.stats: irregular ones left out) on the stats'
    timeline, the lower middle one for an even count, and its rank in time order (1-based)."""
    stats = profile.stats
    if stats is None:
        return None
    on_gpu = stats.timeline == "gpu"
    typical = set(stats.typical)
    steps = [s for s in profile.steps if s.index in typical] or profile.steps

    def t(s: StepRecord) -> float:
        return s.gpu_s if on_gpu and s.gpu_s is not None else s.wall_s

    ordered = sorted(steps, key=t)
    k = (len(ordered) - 1) // 2
    return ordered[k], k + 1


def layout(phases: dict[str, float], micro_steps: int, mode: str = "builtin") -> list[tuple[str, float, float]]:
    """(phase, start, end) spans of one step: each micro-step phase's total split evenly over the
    micro-steps in the loop's order, then the once-per-step phases. Phases the order does not
    name (a new phase) go before the optimizer."""
    m = max(int(micro_steps or 1), 1)
    micro = MICRO_ORDER.get(mode, MICRO_ORDER["script"])
    known = set(micro) | set(STEP_ORDER)
    extra = [p for p in phases if p not in known]
    per_step = [p for p in STEP_ORDER if p != "optimizer" and p != "other"] + extra + ["optimizer", "other"]
    out, t = [], 0.0
    for _ in range(m):
        for p in micro:
            d = phases.get(p, 0.0) / m
            if d > 0:
                out.append((p, t, t + d))
                t += d
    for p in per_step:
        d = phases.get(p, 0.0)
        if d > 0:
            out.append((p, t, t + d))
            t += d
    return out



def build_timeline(profile: Profile) -> TimelineView | None:
    """The timeline of the profile's typical step; None without a measured step."""
    picked = typical_step(profile)
    if picked is None:
        return None
    step, rank = picked
    mode = "builtin" if profile.run.get("mode", "builtin") == "builtin" else "script"
    micro = step.micro_steps or profile.stats.micro_steps or 1
    measured = step.measured_spans()  # the host's phase spans in the order they ran
    host = [(p, a, a + d) for p, a, d in measured] if measured else layout(step.phases, micro, mode)
    gpu_measured = step.measured_spans(gpu=True)  # the GPU timeline's spans, from the CUDA events
    gpu = ([(p, a, a + d) for p, a, d in gpu_measured] if gpu_measured
           else layout(step.gpu_phases, micro, mode) if step.gpu_phases else None)
    total = max(step.wall_s, sum(step.phases.values()), step.gpu_s or 0.0, sum((step.gpu_phases or {}).values()))
    if total <= 0 or not host:
        return None
    names = [p for p in PHASES if any(s[0] == p for s in host)]
    names += [p for p in dict.fromkeys(s[0] for s in host) if p not in names]
    rows = tuple((name, tuple((a, b) for p, a, b in host if p == name)) for name in names)
    busy = tuple((a, b) for p, a, b in gpu if p not in HOST_ONLY_PHASES) if gpu else None
    idle = tuple((a, b) for p, a, b in gpu if p in HOST_ONLY_PHASES) if gpu else None
    order = ", ".join(p for p in MICRO_ORDER[mode] if step.phases.get(p))
    n = len(profile.stats.typical) or len(profile.steps)
    which = "the median step" if n % 2 else "the lower of the two middle steps"
    among = f"#{rank} of {n} typical steps by time" if profile.stats.irregular else f"#{rank} of {n} by time"
    if measured:
        how = ("as sampled from outside (py-spy)" if profile.run.get("mode") == "attach" else "as measured")
        caption = (f"One step, {which} ({among}), on one time axis: "
                   f"the host's phase spans {how}, in the order they ran. ")
    else:
        caption = (f"One step, {which} ({among}), on one time axis. "
                   + ("The order is the loop's, not measured" if mode == "builtin" else
                      "The order is assumed (a script's loop is not known), not measured")
                   + f": per micro-step {order}"
                   + (f" (×{micro})" if micro > 1 else "") + ", then the rest; this profile keeps only each "
                   "phase's total per step (older profile, or data time attributed by sampling). ")
    caption += "░▒▓█: the share of each character's time the phase ran."
    if gpu:
        caption += (" GPU: " + ("its phase spans from the CUDA events, in the order they ran, "
                                if gpu_measured else
                                "its phase totals laid out in the loop's order (no GPU spans in this "
                                "profile), ")
                    + f"from the same start; busy where it ran the phases' work, {IDLE} idle while the "
                    "host loaded data or ran loop code.")
    return TimelineView("A typical step on a time axis", rows, busy, idle, total, seconds(total), caption)
