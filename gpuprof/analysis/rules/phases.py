"""Rules about how the step's time splits into phases."""

from __future__ import annotations

from gpuprof.analysis.engine import Context, Finding

PHASE_MEANING = {
    "data": "loading batches on the host",
    "h2d": "copying batches to the device",
    "forward": "the forward pass",
    "backward": "the backward pass",
    "optimizer": "clipping, the optimizer step and zero_grad",
    "other": "loop code outside the measured phases",
    "eval": "evaluation inside the training step",
}


def dominant_phase(ctx: Context) -> list[Finding]:
    """Names the phase that takes the largest share of the step (information, not a fix)."""
    phases = ctx.summary.get("phases") or {}
    if not phases:
        return []
    name, entry = max(phases.items(), key=lambda kv: kv[1].get("seconds", 0.0))
    step_s = ctx.summary.get("step_s", 0.0)
    return [
        Finding(
            id="dominant-phase",
            title=f"{name} takes {entry['share']:.0%} of the step ({PHASE_MEANING.get(name, name)})",
            saving_s=None,
            saving_share=None,
            evidence={"phase": name, "phase_s": entry["seconds"], "share": entry["share"],
                      "step_s": step_s, "timeline": ctx.summary.get("timeline")},
            confidence="high",
            kind="info",
        )
    ]
