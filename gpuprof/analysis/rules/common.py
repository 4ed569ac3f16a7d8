"""Small helpers the rules share: exposure of a phase, device tests, config access."""

from __future__ import annotations

from gpuprof.analysis.findings import Context

COMPUTE_PHASES = ("forward", "backward", "optimizer")


def on_cuda(ctx: Context) -> bool:
    return str(ctx.config.get("device") or ctx.profile.environment.get("device") or "").startswith("cuda")


def exposed_s(ctx: Context, phase: str) -> float:
    """Seconds per step that `phase` keeps the device from computing.

    On the GPU timeline a host-only phase's span is the idle time it exposed; on a CPU run
    the host is the device, so the phase's whole wall time is exposed."""
    entry = ctx.summary.get("phases", {}).get(phase, {})
    if ctx.summary.get("timeline") == "gpu" and "idle_exposed_s" in entry and phase in ("data", "other"):
        return entry["idle_exposed_s"]
    return entry.get("seconds", 0.0)


def step_s(ctx: Context) -> float:
    """The step that savings are shares of: the mean step (the sum of the mean phase seconds),
    the same denominator as every phase share, so a finding's share and the phase table agree.
    summary.step_s, the median, is what the report shows as "the" step time."""
    return ctx.summary.get("mean_step_s") or ctx.summary.get("step_s") or 0.0


def shown_step_s(ctx: Context) -> float | None:
    """The step the report prints, once, labelled with its statistic: summary.step_s, the median
    step (on the GPU timeline on CUDA). A `because` sentence that quotes the step quotes this one,
    and evidence["step_s"] holds it, so the page and the JSON carry one value for the step."""
    return ctx.summary.get("step_s") or None


def step_evidence(ctx: Context) -> dict:
    """The step figures a finding's evidence carries: the step the report prints (step_s, the
    median) and the denominator of its shares (mean_step_s, the mean step)."""
    return {"step_s": shown_step_s(ctx), "mean_step_s": step_s(ctx)}


def timeline_words(ctx: Context) -> str:
    return "the GPU timeline" if ctx.summary.get("timeline") == "gpu" else "host wall time"


def mode(ctx: Context) -> str:
    return ctx.profile.run.get("mode", "builtin")


def micro_steps(ctx: Context) -> int:
    return int(ctx.summary.get("micro_steps") or ctx.config.get("grad_accum") or 1)
