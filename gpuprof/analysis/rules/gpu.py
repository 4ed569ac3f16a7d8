"""Rules about how the GPU is driven: copies, dtype, optimizer, compile, launches, syncs."""

from __future__ import annotations

from gpuprof.analysis.findings import Context, Finding
from gpuprof.analysis.precision import compute_dtype_known, run_compute_dtype
from gpuprof.analysis.rules.compute import fused_optimizer_saving, medians, outcome, ratio_of
from gpuprof.analysis.rules.experiments import measured_on_loop, on_your_loop, slower_finding
from gpuprof.analysis.rules.common import micro_steps, mode, on_cuda, on_gpu_timeline, step_s
from gpuprof.analysis.rules.intervals import timed_saving
from gpuprof.dims import ADAMW_BYTES_PER_PARAM
from gpuprof.hardware import EXPECTED_MFU
from gpuprof.units import bytes_per_s, count, flops_rate, join_notes, nbytes, pct, seconds, times

OPTIMIZER_MIN_SHARE = 0.10


def _per_step(ctx: Context, key: str) -> float:
    """Mean per measured step of a count the runner kept in each step's extra (copies, bytes)."""
    steps = ctx.profile.steps
    return sum(float((s.extra or {}).get(key, 0)) for s in steps) / len(steps) if steps else 0.0


def h2d_pageable(ctx: Context) -> list[Finding]:
    """Host-to-device copies from pageable memory, or blocking copies.

    The saving is never the host time such a copy blocks: a pageable `x.to("cuda")` first waits
    for all queued GPU work (memcpy-and-sync), so that time is mostly the previous forward. It is
    the copied bytes per step × (1/pageable − 1/pinned bandwidth), both measured after the run
    (measurements.copies); without them, the copies' span on the GPU timeline, an upper bound."""
    if not on_cuda(ctx):
        return []
    total = step_s(ctx)
    pageable_bytes = _per_step(ctx, "h2d_pageable_bytes")
    pageable = _per_step(ctx, "h2d_pageable")
    blocking = _per_step(ctx, "h2d_blocking")
    script = ctx.sections.script
    if not any(s.extra for s in ctx.profile.steps):  # a profile from before per-step counts
        pageable = script.count("h2d_pageable") if script.count("h2d_copies") else (
            0 if ctx.config.get("pin_memory", True) else 1)
        blocking = script.count("h2d_blocking")
    if not (pageable or blocking) or not total:
        return []
    h2d = ctx.stats.phases.get("h2d")
    h2d_gpu = h2d.seconds if h2d is not None and on_gpu_timeline(ctx) else None
    bw = ctx.sections.copies
    ev = {"pageable_copies_per_step": pageable, "blocking_copies_per_step": blocking,
          "pageable_bytes_per_step": pageable_bytes, "h2d_host_s": h2d.host_seconds if h2d else 0.0}
    if bw.pageable_bytes_s and bw.pinned_bytes_s and pageable_bytes:
        saving = pageable_bytes * max(1 / bw.pageable_bytes_s - 1 / bw.pinned_bytes_s, 0.0)
        ev.update(pageable_gb_s=bw.pageable_bytes_s / 1e9, pinned_gb_s=bw.pinned_bytes_s / 1e9)
        note = ("estimate: bytes per step × (1/pageable − 1/pinned bandwidth), both measured after the "
                "run; the host also stops blocking on the GPU queue at every copy, which is not counted")
    elif h2d_gpu:
        saving = h2d_gpu if pageable_bytes else None
        ev["h2d_gpu_s"] = h2d_gpu
        note = ("upper bound: the copies' whole span on the GPU timeline (pageable and pinned "
                "bandwidth not measured)") if saving is not None else "not estimated: no pageable bytes"
    else:
        saving = None
        note = "not estimated: copy bandwidths and the GPU timeline were not measured"
    share = saving / total if saving is not None else None
    if share is not None and share < 0.01:
        return []
    if share is None and ev["h2d_host_s"] / total < 0.01:
        return []
    what = (f"{pageable:.0f} pageable copies per step ({nbytes(pageable_bytes)})" if pageable
            else f"{blocking:.0f} blocking copies per step")
    because = (f"{pageable:.0f} copies per step from pageable memory moved {nbytes(pageable_bytes)}" if pageable
               else f"{blocking:.0f} copies per step blocked the host until the GPU had them")
    if "pageable_gb_s" in ev:
        because += (f"; measured after the run, host-to-device copies ran at {bytes_per_s(bw.pageable_bytes_s)} "
                    f"from pageable memory and {bytes_per_s(bw.pinned_bytes_s)} from pinned memory, so the "
                    f"same bytes move {seconds(saving)} faster pinned")
    elif "h2d_gpu_s" in ev:
        because += f"; the copies span {seconds(h2d_gpu)} per step on the GPU timeline"
    else:
        because += f"; the copies take {seconds(ev['h2d_host_s'])} per step on the host"
    return [Finding(
        id="h2d-pageable",
        title=f"host-to-device copies from pageable memory: {what}",
        saving_s=saving, evidence=ev, confidence="medium", because=because,
        fix="x.pin_memory().to(device, non_blocking=True) (DataLoader: pin_memory=True)",
        note=note,
        claims={"h2d": saving} if saving else {},
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
    because = (f"optimizer: {seconds(opt)} per step, {pct(opt / total)} of the step; AdamW is "
               + ("fused" if fused else "not fused" if fused is False else "not known to be fused"))
    params = ctx.config.get("param_count")
    if ctx.gpu is not None and params:
        floor = ADAMW_BYTES_PER_PARAM * params / (ctx.gpu.hbm_tb_s * 1e12)
        ev["optimizer_floor_s"] = floor
        because += (f"; moving AdamW's {ADAMW_BYTES_PER_PARAM} bytes per parameter for {count(params)} parameters "
                    f"at {ctx.gpu.name}'s {ctx.gpu.hbm_tb_s:g} TB/s takes at least {seconds(floor)}")
        saving = max(opt - floor, 0.0)
        note = (f"saving = optimizer time - the memory-bandwidth floor of AdamW "
                f"({ADAMW_BYTES_PER_PARAM} B/param at {ctx.gpu.hbm_tb_s} TB/s): an upper bound")
    measured = fused_optimizer_saving(ctx)
    confidence, within = "medium", False
    if measured is not None:
        # Measured on a copy of the parameters: replaces the bandwidth floor's upper bound, even
        # when it says fused=True is not faster here, or its interval holds no change.
        ts, words, more = measured
        ev.update(more)
        because += f"; {words}"
        verdict = outcome(ts, total, share=0.0)
        within = verdict == "noise"
        saving, confidence = (ts.saving_s, ts.confidence) if verdict == "claim" else (None, ts.confidence)
        on_loop = more.get("measured_on") == "your loop"
        note = {"claim": ts.note if on_loop else join_notes(ts.note, "estimate: one step of a copy of the parameters "
                                                                     "timed as configured and with fused=True after the run"),
                "noise": ts.note,
                "slower": join_notes("measured: fused=True was not faster here, so no saving is claimed", ts.note),
                }[verdict]
    if fused:
        fix = ("the optimizer is already fused: its time is the step's gradient clipping and "
               "parameter traffic; fewer optimizer steps (a larger step in tokens) amortise it")
    elif measured is not None and saving is None and not within:
        fix = ("fused=True measured no faster here: the step's time is parameter traffic; fewer optimizer "
               "steps (a larger step in tokens) amortise it")
    else:
        fix = "torch.optim.AdamW(..., fused=True) (one kernel for all parameters)"
    return [Finding(
        id="optimizer-slow", title=f"the optimizer step takes {opt / total:.0%} of the step",
        saving_s=saving, kind="info" if within else "fix",
        evidence=ev, confidence=confidence, fix=fix, note=note, because=because,
        claims={"optimizer": saving} if saving else {},
    )]


def no_tensor_cores(ctx: Context) -> list[Finding]:
    """fp32 math without TF32 or autocast on a GPU with tensor cores, judged from the datasheet
    when the precisions were not measured (precision-slow speaks from measurements otherwise)."""
    if not on_cuda(ctx):
        return []
    if ctx.sections.probe.precisions.tflops:
        return []
    # what the run was observed to compute in (an older profile: what its config claims)
    dtype, tf32 = run_compute_dtype(ctx.profile)
    if not compute_dtype_known(ctx.profile) or dtype != "fp32" or tf32:
        return []
    spec = ctx.gpu
    if spec is None or not getattr(spec, "tensor_cores", True) or not spec.bf16:
        return []
    compute = ctx.seconds("forward") + ctx.seconds("backward")
    flops = ctx.mfu.flops_per_step if ctx.mfu is not None else None
    ev = {"dtype": dtype, "tf32": False, "compute_s": compute, "gpu": spec.name}
    saving = None
    note = "cannot estimate without the FLOPs per step"
    because = f"forward+backward: {seconds(compute)} per step in fp32 without TF32 or autocast on {spec.name}"
    if flops:
        low, high = EXPECTED_MFU
        mid = (low + high) / 2  # the middle of the band a well-tuned step reaches
        at_half = flops / (mid * spec.bf16 * 1e12)  # model FLOPs are forward + backward
        ev[f"bf16_compute_at_{mid * 100:.0f}pct_mfu_s"] = at_half
        because += (f"; its {flops:.3g} FLOPs per step at {mid:.0%} of the bf16 peak ({flops_rate(spec.bf16)}) "
                    f"take {seconds(at_half)}")
        saving = max(compute - at_half, 0.0)
        note = (f"estimate: forward+backward at {mid:.0%} MFU of the bf16 peak "
                f"(typical {low * 100:.0f}-{high:.0%})")
    return [Finding(
        id="no-tensor-cores",
        title="fp32 math without TF32 or autocast: the tensor cores sit unused",
        saving_s=saving,
        evidence=ev, confidence="medium", note=note, because=because,
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
    shown = total
    if compiled and warm and shown:
        # Against the step the report prints (the typical step), so "Nx a measured step" and the
        # step figure on the page agree.
        first = warm[0].wall_s
        n_steps = len(ctx.profile.steps) + len(warm)
        extra = sum(s.wall_s for s in warm) - len(warm) * shown
        if first > 5 * shown:
            out.append(Finding(
                id="compile-warmup",
                title=(f"compile warm-up: the first step took {seconds(first)}, "
                       f"{first / shown:.0f}x a measured step"),
                saving_s=None,
                evidence={"first_step_s": first, "step_s": shown,
                          "warmup_extra_s": extra, "run_steps": n_steps},
                confidence="high", kind="info",
                note=(f"a one-time cost: {seconds(extra)} over this run, about "
                      f"{extra / shown:.0f} steps' worth; it matters only for short runs"),
                because=(f"the first warm-up step took {seconds(first)} where a measured step takes "
                         f"{seconds(shown)}; the {len(warm)} warm-up step{'s' if len(warm) > 1 else ''} took "
                         f"{seconds(extra)} more than as many measured steps, once in a run of {n_steps} steps"),
            ))
    # measured (on the loop or a copy) only for an eager model: also where the script has no
    # `compile` setting of its own (an argparse script: its config does not say)
    measured = _compile_measured(ctx) if not compiled else None
    if measured is not None:
        out.extend(measured)
    elif on_cuda(ctx) and compiled is False:
        fb = ctx.share("forward") + ctx.share("backward")
        why = ctx.sections.compile.not_measured
        out.append(Finding(
            id="compile-missing",
            title="the model runs eagerly (compile=False)",
            saving_s=None,
            evidence={"compile": False, "compute_share": fb,
                      "ceiling_s": ctx.seconds("forward") + ctx.seconds("backward"),
                      "ceiling_what": "the step's forward and backward: what compiling could speed up at most"},
            confidence="low",
            because=(f"forward and backward are {pct(fb)} of the step and run eagerly; what compiling "
                     "saves was not measured in this run"),
            note=(f"not measured here ({why}): " if why else "not measured here: ")
            + ("nanoGPT reports 250 -> 135 ms per iteration on an A100 for GPT-2 124M; "
               "`gpuprof diagnose --measure-compile` times this model compiled after the run"),
            fix="compile = True (torch.compile(model)); exclude the first steps from timing",
            config_overrides={"compile": True},
        ))
    return out


def _compile_on_loop(ctx: Context, exp) -> list[Finding]:
    """compile-missing from experiment steps: the model's forward compiled in the script's own loop
    (measure/switches.CompileSwitch), its first steps (the compile) kept out of the pairs and said."""
    total = step_s(ctx)
    ts = on_your_loop(exp, total)
    fwd, bwd = ctx.seconds("forward"), ctx.seconds("backward")
    first = exp.warmup_s[0] if exp.warmup_s else None
    cost = first - exp.a_median_s if first and exp.a_median_s and first > exp.a_median_s else None
    cost_words = (f"the first compiled step took {seconds(first)}: compiling costs about {seconds(cost)} once, at "
                  "the start of every run" if cost else "")
    because = (f"measured on your loop: {exp.pairs} paired steps, the step took {seconds(exp.b_median_s)} compiled and "
               f"{seconds(exp.a_median_s)} eager (medians; {times(exp.ratio)} the time)")
    ev = {"compile": False, "compile_s": cost, **ts.evidence}
    fix = "compile = True (torch.compile(model)); exclude the first steps from timing"
    overrides = {"compile": True} if mode(ctx) == "builtin" else {}
    verdict = outcome(ts, total, COMPILE_CLAIM_SHARE)
    if verdict == "slower":
        return [slower_finding("compile-missing", "torch.compile(model)", exp, ts, total)]
    if verdict != "claim":
        return [Finding(id="compile-missing", title="the model runs eagerly (compile=False)", saving_s=None,
                        evidence=ev, confidence=ts.confidence, kind="info", fix=fix, settings={"compile": True},
                        config_overrides=overrides if verdict == "small" else {}, because=because,
                        note=join_notes(ts.note, cost_words))]
    return [Finding(
        id="compile-missing", title=f"the model runs eagerly: compiled, your step ran in {times(exp.ratio)} the time",
        saving_s=ts.saving_s, evidence=ev, confidence=ts.confidence, fix=fix, config_overrides=overrides,
        settings={"compile": True}, because=because, note=join_notes(ts.note, cost_words),
        claims={"forward": min(ts.saving_s * fwd / (fwd + bwd), fwd),
                "backward": min(ts.saving_s * bwd / (fwd + bwd), bwd)} if fwd + bwd else {},
    )]


COMPILE_CLAIM_SHARE = 0.05  # as the compute fixes (rules/compute.py): under 5% of the step, no claim


def _compile_measured(ctx: Context) -> list[Finding] | None:
    """compile-missing from `--measure-compile`'s timing (measurements.compile, measure/compiled.py):
    forward+backward × (1 − compiled ÷ eager), the ratio of paired rounds applied to the run's own
    forward+backward and claimed as its interval supports (rules/intervals.timed_saving: within
    noise, information without a saving or a config change; a profile before paired rounds, the
    best of each way at confidence low); the compile time it cost is said. None when it was not
    measured."""
    exp = measured_on_loop(ctx, "compile")
    if exp is not None:
        return _compile_on_loop(ctx, exp)
    c = ctx.sections.compile
    if not c.eager_s or not c.compiled_s:
        return None
    eager, comp, cost = c.eager_s, c.compiled_s, c.compile_s
    fwd, bwd = ctx.seconds("forward"), ctx.seconds("backward")
    total = step_s(ctx)
    ratio = ratio_of(c, comp / eager)
    ts = timed_saving(c.interval, fwd + bwd, ratio, timed_s=eager * micro_steps(ctx) if c.interval else None)
    ev = {"compile": False, "eager_fwd_bwd_s": eager, "compiled_fwd_bwd_s": comp, "compile_s": cost,
          "ratio": ratio, "measured_saving_s": ts.estimate, **ts.evidence}
    because = (f"the model's forward+backward at the run's micro-batch, timed after the run: {seconds(eager)} eager, "
               f"{seconds(comp)} compiled ({times(ratio)} the time{medians(c)})")
    if ts.estimate > 0:
        because += f"; × the run's forward+backward ({seconds(fwd + bwd)} per step) = {seconds(ts.estimate)} per step"
    cost_words = f"compiling took {seconds(cost)} once (a cost at the start of every run)" if cost else ""
    fix = "compile = True (torch.compile(model)); exclude the first steps from timing"
    overrides = {"compile": True} if mode(ctx) == "builtin" else {}
    verdict = outcome(ts, total, COMPILE_CLAIM_SHARE)
    if verdict != "claim":
        note = {"noise": ts.note,
                "slower": join_notes("measured: compiled was not faster here", ts.note),
                "small": join_notes(f"measured {seconds(ts.estimate)} per step, {pct(ts.estimate / total)} of the "
                                    f"step: under {COMPILE_CLAIM_SHARE:.0%}, so no saving is claimed on this device"
                                    if total else "", ts.note)}[verdict]
        return [Finding(id="compile-missing", title="the model runs eagerly (compile=False)", saving_s=None,
                        evidence=ev, confidence=ts.confidence, kind="info",
                        fix="" if verdict == "slower" else fix,
                        config_overrides=overrides if verdict == "small" else {},
                        settings={} if verdict == "slower" else {"compile": True}, because=because,
                        note=join_notes(note, cost_words))]
    saving = ts.saving_s
    return [Finding(
        id="compile-missing", title=f"the model runs eagerly: compiled, forward+backward ran in {times(ratio)} the time",
        saving_s=saving, evidence=ev, confidence=ts.confidence, fix=fix,
        config_overrides=overrides, because=because,
        note=join_notes(ts.note, "estimate: measured with --measure-compile after the run", cost_words),
        claims={"forward": saving * fwd / (fwd + bwd), "backward": saving * bwd / (fwd + bwd)} if fwd + bwd else {},
    )]


def launch_bound(ctx: Context) -> list[Finding]:
    """The host needs as long to launch forward/backward as the GPU needs to run them."""
    if not on_gpu_timeline(ctx):
        return []
    ph = ctx.stats.phases
    host = sum(ph[p].host_seconds for p in ("forward", "backward") if p in ph)
    gpu = sum(ph[p].seconds for p in ("forward", "backward") if p in ph)
    if not gpu or host < 0.9 * gpu:
        return []
    n = micro_steps(ctx)
    return [Finding(
        id="launch-bound",
        title=(f"launch-bound: the host takes {host / gpu:.2g}x the GPU's forward+backward time to launch it"
               if host >= gpu else
               f"launch-bound: the host takes {host / gpu:.0%} of the GPU's forward+backward time to launch it"),
        saving_s=None,
        evidence={"host_fwd_bwd_s": host, "gpu_fwd_bwd_s": gpu, "micro_steps": n,
                  "host_per_micro_s": host / n},
        confidence="medium",
        because=(f"the host took {seconds(host)} per step to launch forward+backward and the GPU "
                 f"{seconds(gpu)} to run them ({times(host / gpu)}); {seconds(host / n)} of host time "
                 f"per micro-step over {n} micro-steps"),
        note="the GPU waits for Python and kernel launches; how much a fix saves needs a kernel trace",
        fix=("torch.compile (mode='reduce-overhead' for CUDA graphs), or fewer, larger micro-batches" if n <= 1 else
             "fewer, larger micro-batches, or torch.compile (its CUDA graphs, mode='reduce-overhead', need one "
             "micro-step per optimizer step: with gradient accumulation they fail or corrupt the gradients, "
             "pytorch/pytorch#169545)"),
        config_overrides={"compile": True} if not ctx.config.get("compile") else {},
    )]


def sync_in_step(ctx: Context) -> list[Finding]:
    """Host-device synchronizations inside every micro-step."""
    syncs = ctx.sections.syncs
    per_step = syncs.per_step or 0
    n = micro_steps(ctx)
    if not per_step or per_step < n:
        return []
    other = ctx.stats.phases.get("other")
    other_idle = other.idle_exposed_s if other is not None else None
    ev = {"syncs_per_step": per_step, "micro_steps": n, "per_phase": syncs.per_phase}
    saving = other_idle if other_idle else None
    because = f"{per_step:.0f} host-device synchronizations per step over {n} micro-steps"
    where = {k: v for k, v in (syncs.per_phase or {}).items()  # totals over the measured steps
             if k != "h2d" and isinstance(v, (int, float)) and v}  # per_step leaves the copies' own out
    if where:
        steps = max(int(syncs.measured_steps or 1), 1)
        because += " (" + ", ".join(f"{k} {v / steps:.3g}" for k, v in where.items()) + ")"
    if saving:
        ev["gpu_idle_in_other_s"] = saving
        because += f"; the GPU sat idle {seconds(saving)} per step outside the measured phases"
    return [Finding(
        id="sync-in-step",
        title=f"{per_step:.0f} host-device synchronizations per step ({per_step / n:.1f} per micro-step)",
        saving_s=saving,
        evidence=ev, confidence="medium", because=because,
        note="each sync drains the GPU queue; the saving is the GPU idle time outside the phases (an upper bound)",
        fix="drop .item()/print(tensor)/.cpu() inside the micro-step loop; log every log_interval steps",
        claims={"other": saving} if saving else {},
    )]
