"""`gpuprof compare` decided once: every cell, heading and line the comparison prints, from
gpuprof.analysis.compare's Comparison. The terminal renderer (gpuprof.render.compare) places them.

The tables hold only short cells (figures, phase names, finding ids), so they never wrap or cut
at 80 columns; titles and explanations are prose lines, which wrap at spaces."""

from __future__ import annotations

from dataclasses import dataclass

from gpuprof.analysis.compare import REALISED_TOL, Comparison, Figure, Outcome
from gpuprof.units import NA, NM, pct, seconds, seconds_range, signed_seconds


@dataclass(frozen=True)
class Rows:
    """A table: its column names (the first names the row, the others hold figures) and rows."""
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    text_columns: int = 1  # how many columns from the left hold words (left-aligned)
    last_is_text: bool = False  # a trailing words column (the outcome's verdict)


@dataclass(frozen=True)
class CompareView:
    title: str
    names: str  # BEFORE ... → AFTER ...
    basis_note: str
    per_token: bool
    summary: Rows
    step_change: str | None  # the interval of the change of the typical step (or time per token)
    not_measured: tuple[str, ...]
    phases_heading: str
    phases: Rows
    outcomes_heading: str | None  # BEFORE's findings with a predicted saving
    outcomes: Rows | None
    outcome_lines: tuple[str, ...]
    unpredicted: str | None  # BEFORE's findings without a predicted saving
    no_findings: str | None
    new_heading: str | None
    new_lines: tuple[str, ...]
    config_heading: str
    config_lines: tuple[str, ...]
    config_changed: bool
    notes: tuple[str, ...]


def change_cell(fig: Figure, fmt=signed_seconds, digits: int = 1) -> str:
    """`+12.0 ms (+5.0%)`; the percentage only where BEFORE is non-zero."""
    if fig.change is None:
        return NM
    if fig.change == 0:
        return "0"
    text = fmt(fig.change)
    if fig.change_pct is not None and fig.change:
        text += f" ({fig.change_pct * 100:+.{digits}f}%)"
    return text


def _rate(x: float | None) -> str:
    return NM if x is None else f"{x:,.0f}"


def _signed_rate(x: float | None) -> str:
    return NM if x is None else f"{x:+,.0f}"


def _pct_points(x: float | None) -> str:
    return NM if x is None else f"{x * 100:+.1f} pt"


def _ratio(x: float | None) -> str:
    return NM if x is None else f"{x:.2f}"


def summary_rows(c: Comparison) -> Rows:
    """Step time, throughput, MFU before/after with the change."""
    rows = [("step (typical)", seconds(c.step_s.before), seconds(c.step_s.after), change_cell(c.step_s))]
    if c.basis == "token":
        rows.append(("per 1M tokens", seconds(c.time.before), seconds(c.time.after), change_cell(c.time)))
    rows += [("tokens/step", _rate(c.tokens_per_step.before), _rate(c.tokens_per_step.after),
              change_cell(c.tokens_per_step, _signed_rate)),
             ("tokens/s", _rate(c.tokens_per_s.before), _rate(c.tokens_per_s.after),
              change_cell(c.tokens_per_s, _signed_rate))]
    for label, fig in (("MFU", c.mfu), ("MFU vs ceiling", c.mfu_vs_ceiling)):
        rows.append((label, pct(fig.before), pct(fig.after), _pct_points(fig.change)))
    rows.append(("step spread", pct(c.spread.before, 0), pct(c.spread.after, 0), _pct_points(c.spread.change)))
    if c.world_size.change:
        rows.append(("world size", f"{c.world_size.before:.0f}", f"{c.world_size.after:.0f}",
                     f"{c.world_size.change:+.0f}"))
    return Rows(("figure", "before", "after", "change"), tuple(rows))


def phase_rows(c: Comparison) -> Rows:
    """Each phase's mean time (per step, or per 1M tokens) and share, before/after."""
    rows = tuple((p.phase, seconds(p.time.before), seconds(p.time.after), change_cell(p.time, digits=0),
                  f"{pct(p.share.before, 0)} → {pct(p.share.after, 0)}") for p in c.phases)
    return Rows(("phase", "before", "after", "change", "share"), rows)


def outcome_rows(outcomes: list[Outcome]) -> Rows:
    """BEFORE's findings with a predicted saving: predicted vs achieved seconds, and the ratio."""
    rows = tuple((o.id, seconds(o.predicted_s), seconds(o.achieved_s),
                  NA if o.ratio is None and o.predicted_s == 0 else _ratio(o.ratio), o.verdict)
                 for o in outcomes)
    return Rows(("finding (BEFORE)", "predicted", "achieved", "ratio", "verdict"), rows, last_is_text=True)


def signed_pct(ratio: float) -> str:
    """A ratio AFTER ÷ BEFORE as a signed change: 1.105 -> +10.5%."""
    return f"{(ratio - 1) * 100:+.1f}%"


def step_change_line(c: Comparison) -> str | None:
    """The interval of the change of the typical step (per token on that basis) and what it says."""
    sc = c.step_change
    if sc is None:
        return None
    per = "per token" if c.basis == "token" else "per step"
    steps = f"{sc.n_before} and {sc.n_after} steps"
    if not sc.enough:
        return f"change interval: {steps} are too few for a {sc.requested:.0%} interval"
    says = ("holds no change: within run-to-run noise" if sc.within_noise else
            f"{'slower' if sc.low > 1 else 'faster'} beyond run-to-run noise")
    return (f"change interval: {signed_pct(sc.low)} to {signed_pct(sc.high)} {per} ({sc.level:.0%}, "
            f"Mann–Whitney, {steps}): {says}")


def verify_line(o: Outcome) -> str:
    """`diagnose --verify`'s last line: the top fix's promise, what the re-run achieved, the verdict
    and which rule judged it (the saving's interval, or ±15%)."""
    ratio = f" (achieved / predicted {o.ratio:.2f})" if o.ratio is not None else ""
    j = judgement(o)
    return (f"--verify: `{o.id}` predicted {seconds(o.predicted_s)}, achieved {seconds(o.achieved_s)} per step"
            f"{ratio}: {o.verdict}" + (f"; {j}" if j else ""))


def judgement(o: Outcome) -> str | None:
    """Achieved against the promise, and which rule judged it: the saving's interval, or ±15%."""
    if o.judged_by == "interval":
        lo, hi = o.promised_low_s, o.promised_high_s
        where = {"realised": "inside", "exceeded": "above"}.get(o.verdict, "below")
        level = "" if o.interval_level is None else f"{o.interval_level:.0%}"
        extra = ", ".join(x for x in (level, f"{o.rounds} rounds" if o.rounds else "") if x)
        return f"achieved {seconds(o.achieved_s)}, {where} the promised {seconds_range(lo, hi)}" + (
            f" ({extra})" if extra else "")
    if o.judged_by == "tolerance":
        return f"no interval: judged on ±{REALISED_TOL:.0%} of the prediction"
    return None


def outcome_line(o: Outcome) -> str:
    """How one finding's achieved saving was judged and measured, and what else moved."""
    if o.measured_from == "phases":
        how = f"achieved = drop of {' + '.join(o.phases)}"
        if o.other_phases_change_s is not None:
            how += f"; the other phases {signed_seconds(o.other_phases_change_s)}"
    else:
        how = "achieved = drop of the typical step (the finding names no phases)"
    if o.in_after:
        after = seconds(o.after_saving_s) if o.after_saving_s is not None else "no estimate"
        how += f"; still found in AFTER (predicts {after})"
    else:
        how += "; gone in AFTER"
    if o.overlaps:
        how += f"; shares its phases with {', '.join(o.overlaps)}: the drop counts both"
    said = judgement(o)
    return f"  {o.id}: {said + '; ' if said else ''}{how}"


def unpredicted(o: Outcome) -> str:
    """A finding of BEFORE without a predicted saving: whether AFTER still has it, and, when its
    timing held no change, the interval it was within."""
    found = "still found" if o.in_after else "gone"
    if o.within_noise and o.promised_low_s is not None:
        return f"{o.id} ({found}; within noise when timed: {seconds_range(o.promised_low_s, o.promised_high_s)})"
    return f"{o.id} ({found})"


def _value(v) -> str:
    return "not set" if v is None else repr(v) if isinstance(v, str) else str(v)


def compare_view(c: Comparison) -> CompareView:
    """What the comparison prints: what it compares and on which basis, the figures, the phases,
    BEFORE's findings predicted vs achieved, AFTER's new findings, the config changes and notes."""
    timeline = c.timeline[0] if c.timeline[0] == c.timeline[1] else f"{c.timeline[0]} / {c.timeline[1]}"
    per_token = c.basis == "token"
    fixes = [o for o in c.outcomes if o.predicted_s is not None]
    others = [o for o in c.outcomes if o.predicted_s is None]
    unit = f" of {c.tokens_per_step.before:,.0f} tokens" if per_token else ""
    return CompareView(
        title="gpuprof compare",
        names=f"BEFORE {c.before_name}  →  AFTER {c.after_name}",
        basis_note=c.basis_note, per_token=per_token,
        summary=summary_rows(c), step_change=step_change_line(c),
        not_measured=tuple(f"  {'MFU vs ceiling' if key == 'mfu_vs_ceiling' else 'MFU'} not measured: {why}"
                           for key, why in c.not_measured.items()),
        phases_heading=f"Phases (per typical step{', per 1M tokens' if per_token else ''}, {timeline} timeline)",
        phases=phase_rows(c),
        outcomes_heading=(f"BEFORE's findings: predicted vs achieved saving (seconds per BEFORE step{unit})"
                          if fixes else None),
        outcomes=outcome_rows(fixes) if fixes else None,
        outcome_lines=tuple(outcome_line(o) for o in fixes),
        unpredicted=("BEFORE's findings without a predicted saving: "
                     + ", ".join(unpredicted(o) for o in others)
                     if others else None),
        no_findings=None if c.outcomes else "BEFORE has no findings",
        new_heading="New in AFTER:" if c.new_findings else None,
        new_lines=tuple(f"  + {f['id']}: {f['title']} "
                        f"({'saves ' + seconds(f['saving_s']) if f.get('saving_s') is not None else f['kind']})"
                        for f in c.new_findings),
        config_heading=("Config changes (run.config; precision.* as measured at the first step):" if c.config_changes
                        else "Config: no key of run.config or of the measured precision changed"),
        config_lines=tuple(f"  {ch['key']}: {_value(ch['before'])} → {_value(ch['after'])}" for ch in c.config_changes),
        config_changed=bool(c.config_changes),
        notes=tuple(f"note: {n}" for n in c.notes),
    )
