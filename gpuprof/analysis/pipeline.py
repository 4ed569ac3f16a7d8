"""From a Profile to its analysis: MFU figures and ranked findings. Runs nothing."""

from __future__ import annotations

from gpuprof.analysis.engine import Context, Finding, analyze
from gpuprof.profile import Profile


def analyze_profile(profile: Profile, *, gpu: str | None = None, peak_tflops: float | None = None,
                    reported_mfu_pct: float | None = None, disk: dict | None = None) -> list[Finding]:
    """Compute MFU (stored at profile.summary['mfu']) and the ranked findings
    (stored at profile.findings as dicts); returns the findings."""
    from gpuprof.hardware import find_gpu

    try:  # TODO(integration): analysis.mfu lands with issue #4
        from gpuprof.analysis.mfu import compute_mfu
    except ImportError:
        compute_mfu = None
    mfu = None
    if profile.summary and compute_mfu is not None:
        mfu = compute_mfu(profile, gpu=gpu, peak_tflops=peak_tflops, reported_mfu_pct=reported_mfu_pct)
        profile.summary["mfu"] = mfu
    spec = find_gpu(gpu) if gpu else find_gpu(profile.environment.get("device_name"))
    if spec is None and not str(profile.run.get("config", {}).get("device", "")).startswith("cuda"):
        spec = None
    ctx = Context(profile=profile, disk=disk, mfu=mfu, gpu=spec)
    findings = analyze(ctx)
    profile.findings = [f.to_dict() for f in findings]
    return findings
