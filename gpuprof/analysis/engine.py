"""Runs the rules over a profile and ranks their findings.

A rule is a plain function `rule(ctx: Context) -> list[Finding]`; rules never run anything and
never print. Findings are ranked by the seconds they expect to save per step; findings that
cannot estimate a saving come after those that can, and informational ones last.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

from gpuprof.profile import Profile


@dataclass
class Finding:
    id: str  # stable identifier, part of the JSON contract
    title: str
    saving_s: float | None  # estimated seconds saved per optimizer step (None: cannot estimate)
    saving_share: float | None  # saving_s / step_s
    evidence: dict  # the numbers the rule used, from this run
    confidence: str = "medium"  # high | medium | low
    fix: str = ""  # the concrete change
    config_overrides: dict = field(default_factory=dict)  # nanoGPT config keys when a config fix
    kind: str = "fix"  # fix | correction (a wrong figure, not time) | verdict | info
    note: str = ""  # e.g. why the saving cannot be estimated, or the constraint on the fix
    # Seconds per step of each phase this finding's saving comes out of. The engine caps
    # overlapping claims so that two findings never save the same interval twice.
    claims: dict = field(default_factory=dict)
    overlaps: list = field(default_factory=list)  # ids of higher-ranked findings sharing an interval

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Context:
    """Everything a rule may read. Optional parts are None when not measured."""

    profile: Profile
    disk: dict | None = None  # a bench-disk result
    mfu: dict | None = None  # analysis.mfu result
    gpu: object | None = None  # hardware.GpuSpec

    @property
    def summary(self) -> dict:
        return self.profile.summary

    @property
    def config(self) -> dict:
        return self.profile.run.get("config", {})

    def share(self, phase: str) -> float:
        return self.summary.get("phases", {}).get(phase, {}).get("share", 0.0)

    def seconds(self, phase: str) -> float:
        return self.summary.get("phases", {}).get(phase, {}).get("seconds", 0.0)


Rule = Callable[[Context], list[Finding]]


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
            f.note = (f.note + " " if f.note else "") + (
                f"saving capped from {f.saving_s:.3g} s: it shares time with {', '.join(f.overlaps)}")
            f.saving_s = new
            if step_s:
                f.saving_share = new / step_s
    return sorted(ordered, key=key)


def analyze(ctx: Context, rules: list[Rule] | None = None) -> list[Finding]:
    """Run every rule (default: all registered) and return the ranked findings."""
    if rules is None:
        from gpuprof.analysis.rules import RULES

        rules = RULES
    if not ctx.profile.steps and not ctx.summary:
        return []
    out: list[Finding] = []
    for rule in rules:
        out.extend(rule(ctx))
    return rank(out, ctx.summary)
