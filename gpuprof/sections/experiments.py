"""measurements.experiments (measure/experiments.py): each fix gpuprof switched on and off in the
script's own loop after its measured steps, and what its paired steps say."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuprof.sections.base import Record, Section, items, mapping


@dataclass(frozen=True)
class Experiment(Record):
    """One fix's experiment: `ratio` = the median over pairs of (step with the fix ÷ step without),
    `interval` its sign-test interval (measure.paired.Interval.as_dict); `not_measured` when it has
    fewer pairs than an interval needs, or the script raised under it (`failed`)."""

    id: str | None = None  # "precision:bf16", "precision:fp32", "precision:tf32", "optimizer:fused", "compile"
    fix: str | None = None
    settings: dict = field(default_factory=dict)  # nanoGPT config keys the fix stands for
    pairs: int | None = None
    planned_pairs: int | None = None
    ratio: float | None = None
    interval: dict | None = None
    a_median_s: float | None = None  # the step as the script runs, median over the pairs
    b_median_s: float | None = None  # with the fix (over `phases` only: b_local_s's median)
    a_s: list = field(default_factory=list)
    b_s: list = field(default_factory=list)
    warmup_s: list = field(default_factory=list)
    not_measured: str | None = None
    failed: dict | None = None
    calls: list = field(default_factory=list)  # attention:sdpa: the by-hand attention calls it rewrote (op trace)
    # A fix that changes only these phases (fused AdamW: ["optimizer"]): `ratio` compares them, each
    # pair's `b` step taken as its `a` step with those phases as `b` ran them (`b_local_s`); `b_s`
    # are the `b` steps whole, `step_ratio`/`step_interval` what the whole steps say. None: whole steps.
    phases: list | None = None
    b_local_s: list = field(default_factory=list)
    step_ratio: float | None = None
    step_interval: dict | None = None
    # Each way's kernel time per step (mean over its timed steps) and minor page faults (median):
    # {"a": …, "b": …}; None in an older profile or where the OS has no per-thread counts.
    kernel_s: dict | None = None
    minor_faults: dict | None = None

    @property
    def measured(self) -> bool:
        return self.ratio is not None and self.interval is not None and not self.not_measured


@dataclass(frozen=True)
class ExperimentsSection(Section):
    allotted_s: float | None = None
    spent_s: float | None = None
    step_s: float | None = None
    results: tuple[Experiment, ...] = ()
    skipped: list = field(default_factory=list)
    not_applicable: dict = field(default_factory=dict)
    stopped_early: str | None = None

    @classmethod
    def _nested(cls, d: dict) -> dict:
        return {"results": tuple(Experiment.from_dict(r) for r in items(d.get("results")) if isinstance(r, dict)),
                "not_applicable": mapping(d.get("not_applicable"))}

    def get(self, exp_id: str) -> Experiment | None:
        """The experiment of that fix, None when it did not run."""
        return next((e for e in self.results if e.id == exp_id), None)

    def measured(self, prefix: str) -> Experiment | None:
        """The first measured experiment whose id starts with `prefix` ("precision:")."""
        return next((e for e in self.results if e.id and e.id.startswith(prefix) and e.measured), None)
