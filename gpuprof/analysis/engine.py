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
    kind: str = "fix"  # fix | info
    note: str = ""  # e.g. why the saving cannot be estimated, or the constraint on the fix

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Context:
    """Everything a rule may read. Optional parts are None when not measured."""

    profile: Profile
    disk: dict | None = None  # a bench-disk result
    mfu: dict | None = None  # analysis.mfu result
    gpu: object | None = None  # hardware.GpuSpec
    recommendation: object | None = None  # from the recommend engine, when available

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


def rank(findings: list[Finding]) -> list[Finding]:
    def key(f: Finding):
        return (f.kind != "fix", f.saving_s is None, -(f.saving_s or 0.0), f.id)

    return sorted(findings, key=key)


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
    return rank(out)
