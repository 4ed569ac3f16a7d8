"""Steps far slower than the typical one (gpuprof.stats: an irregular step is > 1.5× the median
and > 5 robust deviations above it). One finding names them all: which steps, how much slower,
the phase that grew, what they cost the run (the mean step − the typical step, per step), and
what usually causes a pause in that phase. Every other rule is judged on the typical step, so
one pause cannot inflate their savings; this finding's cost is in the run's terms, not a share
of the typical step (kind "irregular", shown on its own)."""

from __future__ import annotations

from gpuprof.analysis.findings import Context, Finding
from gpuprof.units import pct, seconds, times

# What usually makes one step of a training loop far slower, by the phase that grew.
CAUSES = {
    "data": ("the data loader started again: DataLoader workers respawned at an epoch boundary "
             "(persistent_workers=True keeps them), a new shard or file read cold from disk, a "
             "dataset re-shuffled or re-opened"),
    "h2d": "pinned host memory allocated anew, or another process using the PCIe link",
    "forward": ("a recompilation (torch.compile on a new shape or a failed guard: TORCH_LOGS=recompiles "
                "names it), or another process on the device"),
    "backward": ("a recompilation of the backward graph, a garbage-collection pause, or another process "
                 "on the device"),
    "optimizer": "optimizer state allocated on its first use, or another process on the device",
    "eval": "an evaluation inside the loop: every eval_interval steps, in the timed step",
    "other": ("loop code outside the measured phases: an evaluation or a checkpoint (torch.save) inside "
              "the loop, logging that waits for the device, or a garbage-collection pause"),
}
FIXES = {
    "data": ("keep the loader alive across epochs (DataLoader(..., persistent_workers=True)) and its "
             "files warm (pre-tokenized shards, `gpuprof bench-disk` on their storage)"),
    "eval": "evaluate and checkpoint every eval_interval steps outside the timed training step",
    "other": ("move evaluation and checkpoints out of the timed step (or make them rarer); if it is "
              "garbage collection, gc.freeze() after setup keeps the collector off the model's objects"),
}
DEFAULT_FIX = "find what runs in those steps only (a profiler trace of one of them), then move it out of the loop"


def irregular_steps(ctx: Context) -> list[Finding]:
    s = ctx.stats
    if not s.irregular:
        return []
    slow = s.irregular
    worst = max(slow, key=lambda x: x.seconds)
    cost = s.irregular_cost_s  # per measured step, on average
    share = cost / s.mean_s if s.mean_s else 0.0
    which = ", ".join(f"#{x.index}" for x in slow)
    phases = sorted({x.phase for x in slow}, key=lambda p: -sum(x.phase_extra_s for x in slow if x.phase == p))
    grew = "; ".join(f"#{x.index} {seconds(x.seconds)} ({times(x.times_typical)} the typical step), its "
                     f"{x.phase} phase +{seconds(x.phase_extra_s)}" for x in slow[:6])
    more = f"; and {len(slow) - 6} more" if len(slow) > 6 else ""
    n = len(slow)
    title = (f"{n} irregular step{'s' if n != 1 else ''} ({which}): up to {times(worst.times_typical)} the "
             f"typical step, {pct(share)} of the measured time")
    because = (f"{grew}{more}. Over the {s.n_steps} measured steps they add {seconds(cost)} per step on "
               f"average: the mean step is {seconds(s.mean_s)}, the typical step {seconds(s.step_s)} (the "
               f"mean of the other {len(s.typical)})")
    main = phases[0]
    note = f"usually, when the {main} phase grows in a few steps: {CAUSES.get(main, CAUSES['other'])}"
    if len(phases) > 1:
        note += "; " + "; ".join(f"in {p}: {CAUSES.get(p, CAUSES['other'])}" for p in phases[1:3])
    return [Finding(
        id="irregular-steps", title=title, saving_s=None,
        evidence={"steps": [x.to_dict() for x in slow], "typical_step_s": s.step_s, "mean_step_s": s.mean_s,
                  "cost_per_step_s": cost, "share_of_measured_time": share, "measured_steps": s.n_steps},
        confidence="high", kind="irregular", because=because, note=note,
        fix=FIXES.get(main, DEFAULT_FIX),
    )]
