"""From a Profile to its analysis: MFU figures and ranked findings. Runs nothing."""

from __future__ import annotations

from gpuprof.analysis.bounds import enforce
from gpuprof.analysis.corrected import merge
from gpuprof.analysis.engine import Context, Finding, analyze
from gpuprof.profile import Profile


def analyze_profile(profile: Profile, *, gpu: str | None = None, peak_tflops: float | None = None,
                    reported_mfu_pct: float | None = None, disk: dict | None = None) -> list[Finding]:
    """Compute MFU (stored at profile.summary['mfu']) and the ranked findings
    (stored at profile.findings as dicts); returns the findings."""
    from gpuprof.analysis.mfu import compute_mfu
    from gpuprof.hardware import find_gpu

    mfu = None
    repairs: list[str] = []
    if profile.summary:
        mfu = compute_mfu(profile, gpu=gpu, peak_tflops=peak_tflops, reported_mfu_pct=reported_mfu_pct)
        profile.summary["mfu"] = mfu
        repairs = enforce(profile, [])  # measured figures first: the rules read only possible ones
    spec = find_gpu(gpu) if gpu else find_gpu(profile.environment.get("device_name"))
    ctx = Context(profile=profile, disk=disk, mfu=mfu, gpu=spec)
    findings = analyze(ctx)
    if profile.ranks:  # a merged data-parallel run: the one-process rules read one rank's view
        from gpuprof.analysis.rules.distributed import RULES as DISTRIBUTED

        own = {r.__name__.replace("_", "-") for r in DISTRIBUTED}
        view = profile.run.get("rank")
        for f in findings:
            if f.id not in own and view is not None and not f.title.startswith("rank "):
                f.title = f"rank {view}: {f.title}"
    if profile.summary:
        repairs += enforce(profile, findings)  # last: nothing impossible reaches the report or the JSON
        profile.summary["bounds"] = repairs  # this analysis's own (a re-analysis replaces them)
    profile.findings = [f.to_dict() for f in findings]
    profile.summary["corrected_config"] = merge(findings, profile.run.get("config")).to_dict() \
        if profile.summary else None
    return findings
