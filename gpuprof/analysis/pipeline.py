"""From a Profile to its Analysis: `analyze(profile, options) -> Analysis`. Pure: it runs nothing,
prints nothing and never changes the Profile, so analysing twice gives equal results and an old
file can be judged again by newer rules.

The Analysis holds everything gpuprof concludes from a run: the step statistics it judged on
(the profile's, gpuprof.stats), true MFU, the ranked findings, the corrected config, the repairs
the bounds check made, and for a merged data-parallel run what the ranks say together. It is
saved beside the measurements in the same file (Profile.to_json(analysis.to_dict())) and read
back with `Analysis.from_dict`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from gpuprof import __version__
from gpuprof.analysis.distributed_results import DistributedStats
from gpuprof.analysis.bounds import enforce_measured, enforce_savings
from gpuprof.analysis.corrected import CorrectedConfig, merge
from gpuprof.analysis.engine import run_rules
from gpuprof.analysis.findings import Context, Finding
from gpuprof.analysis.mfu_results import MfuResult
from gpuprof.profile import Profile
from gpuprof.stats import StepStats


@dataclass(frozen=True)
class AnalysisOptions:
    """What the user told the analysis beyond the profile: the GPU or peak to divide by, an MFU
    the script printed, a bench-disk result for the data's storage."""

    gpu: str | None = None
    peak_tflops: float | None = None
    reported_mfu_pct: float | None = None
    disk: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Analysis:
    options: AnalysisOptions
    stats: StepStats | None  # the step statistics every figure and saving is judged on
    mfu: MfuResult | None  # gpuprof.analysis.mfu.compute_mfu, bounds-repaired
    findings: tuple[Finding, ...]
    corrected: CorrectedConfig
    repairs: tuple[str, ...] = ()
    distributed: DistributedStats | None = None  # gpuprof.analysis.distributed, a merged run only
    version: str = __version__  # the gpuprof that made it

    def to_dict(self) -> dict:
        return {"version": self.version, "options": self.options.to_dict(),
                "steps": self.stats.to_dict() if self.stats is not None else None,
                "mfu": self.mfu.to_dict() if self.mfu is not None else None, "findings": [f.to_dict() for f in self.findings],
                "corrected_config": self.corrected.to_dict(), "repairs": list(self.repairs),
                "distributed": self.distributed.to_dict() if self.distributed is not None else None}

    @classmethod
    def from_dict(cls, d: dict, profile: Profile) -> "Analysis":
        """The analysis saved in a file, over its profile (whose steps give the statistics)."""
        opts = d.get("options") or {}
        cc = d.get("corrected_config") or {}
        return cls(
            options=AnalysisOptions(**{k: opts.get(k) for k in AnalysisOptions.__dataclass_fields__}),
            stats=profile.stats, mfu=MfuResult.from_dict(d.get("mfu")),
            findings=tuple(Finding.from_dict(f) for f in d.get("findings") or []),
            corrected=CorrectedConfig(dict(cc.get("overrides") or {}), dict(cc.get("sources") or {}),
                                      [tuple(x) for x in cc.get("overridden") or []], dict(cc.get("current") or {})),
            repairs=tuple(d.get("repairs") or ()), distributed=DistributedStats.from_dict(d.get("distributed")),
            version=d.get("version") or "unknown")

    def finding(self, fid: str) -> Finding | None:
        return next((f for f in self.findings if f.id == fid), None)


def analyze(profile: Profile, options: AnalysisOptions | None = None, **kw) -> Analysis:
    """The Analysis of `profile` (options, or their fields as keywords: gpu=, peak_tflops=,
    reported_mfu_pct=, disk=)."""
    from gpuprof.analysis.mfu import compute_mfu
    from gpuprof.hardware import find_gpu

    options = options or AnalysisOptions(**kw)
    stats = profile.stats
    distributed = None
    if profile.ranks:
        from gpuprof.analysis.distributed import distributed_stats

        distributed = distributed_stats(profile.ranks, profile.run.get("world_size"))
    if stats is None:
        return Analysis(options, None, None, (), CorrectedConfig(), distributed=distributed)
    # A script's own printed MFU is read by compute_mfu when the user gave none.
    mfu = compute_mfu(profile, gpu=options.gpu, peak_tflops=options.peak_tflops,
                      reported_mfu_pct=options.reported_mfu_pct)
    mfu, repairs = enforce_measured(profile, mfu)  # measured figures first: the rules read only possible ones
    spec = find_gpu(options.gpu) if options.gpu else find_gpu(profile.environment.get("device_name"))
    ctx = Context(profile=profile, stats=stats, disk=options.disk, mfu=mfu, gpu=spec, distributed=distributed)
    findings = run_rules(ctx)
    if profile.ranks:  # a merged data-parallel run: the one-process rules read one rank's view
        from gpuprof.analysis.rules.distributed import RULES as DISTRIBUTED
        from gpuprof.analysis.rules.sharded import RULES as SHARDED

        own = {r.__name__.replace("_", "-") for r in (*DISTRIBUTED, *SHARDED)}
        view = profile.run.get("rank")
        findings = [replace(f, title=f"rank {view}: {f.title}")
                    if f.id not in own and view is not None and not f.title.startswith("rank ") else f
                    for f in findings]
    if profile.run.get("mode") == "script":  # each change in the script's own flags (analysis/script_knobs.py)
        from gpuprof.analysis.script_knobs import find_knobs, worded

        knobs = find_knobs(profile.config, int(profile.run.get("world_size") or 1))
        findings = [worded(f, profile.config, knobs=knobs) for f in findings]
    findings, more = enforce_savings(stats, findings)  # last: nothing impossible reaches the report
    return Analysis(options, stats, mfu, tuple(findings), merge(findings, profile.config),
                    tuple(repairs + more), distributed)

