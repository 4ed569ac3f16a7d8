"""Training logs: what a log alone implies (the line parser, for nanoGPT, build-nanogpt, llm.c,
HF Trainer, nanochat, modded-nanogpt, torchtitan and litgpt lines, is gpuprof.steplog)."""

from __future__ import annotations

import math

from gpuprof.analysis.mfu_results import LogAnalysis, LogVerdict, SizeRow
from gpuprof.errors import GpuprofError
from gpuprof.hardware import BEST_ACHIEVABLE_MFU, EXPECTED_MFU
from gpuprof.stats import median, quantile
from gpuprof.steplog import (FIRST_STEP, NO_STEP_TIME, bad_numbers, main_format, mfu_claim, parse_lines,
                             zero_mfu_note)


# ------------------------------------------------------------------------------ log analysis
# What a nanoGPT log alone says: nanoGPT prints mfu = FLOPs per step / (dt × 312 TFLOP/s), so
# FLOPs per step = mfu × 312e12 × dt, whatever GPU it ran on. From that: the model size it
# implies, the true MFU on the real GPU's peak, and the floor no step can beat there.

# "slow" below this MFU: its own threshold, a judgement rather than a measurement -- a step over
# 1.6x slower than EXPECTED_MFU's low end loses its time to something profiling finds (data
# loading, syncs, small micro-batches), not to tuning the matmuls.
SLOW_MFU = 0.25
_LOW, _BEST = EXPECTED_MFU[0], BEST_ACHIEVABLE_MFU

STEP_VERDICTS = (  # (upper bound of step time / floor, id, text); floor = FLOPs ÷ peak
    (1.0, "impossible", "faster than the FLOP floor: the timing is not synchronized, or the GPU, "
                        "dtype or config is not what was given"),
    (1 / _BEST, "suspicious", f"above the ~{_BEST:.0%} MFU the best dense matmuls reach: check the GPU and "
                              "the tokens per step"),
    (1 / _LOW, "healthy", f"{_LOW * 100:.0f}-{_BEST:.0%} MFU: compute-bound and plausible for this model; a faster "
                          "step needs fewer FLOPs (smaller model or fewer tokens), not I/O fixes"),
    (1 / SLOW_MFU, "fair", f"{SLOW_MFU * 100:.0f}-{_LOW:.0%} MFU: some headroom; profile the step to see where it goes"),
    (float("inf"), "slow", f"below {SLOW_MFU:.0%} MFU: the step is far from what the GPU can do; profile it "
                           "(data loading, syncs, small micro-batches) with `gpuprof diagnose`"),
)


def _config_int(config: dict, *keys, default=None):
    for k in keys:
        if config.get(k) is not None:
            try:
                value = float(config[k])
            except (TypeError, ValueError):
                raise GpuprofError(f"config value {k}={config[k]!r} is not a number") from None
            if not (math.isfinite(value) and value > 0 and value == int(value)):
                raise GpuprofError(f"{k} must be a positive whole number, got {config[k]!r}")
            return int(value)
    return default


def _tokens_per_gpu(config: dict) -> tuple[int | None, int]:
    """Tokens per optimizer step per GPU (what nanoGPT's estimate_mfu counts), and world size.

    gradient_accumulation_steps is the config value, before nanoGPT divides it by world_size."""
    world = _config_int(config, "world_size", "ddp_world_size", default=1) or 1
    if config.get("tokens_per_step") is not None:
        return _config_int(config, "tokens_per_step") // world, world
    b = _config_int(config, "batch_size")
    t = _config_int(config, "block_size")
    ga = _config_int(config, "gradient_accumulation_steps", "grad_accum", default=1)
    if b and t:
        return b * t * max(1, ga // world), world
    return None, world


def analyze_log(path, *, gpu: str | None = None, peak_tflops: float | None = None,
                config: dict | None = None) -> LogAnalysis:
    """Analyse a training log without running anything: nanoGPT `iter` lines, or the step times
    of build-nanogpt, llm.c, HF Trainer, nanochat, modded-nanogpt or litgpt logs (gpuprof.steplog;
    torchtitan prints no step time). Only nanoGPT's printed MFU is inverted into FLOPs (its A100
    constant is known); the others divide by their own peak tables, and need the config for FLOPs.

    config: nanoGPT config keys (batch_size, block_size, gradient_accumulation_steps, n_layer,
    n_head, n_embd, vocab_size, dtype, world_size or tokens_per_step). Raises GpuprofError when
    the file cannot be read or holds no iteration lines. The result is typed
    (analysis/mfu_results.py); its to_dict() is `gpuprof analyze --log --json`."""
    from pathlib import Path

    from gpuprof.analysis.mfu import NANOGPT_A100_TFLOPS, explain_misreport
    from gpuprof.hardware import find_gpu, peak_for
    from gpuprof.dims import GPT2_SIZES, GPTConfig, gpt_flops_per_token, gpt_param_count, implied_params

    config = dict(config or {})
    p = Path(path)
    try:
        text = p.read_text(errors="replace")
    except FileNotFoundError:
        raise GpuprofError(f"{p}: no such file") from None
    except (IsADirectoryError, PermissionError) as exc:
        raise GpuprofError(f"{p}: cannot read ({exc.__class__.__name__})") from None
    records, evals = parse_lines(text.splitlines())
    bad = [why for why in map(bad_numbers, records) if why]
    records = [r for r in records if not bad_numbers(r)]
    fmt = main_format(records)
    iters = [r for r in records if r.format == fmt and r.step_ms is not None]
    skipped = (f"{len(bad)} step line(s) with impossible numbers skipped (the first: {bad[0]})"
               if bad else None)
    if not iters:
        untimed = (f"; its {sum(r.format == fmt for r in records)} {fmt} step line(s) give none: "
                   f"{NO_STEP_TIME[fmt]}" if fmt in NO_STEP_TIME else "")
        raise GpuprofError(f"{p}: no nanoGPT iteration lines ('iter N: loss L, time T ms, mfu M%') and no "
                           "step times in another known format (build-nanogpt 'step N | … | dt: T ms', "
                           "llm.c 'step N/M | … | (T ms | … tok/s)', nanochat 'step N/M (P%) | … | dt: T ms', "
                           "modded-nanogpt 'step:N/M train_time:T ms', litgpt 'iter N step N | … | iter time: "
                           "T ms', HF Trainer's train_steps_per_second)"
                           + untimed + (f"; {skipped}" if skipped else ""))

    warnings: list[str] = [skipped] if skipped else []
    # The run's first line holds compilation and the first eval (nanoGPT iter 0, build-nanogpt's
    # and nanochat's step 0, llm.c's and modded-nanogpt's step 1: steplog.FIRST_STEP); nanoGPT
    # prints mfu -100% until iter 5.
    first = FIRST_STEP.get(fmt)
    steady = [r for r in iters if first is None or r.step is None or r.step > first] or iters
    step_s = median([r.step_ms / 1e3 for r in steady])
    # Only nanoGPT's MFU divides by a known constant (312 TFLOP/s), so only it can be inverted.
    mfus = [m for m in map(mfu_claim, steady) if m is not None] if fmt == "nanogpt" else []
    if fmt == "nanochat" and any(r.mfu_pct is not None for r in steady):
        # nanochat divides by its own table's bf16 peak (its "Peak FLOPS (BF16)" line), inf where it has none.
        printed = median([m for m in map(mfu_claim, steady) if m is not None])
        if printed is None:
            warnings.append(zero_mfu_note(fmt))
        else:
            warnings.append(f"nanochat's bf16_mfu (median {printed:.2f}%) divides by nanochat's own peak table: "
                            "not inverted into FLOPs (the config gives them)")
    if fmt == "hf-trainer":
        warnings.append("HF Trainer prints only train_steps_per_second: the step time is a whole-run "
                        "average, startup included")
    reported = median(mfus)
    tokens, world = _tokens_per_gpu(config)
    block = _config_int(config, "block_size", default=1024)

    # The GPU and the dtype that sets its peak (nanoGPT: bf16 when supported, TF32 allowed).
    dtype = str(config.get("dtype") or "bf16")
    spec = find_gpu(gpu) if gpu else None
    if gpu and spec is None and peak_tflops is None:
        warnings.append(f"--gpu {gpu!r} is not in the GPU table: pass --peak-tflops X")
    used_dtype, peak = peak_for(spec, dtype, tf32_allowed=True)
    peak_source = f"datasheet ({spec.source})" if peak else None
    if peak_tflops is not None:
        peak, peak_source = float(peak_tflops), "--peak-tflops"
    if peak is None and not (gpu and spec is None):
        warnings.append("no GPU given (--gpu NAME or --peak-tflops X): true MFU and floor not computed")

    # FLOPs per step: from the printed MFU (nanoGPT's formula and A100 constant), else the config.
    dims_keys = ("n_layer", "n_head", "n_embd")
    have_dims = all(config.get(k) is not None for k in dims_keys)
    dims = None
    cfg_per_token = None
    if have_dims:
        dims = {k: _config_int(config, k) for k in dims_keys}
        dims.update(block_size=block, vocab_size=_config_int(config, "vocab_size", default=GPTConfig.vocab_size),
                    bias=bool(config.get("bias", True)))
        cfg_per_token = gpt_flops_per_token(dims)
    flops_step = flops_source = None
    if reported is not None and step_s:
        flops_step = reported / 100 * NANOGPT_A100_TFLOPS * 1e12 * step_s
        flops_source = "printed mfu × 312 TFLOP/s × step time (nanoGPT's estimate_mfu inverted)"
    elif cfg_per_token and tokens:
        flops_step = cfg_per_token * tokens
        flops_source = "config (analytic 6N + 12·L·H·Q·T)"
    else:
        warnings.append("no printed MFU and no model dims + tokens per step in the config: FLOPs unknown")

    per_token = flops_step / tokens if flops_step and tokens else None
    implied = method = nearest = None
    if per_token:
        if have_dims:
            implied = implied_params(per_token, dims["n_layer"], dims["n_embd"], block)
            method = "config n_layer/n_embd"
        else:
            def fpt(name):
                return gpt_flops_per_token(dict(GPT2_SIZES[name], block_size=block))

            nearest = min(GPT2_SIZES, key=lambda n: abs(math.log(fpt(n) / per_token)))
            d = GPT2_SIZES[nearest]
            implied = implied_params(per_token, d["n_layer"], d["n_embd"], block)
            method = f"attention term of the nearest GPT-2 shape ({nearest})"
    elif flops_step and not tokens:
        warnings.append("tokens per step unknown (give batch_size, block_size, "
                        "gradient_accumulation_steps): model size not inferred")

    floor = flops_step / (peak * 1e12) if flops_step and peak else None
    true_mfu = flops_step / (step_s * peak * 1e12) if flops_step and peak and step_s else None
    ratio = step_s / floor if floor and step_s else None
    verdict = None
    if ratio is not None:
        for bound, vid, vtext in STEP_VERDICTS:
            if ratio < bound:
                verdict = LogVerdict(vid, vtext)
                break

    # why the printed MFU differs from the true one: the same explanation as a measured run's
    misreport = explain_misreport(reported, true_mfu=true_mfu, peak_tflops=peak, dtype=used_dtype,
                                  device=spec.name if spec else gpu) if reported is not None and peak else ()
    consistency = None
    if cfg_per_token and per_token and flops_source and flops_source.startswith("printed"):
        consistency = per_token / cfg_per_token
        if abs(consistency - 1) > 0.1:
            warnings.append(f"the printed MFU implies {per_token / 1e9:.2f} GFLOPs/token but the config's "
                            f"model has {cfg_per_token / 1e9:.2f}: tokens per step or world_size differ")

    size_table = []
    if tokens and peak:
        for name, d in GPT2_SIZES.items():
            f_tok = gpt_flops_per_token(dict(d, block_size=block))
            f_step = f_tok * tokens
            size_table.append(SizeRow(
                model=name, params=gpt_param_count(**d),
                flops_per_token=f_tok, floor_s=f_step / (peak * 1e12),
                true_mfu_at_step=f_step / (step_s * peak * 1e12) if step_s else None,
                nanogpt_mfu_at_step=f_step / (step_s * NANOGPT_A100_TFLOPS * 1e12) if step_s else None,
            ))
    steady_s = [r.step_ms / 1e3 for r in steady]
    return LogAnalysis(
        path=str(p), format=fmt, iter_lines=len(iters), eval_lines=len(evals),
        skipped_lines=len(bad),
        steady_lines=len(steady), first_iter=iters[0].step, last_iter=iters[-1].step,
        tokens_per_s_printed=median([r.tokens_per_s for r in steady if r.tokens_per_s is not None]),
        step_s_median=step_s,
        step_s_p10=quantile(steady_s, 0.1),
        step_s_p90=quantile(steady_s, 0.9),
        reported_mfu_pct=reported, reported_mfu_lines=len(mfus),
        last_loss=iters[-1].loss,
        tokens_per_step=tokens, world_size=world,
        gpu_key=spec.key if spec else None, gpu_name=spec.name if spec else gpu,
        dtype=used_dtype, peak_tflops=peak, peak_source=peak_source,
        flops_per_step=flops_step, flops_source=flops_source, flops_per_token=per_token,
        flops_per_token_config=cfg_per_token, config_consistency=consistency,
        implied_params=implied, implied_params_method=method, nearest_gpt2=nearest,
        true_mfu=true_mfu, floor_s=floor,
        expected_step_s={f"{m:.0%}": floor / m for m in EXPECTED_MFU} if floor else None,
        best_achievable_step_s=floor / BEST_ACHIEVABLE_MFU if floor else None,
        step_over_floor=ratio, verdict=verdict,
        misreport=misreport, size_table=tuple(size_table), warnings=tuple(warnings),
    )
