"""Runs the rules over a profile and ranks their findings.

A rule is a plain function `rule(ctx: Context) -> list[Finding]`; rules never run anything and
never print. Findings are ranked by the seconds they expect to save per step; findings that
cannot estimate a saving come after those that can, and informational ones last.
"""

from __future__ import annotations

from gpuprof.analysis.findings import Context, Finding, Rule  # noqa: F401 - re-exported
from gpuprof.analysis.rules import RULES
from gpuprof.units import join_notes, seconds


_KIND_ORDER = {"fix": 0, "correction": 1, "verdict": 2, "info": 3}


def rank(findings: list[Finding], summary: dict | None = None) -> list[Finding]:
    """Sort fixes by saving (largest first), then fixes that cannot estimate, corrections of
    wrong figures, verdicts, information.

    Savings that claim the same phase interval are capped: a lower-ranked finding keeps only
    what the higher-ranked ones left of that interval, so savings never add up to more than
    the step."""

    def key(f: Finding):
        return (_KIND_ORDER.get(f.kind, 4), f.saving_s is None, -(f.saving_s or 0.0), f.id)

    summary = summary or {}
    step_s = summary.get("mean_step_s") or summary.get("step_s")
    ordered = sorted(findings, key=key)
    budget = {p: e.get("seconds", 0.0) for p, e in (summary.get("phases") or {}).items()}
    owners: dict[str, list[str]] = {}
    for f in ordered:
        if f.saving_s is None or not f.claims:
            continue
        capped = 0.0
        for phase, sec in f.claims.items():
            left = budget.setdefault(phase, sec)
            if phase in owners:
                f.overlaps.extend(o for o in owners[phase] if o not in f.overlaps)
            take = min(sec, max(left, 0.0))
            budget[phase] = left - take
            owners.setdefault(phase, []).append(f.id)
            capped += take
        # Savings that are not pinned to a phase (e.g. faster kernels) stay as estimated.
        unpinned = max(f.saving_s - sum(f.claims.values()), 0.0)
        new = capped + unpinned
        if new < f.saving_s - 1e-12:
            why = (f"it shares time with {', '.join(f.overlaps)}" if f.overlaps
                   else "the phases it comes out of take less than that per step")
            f.note = join_notes(f.note, f"saving capped from {seconds(f.saving_s)}: {why}")
            f.saving_s = new
            if step_s:
                f.saving_share = new / step_s
    return sorted(ordered, key=key)


def analyze(ctx: Context, rules: list[Rule] | None = None) -> list[Finding]:
    """Run every rule (default: all registered) and return the ranked findings."""
    if rules is None:
        rules = RULES
    if not ctx.profile.steps and not ctx.summary:
        return []
    out: list[Finding] = []
    for rule in rules:
        out.extend(rule(ctx))
    return rank(out, ctx.summary)
