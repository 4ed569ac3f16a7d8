"""Rules about how the GPU is driven: copies, dtype, optimizer, compile, launches, syncs."""

from __future__ import annotations

from gpuprof.analysis.engine import Context, Finding
from gpuprof.analysis.rules.common import micro_steps, mode, on_cuda, step_s

OPTIMIZER_MIN_SHARE = 0.10
# Bytes AdamW moves per parameter in fp32: reads param, grad, exp_avg, exp_avg_sq (16 B) and
# writes param, exp_avg, exp_avg_sq (12 B).
ADAMW_BYTES_PER_PARAM = 28


def h2d_pageable(ctx: Context) -> list[Finding]:
    """Host-to-device copies from pageable memory, or blocking copies."""
    if not on_cuda(ctx):
        return []
    total = step_s(ctx)
    h2d_host = ctx.summary.get("phases", {}).get("h2d", {}).get("host_seconds", 0.0)
    counts = ((ctx.profile.measurements.get("script") or {}).get("hooks") or {}).get("counts") or {}
    copies = {"count": counts["h2d_copies"], "pageable": counts.get("h2d_pageable", 0),
              "blocking": counts.get("h2d_blocking", 0)} if counts.get("h2d_copies") else {}
    pageable = copies.get("pageable", 0) if copies else (0 if ctx.config.get("pin_memory", True) else 1)
    blocking = copies.get("blocking", 0)
    if not (pageable or blocking) or not total or h2d_host / total < 0.01:
        return []
    ev = {"h2d_host_s": h2d_host, "share": h2d_host / total}
    if copies:
        ev.update({"pageable_copies": pageable, "blocking_copies": blocking, "copies": copies.get("count")})
    else:
        ev["pin_memory"] = ctx.config.get("pin_memory")
    return [Finding(
        id="h2d-pageable",
        title=f"host-to-device copies block the host {h2d_host / total:.0%} of the step (pageable memory)",
        saving_s=h2d_host, saving_share=h2d_host / total, evidence=ev, confidence="medium",
        fix="x.pin_memory().to(device, non_blocking=True) (DataLoader: pin_memory=True)",
        note="a pinned, non_blocking copy returns at once and overlaps compute; the saving is the host time spent copying",
        claims={"h2d": h2d_host},
        config_overrides={"pin_memory": True} if mode(ctx) == "builtin" else {},
    )]


def optimizer_slow(ctx: Context) -> list[Finding]:
    """The optimizer step takes a large share; fused/foreach AdamW is not in use on CUDA."""
    total = step_s(ctx)
    opt = ctx.seconds("optimizer")
    if not on_cuda(ctx) or not total or opt / total < OPTIMIZER_MIN_SHARE:
        return []
    fused = ctx.config.get("fused_adamw")
    ev = {"optimizer_s": opt, "share": opt / total, "fused_adamw": fused}
    saving = None
    note = ""
    params = ctx.config.get("param_count")
    if ctx.gpu is not None and params:
        floor = ADAMW_BYTES_PER_PARAM * params / (ctx.gpu.hbm_tb_s * 1e12)
        ev["optimizer_floor_s"] = floor
        saving = max(opt - floor, 0.0)
        note = (f"saving = optimizer time - the memory-bandwidth floor of AdamW "
                f"({ADAMW_BYTES_PER_PARAM} B/param at {ctx.gpu.hbm_tb_s} TB/s): an upper bound")
    if fused:
        fix = ("the optimizer is already fused: its time is the step's gradient clipping and "
               "parameter traffic; fewer optimizer steps (a larger step in tokens) amortise it")
    else:
        fix = "torch.optim.AdamW(..., fused=True) (one kernel for all parameters)"
    return [Finding(
        id="optimizer-slow", title=f"the optimizer step takes {opt / total:.0%} of the step",
        saving_s=saving, saving_share=(saving / total if saving is not None else None),
        evidence=ev, confidence="medium", fix=fix, note=note,
        claims={"optimizer": saving} if saving else {},
    )]


def no_tensor_cores(ctx: Context) -> list[Finding]:
    """fp32 math without TF32 or autocast on a GPU with tensor cores."""
    if not on_cuda(ctx):
        return []
    dtype = (ctx.config.get("dtype") or "").lower()
    if dtype not in ("fp32", "float32") or ctx.config.get("tf32_matmul") or ctx.config.get("autocast_dtype"):
        return []
    spec = ctx.gpu
    if spec is None or not getattr(spec, "tensor_cores", True) or not spec.bf16:
        return []
    compute = ctx.seconds("forward") + ctx.seconds("backward")
    total = step_s(ctx)
    flops = (ctx.mfu or {}).get("flops_per_step")
    ev = {"dtype": dtype, "tf32": False, "compute_s": compute, "gpu": spec.name}
    saving = None
    note = "cannot estimate without the FLOPs per step"
    if flops:
        at_half = flops / (0.5 * spec.bf16 * 1e12)  # model FLOPs are forward + backward
        ev["bf16_compute_at_50pct_mfu_s"] = at_half
        saving = max(compute - at_half, 0.0)
        note = "estimate: forward+backward at 50% MFU of the bf16 peak (typical 40-60%)"
    return [Finding(
        id="no-tensor-cores",
        title="fp32 math without TF32 or autocast: the tensor cores sit unused",
        saving_s=saving, saving_share=(saving / total if saving is not None and total else None),
        evidence=ev, confidence="medium", note=note,
        fix="dtype = 'bfloat16' (autocast), or torch.backends.cuda.matmul.allow_tf32 = True",
        config_overrides={"dtype": "bfloat16"},
        claims={"forward": saving * 0.33, "backward": saving * 0.67} if saving else {},
    )]


def compile_findings(ctx: Context) -> list[Finding]:
    """compile-missing (eager on CUDA) and compile-warmup (compile time dominating a short run)."""
    out = []
    compiled = ctx.config.get("compile")
    total = step_s(ctx)
    warm = ctx.profile.warmup_steps
    if compiled and warm and total:
        first = warm[0].wall_s
        n_steps = len(ctx.profile.steps) + len(warm)
        extra = sum(s.wall_s for s in warm) - len(warm) * total
        if first > 5 * total:
            out.append(Finding(
                id="compile-warmup",
                title=(f"compile warm-up: the first step took {first:.1f} s, "
                       f"{first / total:.0f}x a measured step"),
                saving_s=None, saving_share=None,
                evidence={"first_step_s": first, "step_s": total, "warmup_extra_s": extra,
                          "run_steps": n_steps},
                confidence="high", kind="info",
                note=(f"a one-time cost: {extra:.1f} s over this run, about "
                      f"{extra / total:.0f} steps' worth; it matters only for short runs"),
            ))
    if on_cuda(ctx) and compiled is False:
        out.append(Finding(
            id="compile-missing",
            title="the model runs eagerly (compile=False)",
            saving_s=None, saving_share=None,
            evidence={"compile": False, "compute_share": ctx.share("forward") + ctx.share("backward")},
            confidence="low",
            note=("not measured here: nanoGPT reports 250 -> 135 ms per iteration on an A100 for "
                  "GPT-2 124M; run `gpuprof diagnose --compile` to measure it on this setup"),
            fix="compile = True (torch.compile(model)); exclude the first steps from timing",
            config_overrides={"compile": True},
        ))
    return out


def launch_bound(ctx: Context) -> list[Finding]:
    """The host needs as long to launch forward/backward as the GPU needs to run them."""
    if ctx.summary.get("timeline") != "gpu":
        return []
    ph = ctx.summary.get("phases", {})
    host = sum(ph.get(p, {}).get("host_seconds", 0.0) for p in ("forward", "backward"))
    gpu = sum(ph.get(p, {}).get("gpu_seconds", 0.0) for p in ("forward", "backward"))
    if not gpu or host < 0.9 * gpu:
        return []
    n = micro_steps(ctx)
    return [Finding(
        id="launch-bound",
        title=f"launch-bound: the host spends {host / gpu:.0%} of the GPU's forward+backward time launching it",
        saving_s=None, saving_share=None,
        evidence={"host_fwd_bwd_s": host, "gpu_fwd_bwd_s": gpu, "micro_steps": n,
                  "host_per_micro_s": host / n},
        confidence="medium",
        note="the GPU waits for Python and kernel launches; how much a fix saves needs a kernel trace",
        fix="torch.compile (mode='reduce-overhead' for CUDA graphs), or fewer, larger micro-batches",
        config_overrides={"compile": True} if not ctx.config.get("compile") else {},
    )]


def sync_in_step(ctx: Context) -> list[Finding]:
    """Host-device synchronizations inside every micro-step."""
    syncs = ctx.profile.measurements.get("syncs") or {}
    per_step = syncs.get("per_step", 0)
    n = micro_steps(ctx)
    if not per_step or per_step < n:
        return []
    total = step_s(ctx)
    other_idle = ctx.summary.get("phases", {}).get("other", {}).get("idle_exposed_s")
    ev = {"syncs_per_step": per_step, "micro_steps": n, "per_phase": syncs.get("per_phase")}
    saving = other_idle if other_idle else None
    if saving:
        ev["gpu_idle_in_other_s"] = saving
    return [Finding(
        id="sync-in-step",
        title=f"{per_step:.0f} host-device synchronizations per step ({per_step / n:.1f} per micro-step)",
        saving_s=saving, saving_share=(saving / total if saving and total else None),
        evidence=ev, confidence="medium",
        note="each sync drains the GPU queue; the saving is the GPU idle time outside the phases (an upper bound)",
        fix="drop .item()/print(tensor)/.cpu() inside the micro-step loop; log every log_interval steps",
        claims={"other": saving} if saving else {},
    )]
