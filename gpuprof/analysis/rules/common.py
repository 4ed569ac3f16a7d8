"""Small helpers the rules share: exposure of a phase, device tests, config access. Every figure
comes from ctx.stats (gpuprof.stats): the typical step and its phases."""

from __future__ import annotations

from gpuprof.analysis.findings import Context
from gpuprof.measure.cuda import is_cuda
from gpuprof.stats import HOST_ONLY_PHASES

COMPUTE_PHASES = ("forward", "backward", "optimizer")


def on_cuda(ctx: Context) -> bool:
    return is_cuda(ctx.config.get("device") or ctx.profile.environment.get("device") or "")


def on_gpu_timeline(ctx: Context) -> bool:
    return ctx.stats.timeline == "gpu"


def exposed_s(ctx: Context, phase: str) -> float:
    """Seconds per step that `phase` keeps the device from computing.

    On the GPU timeline a host-only phase's span is the idle time it exposed; on a CPU run
    the host is the device, so the phase's whole wall time is exposed."""
    entry = ctx.stats.phases.get(phase)
    if entry is None:
        return 0.0
    if on_gpu_timeline(ctx) and phase in HOST_ONLY_PHASES and entry.idle_exposed_s is not None:
        return entry.idle_exposed_s
    return entry.seconds


def step_s(ctx: Context) -> float:
    """The step every saving is a share of, and the one the report prints: the typical step
    (gpuprof.stats), which its phases add up to."""
    return ctx.stats.step_s


def step_evidence(ctx: Context) -> dict:
    """The step figure a finding's evidence carries: the typical step the report prints."""
    return {"step_s": ctx.stats.step_s}


def timeline_words(ctx: Context) -> str:
    return "the GPU timeline" if on_gpu_timeline(ctx) else "host wall time"


def mode(ctx: Context) -> str:
    return ctx.profile.run.get("mode", "builtin")


def micro_steps(ctx: Context) -> int:
    return int(ctx.stats.micro_steps or ctx.config.get("grad_accum") or 1)
