"""Rules about what the step computes in: a markedly faster precision measured on this device
(precision-slow), and a backward/forward time ratio far from the usual ~2x (backward-forward-ratio)."""

from __future__ import annotations

from gpuprof.analysis.findings import Context, Finding
from gpuprof.analysis.precision import compute_dtype_name
from gpuprof.analysis.rules.common import micro_steps, mode, on_cuda, step_s
from gpuprof.analysis.rules.experiments import loop_total, measured_on_loop, on_your_loop, slower_finding, verdict
from gpuprof.analysis.rules.intervals import says_slower, timed_saving, under_share
from gpuprof.analysis.script_knobs import find_knobs
from gpuprof.hardware import MARKED_FASTER as MARKED, TORCH_NAME, pick_faster
from gpuprof.sections import Precisions
from gpuprof.units import flops_rate, join_notes, pct, seconds, times

MIN_SHARE = 0.02  # ... and worth at least 2% of the step
BWD_FWD_HIGH, BWD_FWD_LOW = 4.0, 1.0  # backward is ~2x forward (two matmuls per forward one)


def measured_precisions(ctx: Context) -> Precisions:
    """measurements.probe.precisions (its `tflops` empty when no rate was measured)."""
    return ctx.sections.probe.precisions


def _fix(current: str, best: str, on_gpu: bool, script: bool, dtype_setting: bool = True) -> tuple[str, dict]:
    """(the one-line change, nanoGPT config overrides) to go from `current` to `best`.
    dtype_setting: the run has a `dtype` setting to change (the built-in loop, a nanoGPT-style
    script); an argparse script autocasts in its own code."""
    if best == "tf32":
        return ("torch.backends.cuda.matmul.allow_tf32 = True (or torch.set_float32_matmul_precision('high')); "
                "nanoGPT's train.py sets it at import"), {}
    if best == "fp32":
        where = "" if on_gpu else " on the CPU (autocast only where the device has fast bf16/fp16, e.g. device_type == 'cuda')"
        drop = f"drop the torch.autocast(..., dtype=torch.{TORCH_NAME[current]}) around the forward"
        if not dtype_setting:
            return drop + where, {}
        how = "dtype = 'float32'" + where
        if script:
            how += ", or " + drop
        return how, {"dtype": "float32"}
    if best == "fp16":
        return ("dtype = 'float16' (with torch.amp.GradScaler, as nanoGPT does for float16)"
                + ("; bf16 is only emulated on this GPU" if on_gpu and current == "bf16" else "")), {"dtype": "float16"}
    if on_gpu:
        return f"dtype = '{TORCH_NAME[best]}' (torch.autocast(dtype=torch.{TORCH_NAME[best]}) around the forward)", {"dtype": TORCH_NAME[best]}
    # nanoGPT's train.py uses nullcontext on a CPU: its dtype setting does nothing there
    return (f"wrap the forward in torch.autocast('cpu', dtype=torch.{TORCH_NAME[best]}) (nanoGPT's "
            f"train.py autocasts only on CUDA, so its dtype setting alone changes nothing on a CPU)"), {}


def precision_slow(ctx: Context) -> list[Finding]:
    """The step computes in a precision this device runs markedly slower than another one it
    offers, measured at the model's own matmul shapes after the run. Covers bf16 autocast on a
    CPU without native bf16, fp32 without TF32 on Ampere and later, bf16 emulated on a GPU below
    compute capability 8.0 (V100, T4: nanoGPT's default picks it there), fp16/bf16 without a fast
    path. Saving: forward+backward × (1 − the model's own forward+backward time in the faster
    dtype ÷ in the run's), both timed eagerly in paired rounds, with the ratio's interval
    (rules/intervals.py: within noise, no saving is claimed and the finding is information); in
    an older profile, the faster dtype's best of 2 against the run's own forward+backward; when
    the model could not be timed in it, the step's matmul time (FLOPs ÷ measured rate) ×
    (1 − current rate ÷ faster rate). Without an interval the confidence is low.
    On a CPU where no dtype multiplies markedly faster, a half-precision run's full-precision
    runner-up is timed too (hardware.runner_up): the finding then rests on that timing alone."""
    looped = _on_your_loop(ctx)
    if looped is not None:
        return looped
    prec = measured_precisions(ctx)
    current = compute_dtype_name(ctx.profile)  # as the probe names it: "tf32" included
    rates = prec.tflops
    if not current or current not in rates:
        return []
    r_now = rates[current]
    switch = prec.switch
    best = pick_faster(rates, current)
    by_rate = best is not None
    if not by_rate:
        # No dtype multiplies markedly faster; on a CPU the full precision was timed beside a
        # half-precision run (hardware.runner_up): only that timing can support a saving.
        if not (switch.chosen_by == "runner-up" and switch.to in rates and switch.ratio):
            return []
        best = switch.to
    faster = {d: r for d, r in rates.items() if d != current and r >= MARKED * r_now}
    fwd, bwd = ctx.seconds("forward"), ctx.seconds("backward")
    compute = fwd + bwd
    total = step_s(ctx)
    if not compute:
        return []
    flops = ctx.mfu.flops_per_step if ctx.mfu is not None else None
    matmul_s = None
    timed_model = switch.to == best and bool(switch.ratio)
    if timed_model:
        # Measured: the model itself, forward+backward in the faster dtype vs the run's.
        eager_run = (switch.eager_fwd_bwd_per_micro_s * micro_steps(ctx)
                     if switch.interval is not None and switch.eager_fwd_bwd_per_micro_s else None)
        timed = timed_saving(switch.interval, compute, switch.ratio, timed_s=eager_run)
        if switch.interval is not None:
            vs = (f"{seconds(switch.eager_fwd_bwd_per_micro_s)} in {current}, both eager, medians of "
                  f"{switch.rounds} paired rounds")
        elif switch.eager_fwd_bwd_per_micro_s:
            vs = f"{seconds(switch.eager_fwd_bwd_per_micro_s)} in {current} (both eager; the run was compiled)"
        else:
            vs = f"the run's {seconds(switch.run_fwd_bwd_per_micro_s)}"
        basis = (f"the model's forward+backward per micro-step timed after the run in {best}: "
                 f"{seconds(switch.fwd_bwd_per_micro_s)} vs {vs}")
    else:
        # The matmul time of the step, its FLOPs at the measured rate (capped by the compute
        # time), sped up by the rate ratio; the rest of the compute is taken to stay.
        matmul_s = min(compute, flops / (r_now * 1e12)) if flops else compute
        why = f"the model was not timed in {best}" + (f": {switch.not_measured}" if switch.not_measured else "")
        timed = timed_saving(None, matmul_s, r_now / rates[best], why_none=why)
        basis = ((f"the step's {flops:.3g} FLOPs at {flops_rate(r_now)} = {seconds(matmul_s)} of its "
                  f"{seconds(compute)} forward+backward" if flops else f"forward+backward ({seconds(compute)})")
                 + f", sped up by the measured matmul rate ratio ({flops_rate(r_now)} vs {flops_rate(rates[best])})")
    if not total or says_slower(timed, total) or (not timed.within_noise and under_share(timed, total, MIN_SHARE)):
        return []  # measured slower, or a saving under 2% of the step
    saving = timed.saving_s
    because = (f"at the model's matmul shapes this device ran {current} at {flops_rate(r_now)} and {best} at "
               f"{flops_rate(rates[best])} ({times(rates[best] / r_now)}); forward+backward take "
               f"{seconds(compute)} per step")
    if timed_model:
        because += (f"; the model itself, timed after the run, ran forward+backward in {best} in "
                    f"{times(switch.ratio)} the time")
        if not by_rate and not timed.within_noise and switch.ratio < 1:
            because += (f": the matmuls favour {current}, the whole step does not (the casts autocast "
                        f"inserts and the {current} norms and softmax cost more than the matmuls save)")
    elif matmul_s is not None:
        because += f", of which {seconds(matmul_s)} is matmul time at the measured rate"
    own = ctx.config.get("script_globals")
    # A script with a precision setting of its own (a --dtype flag, an environment variable it
    # reads): the change is that setting, worded in the script's terms by analysis/script_knobs.py.
    knob = find_knobs(ctx.config).get("dtype") if mode(ctx) == "script" else None
    if knob is not None and knob.kind != "global" and best != "tf32":
        fix, overrides = f"dtype = '{TORCH_NAME[best]}'", {"dtype": TORCH_NAME[best]}
    else:
        fix, overrides = _fix(current, best, on_cuda(ctx), mode(ctx) == "script",
                              dtype_setting=own is None or "dtype" in own)
    others = ", ".join(f"{d} {r / r_now:.1f}x" for d, r in sorted(faster.items(), key=lambda kv: -kv[1]) if d != best)
    note = f"estimate: {basis}"
    if others:
        note += f"; also faster here: {others}"
    if best in ("bf16", "fp16") and current in ("fp32", "tf32"):
        note += "; lower precision changes the numerics: check the loss curve"
    note = join_notes(timed.note, note)
    if by_rate:
        title = (f"{current} runs {rates[best] / r_now:.1f}x slower than {best} on this device "
                 f"(measured at the model's matmul shapes)")
    else:
        title = (f"the model's forward+backward in {best} took {switch.ratio:.2f}x its time in {current} "
                 f"on this device (timed after the run), though {current} matmuls run "
                 f"{r_now / rates[best]:.1f}x faster")
    return [Finding(
        id="precision-slow",
        title=title,
        saving_s=saving, kind="info" if timed.within_noise else "fix",
        evidence={"compute_dtype": current, "faster_dtype": best,
                  "rates_gflop_s": {d: r * 1e3 for d, r in rates.items()},
                  "ratio": rates[best] / r_now, "compute_s": compute, "matmul_s": matmul_s,
                  "model_time_ratio": switch.ratio if switch.to == best else None,
                  "chosen_by": "matmul rate" if by_rate else "runner-up",
                  "shapes": [f"{prec.m}x{s.k}x{s.n}" for s in prec.shapes], **timed.evidence},
        confidence=timed.confidence, fix=fix, note=note,
        config_overrides={} if timed.within_noise else overrides, settings=overrides, because=because,
        claims={} if saving is None else {"forward": saving * fwd / compute, "backward": saving * bwd / compute},
    )]


_TO = {"precision:bf16": "bf16", "precision:fp16": "fp16", "precision:fp32": "fp32", "precision:tf32": "tf32"}


def _on_your_loop(ctx: Context) -> list[Finding] | None:
    """precision-slow from the experiment steps (measure/experiments.py): the script's own step with
    the other precision switched on (autocast, or autocast off; TF32 on CUDA) against as it runs,
    in paired steps. None when no precision experiment was measured (the post-run estimate then)."""
    exp = measured_on_loop(ctx, "precision:")
    total = loop_total(ctx)
    if exp is None or not total:
        return None
    current = compute_dtype_name(ctx.profile) or "the run's precision"
    best = _TO.get(exp.id, exp.id)
    ts = on_your_loop(exp, total)
    what = exp.fix or f"{best} instead of {current}"
    v = verdict(ts, total, MIN_SHARE)
    if v == "slower":
        return [slower_finding("precision-slow", what, exp, ts, total)]
    own = ctx.config.get("script_globals")
    knob = find_knobs(ctx.config).get("dtype") if mode(ctx) == "script" else None
    if best == "tf32" or (knob is not None and knob.kind != "global"):
        fix, overrides = (_fix(current, best, on_cuda(ctx), True)[0], {}) if best == "tf32" else \
            (f"dtype = '{TORCH_NAME[best]}'", {"dtype": TORCH_NAME[best]})
    else:
        fix, overrides = _fix(current, best, on_cuda(ctx), mode(ctx) == "script",
                              dtype_setting=own is None or "dtype" in own)
    because = (f"measured on your loop: {exp.pairs} paired steps, the step took {seconds(exp.b_median_s)} in {best} "
               f"and {seconds(exp.a_median_s)} as it runs in {current} (medians; {times(exp.ratio)} the time)")
    note = ts.note
    if best in ("bf16", "fp16") and current in ("fp32", "tf32"):
        note = join_notes(note, "lower precision changes the numerics: check the loss curve")
    if v != "claim":
        return [Finding(id="precision-slow", kind="info", saving_s=None, confidence=ts.confidence,
                        title=f"{best} ran this step in {times(exp.ratio)} the time of {current} (measured on your loop)",
                        evidence={"compute_dtype": current, "faster_dtype": best, **ts.evidence}, fix=fix,
                        settings=overrides, because=because,
                        note=note if v == "noise" else join_notes(note, f"under {pct(MIN_SHARE, 0)} of the step"))]
    fwd, bwd = ctx.seconds("forward"), ctx.seconds("backward")
    compute = fwd + bwd
    return [Finding(
        id="precision-slow", saving_s=ts.saving_s, confidence=ts.confidence, fix=fix, config_overrides=overrides,
        settings=overrides, title=f"{current} runs this step {1 / exp.ratio:.2f}x slower than {best} (measured on your loop)",
        evidence={"compute_dtype": current, "faster_dtype": best, **ts.evidence}, because=because, note=note,
        claims={"forward": ts.saving_s * fwd / compute, "backward": ts.saving_s * bwd / compute} if compute else {},
    )]


def backward_forward_ratio(ctx: Context) -> list[Finding]:
    """Backward far from its usual ~2x the forward (≥ 4x or ≤ 1x): information with the likely
    causes; no saving of its own (precision-slow carries one when the precision is the cause)."""
    fwd, bwd = ctx.seconds("forward"), ctx.seconds("backward")
    if fwd <= 0 or bwd <= 0:
        return []
    ratio = bwd / fwd
    if BWD_FWD_LOW < ratio < BWD_FWD_HIGH:
        return []
    prec = measured_precisions(ctx)
    current = compute_dtype_name(ctx.profile)  # as the probe names it: "tf32" included
    if ratio >= BWD_FWD_HIGH:
        causes = ["activation checkpointing recomputing the forward inside the backward",
                  "backward hooks or gradient all-reduce work (DDP, custom hooks)",
                  "slow or emulated backward kernels (each forward matmul has two in the backward)"]
        rates = prec.tflops
        if current in rates and any(r >= MARKED * rates[current] for d, r in rates.items() if d != current):
            causes.insert(0, f"{current} matmuls are slow on this device (see precision-slow): the "
                             "backward's twice-as-many matmuls pay it twice")
        title = f"backward takes {ratio:.1f}x the forward (usually ~2x)"
    else:
        causes = ["frozen parameters (no weight gradients to compute)",
                  "work in the forward that the backward does not repeat (a loss or metrics under "
                  "no_grad, data augmentation, a host-device sync such as .item() inside the forward)"]
        title = f"backward takes only {ratio:.1f}x the forward (usually ~2x)"
    return [Finding(
        id="backward-forward-ratio", title=title, saving_s=None, kind="info",
        evidence={"forward_s": fwd, "backward_s": bwd, "ratio": ratio, "timeline": ctx.stats.timeline},
        confidence="medium", note="likely causes: " + "; ".join(causes),
        because=(f"backward {seconds(bwd)} and forward {seconds(fwd)} per step: the backward takes "
                 f"{ratio:.1f}x the forward, where about 2x is usual"),
    )]
