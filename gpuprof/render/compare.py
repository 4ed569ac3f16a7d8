"""`gpuprof compare` as a terminal report (rich) and as JSON.

Readable at 80 columns: the tables hold only short cells (figures, phase names, finding ids) and
never wrap or cut one; titles and explanations are prose lines below them, which wrap at spaces.
"""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpuprof.analysis.compare import Comparison, Figure, Outcome
from gpuprof.units import NM, pct, seconds, signed_seconds


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


def _table(first: str, *names: str) -> Table:
    """A table whose first column (left) names the row and the others (right) hold figures."""
    t = Table()
    t.add_column(first, justify="left", no_wrap=True)
    for name in names:
        t.add_column(name, justify="right", no_wrap=True)
    return t


def summary_table(c: Comparison) -> Table:
    """Step time, throughput, MFU before/after with the change."""
    t = _table("figure", "before", "after", "change")
    t.add_row("step (typical)", seconds(c.step_s.before), seconds(c.step_s.after), change_cell(c.step_s))
    if c.basis == "token":
        t.add_row("per 1M tokens", seconds(c.time.before), seconds(c.time.after), change_cell(c.time))
    t.add_row("tokens/step", _rate(c.tokens_per_step.before), _rate(c.tokens_per_step.after),
              change_cell(c.tokens_per_step, _signed_rate))
    t.add_row("tokens/s", _rate(c.tokens_per_s.before), _rate(c.tokens_per_s.after),
              change_cell(c.tokens_per_s, _signed_rate))
    for label, fig in (("MFU", c.mfu), ("MFU vs ceiling", c.mfu_vs_ceiling)):
        t.add_row(label, pct(fig.before), pct(fig.after), _pct_points(fig.change))
    t.add_row("step spread", pct(c.spread.before, 0), pct(c.spread.after, 0),
              _pct_points(c.spread.change))
    if c.world_size.change:
        t.add_row("world size", f"{c.world_size.before:.0f}", f"{c.world_size.after:.0f}",
                  f"{c.world_size.change:+.0f}")
    return t


def phase_table(c: Comparison) -> Table:
    """Each phase's mean time (per step, or per 1M tokens) and share, before/after."""
    t = _table("phase", "before", "after", "change", "share")
    for p in c.phases:
        share = f"{pct(p.share.before, 0)} → {pct(p.share.after, 0)}"
        t.add_row(p.phase, seconds(p.time.before), seconds(p.time.after), change_cell(p.time, digits=0),
                  share)
    return t


def _ratio(x: float | None) -> str:
    return NM if x is None else f"{x:.2f}"


def outcome_table(outcomes: list[Outcome]) -> Table:
    """BEFORE's findings with a predicted saving: predicted vs achieved seconds, and the ratio."""
    t = _table("finding (BEFORE)", "predicted", "achieved", "ratio")
    t.add_column("verdict", justify="left", no_wrap=True)
    for o in outcomes:
        ratio = "n/a" if o.ratio is None and o.predicted_s == 0 else _ratio(o.ratio)
        t.add_row(o.id, seconds(o.predicted_s), seconds(o.achieved_s), ratio, o.verdict)
    return t


def outcome_line(o: Outcome) -> str:
    """How one finding's achieved saving was measured, and what else moved."""
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
    return f"  {o.id}: {how}"


def _value(v) -> str:
    return "not set" if v is None else repr(v) if isinstance(v, str) else str(v)


def render_comparison(c: Comparison, console: Console) -> None:
    """Print the comparison: what it compares and on which basis, the figures, the phases, BEFORE's
    findings predicted vs achieved, AFTER's new findings, the config changes and notes."""
    head = Text()
    head.append("gpuprof compare", style="bold")
    head.append(f"  BEFORE {c.before_name}  →  AFTER {c.after_name}")
    console.print(head, highlight=False)
    console.print(Text(c.basis_note, style="yellow" if c.basis == "token" else "dim"), highlight=False)
    console.print(summary_table(c))
    for key, why in c.not_measured.items():
        label = "MFU vs ceiling" if key == "mfu_vs_ceiling" else "MFU"
        console.print(Text(f"  {label} not measured: {why}", style="dim"), highlight=False)
    timeline = c.timeline[0] if c.timeline[0] == c.timeline[1] else f"{c.timeline[0]} / {c.timeline[1]}"
    per = "per 1M tokens" if c.basis == "token" else "per step"
    console.print(Text(f"Phases (per typical step{'' if per == 'per step' else ', ' + per}, {timeline} timeline)",
                       style="bold"), highlight=False)
    console.print(phase_table(c))
    fixes = [o for o in c.outcomes if o.predicted_s is not None]
    others = [o for o in c.outcomes if o.predicted_s is None]
    if fixes:
        unit = f" of {c.tokens_per_step.before:,.0f} tokens" if c.basis == "token" else ""
        console.print(Text(f"BEFORE's findings: predicted vs achieved saving (seconds per BEFORE "
                           f"step{unit})", style="bold"), highlight=False)
        console.print(outcome_table(fixes))
        for o in fixes:
            console.print(Text(outcome_line(o), style="dim"), highlight=False)
    if others:
        words = ", ".join(f"{o.id} ({'still found' if o.in_after else 'gone'})" for o in others)
        console.print(Text(f"BEFORE's findings without a predicted saving: {words}"), highlight=False)
    if not c.outcomes:
        console.print(Text("BEFORE has no findings", style="dim"), highlight=False)
    if c.new_findings:
        console.print(Text("New in AFTER:", style="bold"), highlight=False)
        for f in c.new_findings:
            saves = f"saves {seconds(f['saving_s'])}" if f.get("saving_s") is not None else f["kind"]
            console.print(Text(f"  + {f['id']}: {f['title']} ({saves})"), highlight=False)
    if c.config_changes:
        console.print(Text("Config changes (run.config):", style="bold"), highlight=False)
        for ch in c.config_changes:
            console.print(Text(f"  {ch['key']}: {_value(ch['before'])} → {_value(ch['after'])}"),
                          highlight=False)
    else:
        console.print(Text("Config: no key of run.config changed", style="dim"), highlight=False)
    for note in c.notes:
        console.print(Text(f"note: {note}", style="yellow"), highlight=False)


def comparison_json(c: Comparison, gate: dict | None = None) -> str:
    """The comparison as JSON (analysis.compare.Comparison.to_dict), plus the CI gate when set."""
    d = c.to_dict()
    if gate is not None:
        d["gate"] = gate
    return json.dumps(d, indent=2)
