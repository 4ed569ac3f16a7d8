"""The report's first screen (issue #43): what `gpuprof diagnose`, `analyze` and `watch` print
without --details, decided once from (Profile, Analysis). Verdict first, then the top fixes with
what each saves (its range when timed) and the change to make, the phases in one line, the
outlier steps in one line, the corrected config in one line, and what --details adds. The words
are the ones a nanoGPT user already uses (gradient accumulation steps, copy to GPU, outlier
steps; docs/report.md defines each once). The full report (report.model) is --details; every
figure here is one of its figures, shortened, never a new one. gpuprof.render.first_screen lays
it out."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuprof.analysis.findings import Finding
from gpuprof.analysis.pipeline import Analysis
from gpuprof.analysis.mfu_results import MfuResult
from gpuprof.profile import Profile
from gpuprof.report import words
from gpuprof.report.model import RanksView, corrected_view, ranks_view
from gpuprof.sections import Sections
from gpuprof.stats import PHASES, StepStats
from gpuprof.units import pct, seconds, seconds_range, times

TOP_FIXES = 3  # fixes shown in full on the first screen; the others are counted in the hint
SAID_BY_THE_PHASES = {"dominant-phase"}  # findings the phases' line already says
# The phase names of the report's tables, in the words a nanoGPT user uses for them: h2d is the
# host→device copy, to a GPU or, on a CPU run, to the CPU device itself.
PHASE_WORDS = {"h2d": "copy to GPU"}
PHASE_WORDS_CPU = {"h2d": "copy to device"}


@dataclass(frozen=True)
class Headings:
    """The first screen's own labels (the full report's are words.HEADINGS)."""

    verdict: str = "Verdict:"
    fixes: str = "Top fixes, by the time each saves per step"
    no_fixes: str = "Fixes: none found in this run"
    phases: str = "Where the step goes:"
    outliers: str = "Outlier steps:"
    corrected: str = "Corrected config:"
    correction: str = "Correction:"
    infos: str = "Also found:"
    not_measured: str = "Not measured in this run:"
    fields: tuple = ("saves", "change")
    details_flag: str = "more with --details"
    # what --details adds to the first screen, in the order the full report shows it
    details: str = ("why each fix (its evidence and notes), the noise, the phase table, a typical step on a time "
                    "axis, MFU, what ran, the samplers, your code's lines")


HEADINGS = Headings()


@dataclass(frozen=True)
class FixLine:
    title: str
    saves: str  # the saving, its range when timed, its share of the typical step, the confidence
    saves_time: bool
    change: str


@dataclass(frozen=True)
class FirstScreen:
    title: str
    run_line: str
    has_steps: bool
    step: str = ""  # e.g. "452 ms"
    step_how: str = ""  # how it was obtained, short
    rest: str = ""  # tokens/s · gradient accumulation steps · MFU
    verdict: str = ""
    verdict_change: str = ""  # a verdict finding's own change (compute-bound: what would help)
    verdict_note: str = ""  # ... or, without one, its note (what will not help)
    fixes: list[FixLine] = field(default_factory=list)
    corrections: list[str] = field(default_factory=list)
    infos: list[str] = field(default_factory=list)  # what else was found, titles only, when fixes leave room
    phases: list[tuple[str, str]] = field(default_factory=list)  # (phase in words, share)
    outliers: str | None = None
    corrected: str | None = None
    not_measured: str | None = None  # what could not be measured, named; --details says why
    ranks: RanksView | None = None
    more: str = ""
    headings: Headings = HEADINGS


def saving_short(f: Finding) -> str:
    """What a fix saves per step, short: "8.6 ms per step (7.9–11.3 ms), 8.4% of the typical step;
    confidence high". The interval's level and rounds are in --details (words.saving_text)."""
    ev = f.evidence or {}
    if f.saving_s is None:
        ceiling = ev.get("ceiling_s")
        text = f"not estimated; at most {seconds(ceiling)} per step" if ceiling else "not estimated (--details says why)"
    elif f.saving_s <= 1e-9 and f.overlaps:
        text = f"nothing more: its time is already counted in {', '.join(f.overlaps)}"
    else:
        timed = "saving_low_s" in ev and "saving_high_s" in ev
        span = f" ({seconds_range(ev['saving_low_s'], ev['saving_high_s'])})" if timed else ""
        text = f"{seconds(f.saving_s)} per step{span}, {pct(f.saving_share)} of the typical step"
        if f.tied_with:
            text += f"; tied with {', '.join(f.tied_with)} within noise"
    return f"{text}; confidence {f.confidence}" if f.confidence else text


def step_how(stats: StepStats) -> str:
    n, k = stats.n_steps, len(stats.irregular)
    if k:
        return (f"typical: the mean of {len(stats.typical)} of {n} measured steps, {words.timeline_name(stats)}; "
                f"{k} outlier step{'s' if k != 1 else ''} left out")
    return f"the mean of {n} measured step{'s' if n != 1 else ''}, {words.timeline_name(stats)}"


def accumulation_text(stats: StepStats) -> str | None:
    n = stats.micro_steps
    return f"{n} gradient accumulation step{'s' if n != 1 else ''}" if n else None


def mfu_short(m: MfuResult | None) -> str | None:
    """MFU against what it is measured against, or None when neither figure was measured."""
    if m is None:
        return None
    if m.mfu is not None:
        return f"MFU {pct(m.mfu)} of the {m.dtype or ''} datasheet peak".replace("  ", " ")
    if m.mfu_vs_ceiling is not None:
        return f"MFU {pct(m.mfu_vs_ceiling)} of the {m.ceiling_dtype or m.dtype or ''} matmul ceiling measured here"
    return None


def phase_shares(stats: StepStats, on_gpu: bool) -> list[tuple[str, str]]:
    """Each phase that holds at least 0.5% of the typical step, in the loop's order, with its share."""
    names = [p for p in PHASES if p in stats.phases] + [p for p in stats.phases if p not in PHASES]
    said = PHASE_WORDS if on_gpu else PHASE_WORDS_CPU
    return [(said.get(p, p), pct(stats.phases[p].share, 0)) for p in names
            if stats.phases[p].share >= 0.005]


def outliers_text(stats: StepStats, finding: Finding | None) -> str | None:
    """The outlier (irregular) steps in one sentence: which, how much slower, the phase that grew,
    what they cost the run, and the usual change."""
    slow = stats.irregular
    if not slow:
        return None
    grew = ", ".join(f"#{x.index} ({times(x.times_typical)} the typical step, {x.phase} +{seconds(x.phase_extra_s)})"
                     for x in slow[:4])
    more = f" and {len(slow) - 4} more" if len(slow) > 4 else ""
    share = stats.irregular_cost_s / stats.mean_s if stats.mean_s else 0.0
    text = (f"{grew}{more}; left out of the typical step, they add {seconds(stats.irregular_cost_s)} per step "
            f"over the run ({pct(share)} of the measured time)")
    return text + (f"; usual change: {finding.fix}" if finding is not None and finding.fix else "")


def build_first_screen(profile: Profile, analysis: Analysis) -> FirstScreen:
    title = "gpuprof diagnosis" + (" (partial)" if profile.run.get("partial") else "")
    stats = analysis.stats
    common = dict(title=title, run_line=words.run_line(profile), ranks=ranks_view(analysis.distributed),
                  not_measured=not_measured_text(profile))
    if stats is None:
        return FirstScreen(has_steps=False, **common)
    fixes = [f for f in analysis.findings if f.kind == "fix"]
    verdicts = [f for f in analysis.findings if f.kind == "verdict"]
    infos = [f for f in analysis.findings if f.kind not in ("verdict", "fix", "correction", "irregular")]
    irregular = next((f for f in analysis.findings if f.kind == "irregular"), None)
    verdict_note = ""
    if verdicts:
        verdict, verdict_change = verdicts[0].title, verdicts[0].fix or ""
        verdict_note = "" if verdict_change else verdicts[0].note or ""
    elif fixes:
        verdict, verdict_change = f"{fixes[0].title} (fix 1 below)", ""
    else:
        verdict, verdict_change = "no finding: nothing in this run stands out", ""
    rest = " · ".join(x for x in (words.throughput_text(profile, stats), accumulation_text(stats),
                                  mfu_short(analysis.mfu)) if x)
    corrected = corrected_view(analysis)
    others = infos + verdicts[1:]
    titled = [f for f in others if f.id not in SAID_BY_THE_PHASES]
    room = max(0, TOP_FIXES - len(fixes))  # the fixes first; what else was found, by title, in their room
    hidden = len(fixes[TOP_FIXES:]) + len(others) - len(titled[:room])
    return FirstScreen(
        has_steps=True, step=seconds(stats.step_s), step_how=step_how(stats), rest=rest,
        verdict=verdict, verdict_change=verdict_change, verdict_note=verdict_note,
        infos=[info_text(f) for f in titled[:room]],
        fixes=[FixLine(f.title or f.id, saving_short(f), bool(f.saving_s), f.fix or "") for f in fixes[:TOP_FIXES]],
        corrections=[f.title or f.id for f in analysis.findings if f.kind == "correction"],
        phases=phase_shares(stats, str(profile.config.get("device") or profile.environment.get("device") or "")
                                           .startswith("cuda")), outliers=outliers_text(stats, irregular),
        corrected=(", ".join(line for line, _, _ in corrected.lines) + " (write it with --write FILE)"
                   if corrected is not None else None),
        more=more_text(hidden), **common)


def info_text(f: Finding) -> str:
    """What else was found, by its title; a change timed within noise says it claims nothing."""
    noise = (f.evidence or {}).get("within_noise") and f.saving_s is None
    return (f.title or f.id) + (" (timed: within this machine's noise, no saving claimed)" if noise else "")


def not_measured_text(profile: Profile) -> str | None:
    """The parts of this run that were not measured, named in one line (the whole report says why:
    words.not_measured_lines)."""
    sections = Sections.of(profile)
    names = (["the GPU timeline (host wall time used)"] if sections.timer.reasons else []) + [
        name for name, _ in sections.unmeasured()]
    return f"{', '.join(names)} (--details says why)" if names else None


def more_text(hidden: int) -> str:
    """The first screen's last line: what --details adds (the findings not shown counted)."""
    what = f"{hidden} more finding{'s' if hidden != 1 else ''}, " if hidden > 0 else ""
    return f"{HEADINGS.details_flag}: {what}{HEADINGS.details}"
