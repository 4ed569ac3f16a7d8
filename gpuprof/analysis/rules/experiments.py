"""A fix measured on the script's own loop (measurements.experiments, measure/experiments.py): its
saving is the script's typical step × (1 − the paired steps' ratio), with the ratio's sign-test
interval, at the transfer factor 1 (the steps timed are the script's own, not a copy's). The rules
whose fix gpuprof can switch from outside (precision-slow, optimizer-not-fused / optimizer-slow,
compile-missing) take it before their post-run estimate; a fix that made the step slower is said
as a finding of its own ("bf16 autocast makes this step 25% slower here"). Pure: no torch."""

from __future__ import annotations

from dataclasses import replace

from gpuprof.analysis.findings import Context, Finding
from gpuprof.analysis.rules.common import step_s
from gpuprof.analysis.rules.host_memory import FAULTS_MIN
from gpuprof.analysis.rules.intervals import TimedSaving, says_slower, timed_saving, under_share
from gpuprof.sections.experiments import Experiment
from gpuprof.units import interval_text, pct, seconds, times


def measured_on_loop(ctx: Context, prefix: str) -> Experiment | None:
    """The measured experiment of a fix (its id starting with `prefix`), None when none ran."""
    return ctx.sections.experiments.measured(prefix)


def on_your_loop(exp: Experiment, total: float) -> TimedSaving:
    """The experiment's saving on the typical step `total`, its interval and what may be claimed
    (rules/intervals.timed_saving, no transfer), the note saying where it was measured."""
    ts = timed_saving(exp.interval, total, exp.ratio)
    ev = dict(ts.evidence, experiment=exp.id, pairs=exp.pairs, ratio=exp.ratio, measured_on="your loop",
              step_with_s=exp.b_median_s, step_without_s=exp.a_median_s)
    if exp.phases:
        ev["compared_phases"] = list(exp.phases)
    if "saving_low_s" not in ev:
        return replace(ts, evidence=ev, note=f"measured on your loop: {ts.note}")
    words = interval_text(ev["saving_low_s"], ev["saving_high_s"], ev["interval_level"], exp.pairs,
                          "pairs of your loop's steps")
    if ts.within_noise:
        note = (f"within this machine's noise: {words}, an interval that holds no change (estimate "
                f"{seconds(ts.estimate)}); no saving claimed")
    else:
        note = (f"measured on your loop: {seconds(ts.estimate)} per step ({words}; the step with and without "
                f"the fix, in pairs of adjacent steps, ABBA; the sign-test interval of their ratio"
                f"{compared(exp)})")
    kernel = kernel_caveat(exp, total)
    if kernel:
        ev["kernel_s_by_way"] = dict(exp.kernel_s)
        note += f"; {kernel}"
    return replace(ts, evidence=ev, note=note)


KERNEL_DIFF_SHARE = 0.05  # of the step: the ways' kernel times this far apart are said


def kernel_caveat(exp: Experiment, total: float) -> str | None:
    """Where the two ways' kernel time per step differed by ≥ KERNEL_DIFF_SHARE of the step: page
    faults, which depend on the allocator's state, and that state depends on what the process ran
    before (glibc's mmap threshold rises as blocks are freed). The experiment's steps run both ways
    in one process; a process that runs one way from its start can fault more or less. On
    2026-12-08's VM a bf16 step took ~3,900 faults alone in its process and ~2,000 in one that also
    ran fp32 steps (docs/measurements/2026-12-07-loop-experiments.md, series 19)."""
    k = exp.kernel_s or {}
    a, b = k.get("a"), k.get("b")
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or not total:
        return None
    f = exp.minor_faults or {}
    fa, fb = f.get("a"), f.get("b")
    # the faults must differ too: a thread's kernel time is also a GPU driver's (its ioctls, waits)
    if (abs(a - b) < KERNEL_DIFF_SHARE * total or not isinstance(fa, (int, float)) or not isinstance(fb, (int, float))
            or abs(fa - fb) < FAULTS_MIN):  # their faults this far apart too
        return None
    return (f"the kernel's time per step differed between the two ways: {seconds(a)} without the fix, "
            f"{seconds(b)} with it ({fa:,.0f} and {fb:,.0f} page faults); page faults depend on the allocator's "
            "state, which a process running one way from its start does not share with these steps: the saving "
            "in a fresh process may differ")


def compared(exp: Experiment) -> str:
    """'; each pair compares the forward and backward phases the fix changes, …' for a fix measured
    on the phases it changes (measure/experiments.paired_steps), else ''."""
    if not exp.phases:
        return ""
    names = list(exp.phases)
    said = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"; each pair compares the {said} phase{'s' if len(names) > 1 else ''} the fix changes, the rest of the step as without it"


def slower_finding(fid: str, what: str, exp: Experiment, ts: TimedSaving, total: float) -> Finding:
    """`what` made the script's own step slower: information, never a change to make."""
    return Finding(
        id=fid, kind="info", saving_s=None, confidence=ts.confidence,
        title=f"{what} makes this step {pct(exp.ratio - 1, 0)} slower here ({times(exp.ratio)} the time)",
        evidence=dict(ts.evidence, slower=True),
        because=(f"measured on your loop: {exp.pairs} paired steps with and without it, the step took "
                 f"{seconds(exp.b_median_s)} with it and {seconds(exp.a_median_s)} without (medians{compared(exp)}); "
                 f"{seconds(-ts.estimate)} per step more"),
        note="not a fix on this device: leave it as it is" + (f"; {k}" if (k := kernel_caveat(exp, total)) else ""),
    )


def verdict(ts: TimedSaving, total: float, share: float) -> str:
    """slower | noise | small (under `share` of the step, its interval too: intervals.under_share) | claim."""
    if says_slower(ts, total):
        return "slower"
    if ts.within_noise:
        return "noise"
    return "small" if under_share(ts, total, share) else "claim"


def loop_total(ctx: Context) -> float:
    return step_s(ctx) or 0.0
