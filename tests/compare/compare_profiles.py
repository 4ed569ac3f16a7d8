"""Hand-built profiles for the compare tests: chosen numbers, so the arithmetic can be checked exactly.
(A module with its own name, not conftest: several test folders have a conftest.py.)

A profile is measurements only; what a run concluded (findings, MFU) is its Analysis. `hand`
builds both, as a (Profile, Analysis) pair, with the Analysis holding exactly the findings and
the MFU given (what a saved file's analysis would say), so that analysis.compare can be checked
against hand arithmetic independently of the rules."""

from __future__ import annotations

from gpuprof.analysis.corrected import CorrectedConfig
from gpuprof.analysis.findings import Finding
from gpuprof.analysis.mfu_results import MfuResult
from gpuprof.analysis.pipeline import Analysis, AnalysisOptions
from gpuprof.profile import Profile, StepRecord

BASE_PHASES = {"data": 0.30, "h2d": 0.0, "forward": 0.20, "backward": 0.40, "optimizer": 0.08, "other": 0.02}


def finding(fid: str, saving: float | None, claims: dict | None = None, kind: str = "fix",
            step: float = 1.0, overlaps: list | None = None, evidence: dict | None = None) -> Finding:
    """A finding as an analysis holds them."""
    return Finding(id=fid, title=f"{fid} title words", kind=kind, saving_s=saving,
                   saving_share=None if saving is None else saving / step, evidence=dict(evidence or {}),
                   confidence="high", fix="", config_overrides={}, note="",
                   claims=dict(claims or {}), overlaps=list(overlaps or []))


def hand_profile(steps: list[dict], *, tokens: int = 4096, config: dict | None = None,
                 device_name: str = "CPU", world_size: int = 1) -> Profile:
    """A CPU profile whose steps have exactly these phases (each step's wall = their sum)."""
    records = [StepRecord(i, sum(p.values()), dict(p), tokens=tokens, micro_steps=4) for i, p in enumerate(steps)]
    cfg = {"device": "cpu", "model": "tiny", "batch_size": 8, "block_size": 128, "grad_accum": 4,
           "dtype": "fp32", "tokens_per_step": tokens}
    cfg.update(config or {})
    return Profile(run={"mode": "builtin", "config": cfg, "world_size": world_size}, steps=records,
                   environment={"device": "cpu", "device_name": device_name})


def hand_analysis(prof: Profile, findings: list | None = None, mfu: MfuResult | None = None) -> Analysis:
    """The analysis of `prof` that concluded exactly these findings and this MFU."""
    return Analysis(options=AnalysisOptions(), stats=prof.stats, mfu=mfu, findings=tuple(findings or ()),
                    corrected=CorrectedConfig())


def hand(steps: list[dict], *, findings: list | None = None, mfu: MfuResult | None = None, **kw) -> tuple:
    """(Profile, Analysis): hand_profile(steps, **kw) and its hand-made analysis."""
    prof = hand_profile(steps, **kw)
    return prof, hand_analysis(prof, findings, mfu)


def noise(n: int, start: int = 0, spread: float = 0.08) -> list[float]:
    """n deterministic step-time multipliers spread evenly over 1 ± spread, in a scrambled order
    (the golden-ratio sequence: no random generator, so the tests never depend on one)."""
    return [1 + spread * (2 * ((k * 0.6180339887498949) % 1) - 1) for k in range(start, start + n)]


def scaled_steps(mults: list[float]) -> list[dict]:
    """Steps of BASE_PHASES (1.0 s) each scaled whole by its multiplier."""
    return [{k: v * m for k, v in BASE_PHASES.items()} for m in mults]
