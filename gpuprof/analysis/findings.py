"""The units of analysis: a Finding (one rule's conclusion, with its evidence and saving) and the
Context a rule reads. Rules and the engine both import this module; neither imports the other's
internals."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import Callable

from gpuprof.analysis.distributed_results import DistributedStats
from gpuprof.analysis.mfu_results import MfuResult
from gpuprof.profile import Profile
from gpuprof.sections import Sections
from gpuprof.stats import StepStats


@dataclass(frozen=True)
class Finding:
    id: str  # stable identifier, part of the JSON contract
    title: str
    saving_s: float | None = None  # estimated seconds saved per optimizer step (None: cannot estimate)
    # saving_s ÷ the typical step: derived in one place (engine.with_share), never by a rule
    saving_share: float | None = None
    evidence: dict = field(default_factory=dict)  # the numbers the rule used, from this run
    confidence: str = "medium"  # high | medium | low
    fix: str = ""  # the concrete change
    config_overrides: dict = field(default_factory=dict)  # nanoGPT config keys when a config fix
    # The settings the fix's change sets, in the same names, also where they stay out of the
    # corrected config (a change timed within noise): what the script's own terms are found for
    # (analysis/script_knobs.py). Empty: config_overrides' are the settings.
    settings: dict = field(default_factory=dict)
    kind: str = "fix"  # fix | correction (a wrong figure, not time) | verdict | info
    note: str = ""  # e.g. why the saving cannot be estimated, or the constraint on the fix
    # The evidence in words, with units: a sentence or two the rule writes from the same numbers
    # it puts in `evidence` (formatted with gpuprof.units), e.g. "data: 1.20 s per step, 26.8% of
    # the step; the host's CPUs were 8% busy while it loaded: it waits, it does not compute".
    # The report shows it; `evidence` stays the machine-readable dict. Empty: the renderer
    # words the evidence dict itself (gpuprof.render.format.evidence_words).
    because: str = ""
    # Seconds per step of each phase this finding's saving comes out of. The engine caps
    # overlapping claims so that two findings never save the same interval twice.
    claims: dict = field(default_factory=dict)
    overlaps: list = field(default_factory=list)  # ids of higher-ranked findings sharing an interval
    # ids of fixes whose saving's interval overlaps this one's, set by the engine for the top fix
    # and those tied with it: the measurements do not order them (issue #29)
    tied_with: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        """A finding as saved (to_dict); keys this version does not know are left out."""
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def with_share(f: Finding, step_s: float | None) -> Finding:
    """The finding with saving_share = saving_s ÷ the typical step: the one place it is derived
    (the engine for every finding, bounds for a capped one)."""
    share = f.saving_s / step_s if f.saving_s is not None and step_s else None
    return f if share == f.saving_share else replace(f, saving_share=share)


@dataclass(frozen=True)
class Context:
    """Everything a rule may read. Optional parts are None when not measured. `stats` are the
    profile's step statistics: every saving is a share of stats.step_s, the typical step."""

    profile: Profile
    stats: StepStats
    disk: dict | None = None  # a bench-disk result
    mfu: MfuResult | None = None  # analysis.mfu.compute_mfu's result, bounds-repaired
    gpu: object | None = None  # hardware.GpuSpec
    distributed: DistributedStats | None = None  # analysis.distributed (a merged multi-rank run)

    @property
    def config(self) -> dict:
        return self.profile.config

    @property
    def measurements(self) -> dict:
        return self.profile.measurements

    @cached_property
    def sections(self) -> Sections:
        """The profile's measurements, typed (gpuprof.sections): what rules read. Read once per
        Context (one analysis)."""
        return self.profile.sections

    def share(self, phase: str) -> float:
        return self.stats.share(phase)

    def seconds(self, phase: str) -> float:
        return self.stats.seconds(phase)


Rule = Callable[[Context], list[Finding]]
