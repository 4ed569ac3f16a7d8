"""Model FLOPs per step, two ways: the analytic GPT formula and a count on the eager module.

Analytic (nanoGPT / PaLM appendix B): 6·N + 12·L·H·Q·T training FLOPs per token, N the
parameter count without position embeddings. Counted: `torch.utils.flop_counter.FlopCounterMode`
over one micro-batch forward of the eager module (never the compiled wrapper: the counter does
not see inside compiled graphs), training = 3 × forward (backward = 2 × forward). The count runs
once after the measured steps, under no_grad, with the RNG state saved and restored, so it
changes neither the measured steps nor the model's gradients or random stream.

The analytic formula lives in gpuprof/dims.py (pure), where analysis code can use it.
"""

from __future__ import annotations

import contextlib
import time

from gpuprof.dims import TRAIN_OVER_FORWARD, gpt_flops_per_token, missing_gpt_dims
from gpuprof.measure.sharding import refusal

def count_flops(model, args: tuple = (), kwargs: dict | None = None, *, autocast_dtype=None,
                extra_modes: tuple = (), counter: bool = True) -> dict:
    """Count one forward of `model(*args, **kwargs)` with FlopCounterMode.

    A compiled model is unwrapped to its `_orig_mod`. Runs under no_grad (no graph, no .grad
    change), with the CPU and CUDA RNG states restored afterwards (dropout draws nothing from
    the training stream). Returns forward / training FLOPs for that batch and per op.
    extra_modes: context managers that watch the same forward (measure/optrace.py's OpTrace);
    counter=False runs the forward for them alone."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    kwargs = kwargs or {}
    eager = getattr(model, "_orig_mod", model)
    device_type = _device_type(args, kwargs, eager)
    cpu_state = torch.get_rng_state()
    # Only the model's own GPU: get_rng_state_all() would touch (and create a context on) every
    # GPU, GPU 0 included, for a script that runs on cuda:1.
    cuda_dev = _cuda_index(args, kwargs, eager)
    cuda_state = torch.cuda.get_rng_state(cuda_dev) if cuda_dev is not None else None
    t0 = time.perf_counter()
    counter = (FlopCounterMode(display=False, custom_mapping=_extra_formulas()) if counter
               else contextlib.nullcontext())
    try:
        autocast = (torch.autocast(device_type=device_type, dtype=autocast_dtype)
                    if autocast_dtype is not None else contextlib.nullcontext())
        with torch.no_grad(), autocast, counter, contextlib.ExitStack() as watching:
            for mode in extra_modes:
                watching.enter_context(mode)
            eager(*args, **kwargs)
    finally:
        torch.set_rng_state(cpu_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state(cuda_state, cuda_dev)
    if not isinstance(counter, FlopCounterMode):
        return {"forward": None, "train": None, "by_op": {}, "compiled": eager is not model,
                "seconds": time.perf_counter() - t0}
    forward = float(counter.get_total_flops())
    by_op = {str(k): float(v) for k, v in counter.get_flop_counts().get("Global", {}).items()}
    return {
        "forward": forward,
        "train": forward * TRAIN_OVER_FORWARD,
        "by_op": by_op,
        "compiled": eager is not model,
        "seconds": time.perf_counter() - t0,
    }


class FlopsInstrument:
    """Analytic and counted model FLOPs per optimizer step → profile.measurements['flops'].

    Counting happens in stop(), after the measured steps, so it cannot disturb them."""

    name = "flops"

    def __init__(self, count: bool = True):
        self.count = count

    def start(self, ctx) -> None:  # nothing to do during the run
        return None

    def stop(self, ctx) -> dict | None:
        stats = ctx.profile.stats if ctx.profile is not None else None
        cfg = _as_dict(ctx.config)
        micro = (stats.micro_steps if stats else None) or cfg.get("grad_accum") or 1
        tokens = (stats.tokens_per_step if stats else None) or _tokens_per_step(cfg)
        out: dict = {"micro_steps_per_step": int(micro), "tokens_per_step": int(tokens) if tokens else None,
                     "analytic_per_token": None, "analytic_per_step": None,
                     "counted_forward_per_micro": None, "counted_per_step": None, "counted_per_token": None,
                     "counted_by_op": None, "agreement": None, "used": None, "errors": []}
        gcfg = ctx.gpt_config
        dims = (gcfg.to_dict() if hasattr(gcfg, "to_dict") else dict(gcfg)) if gcfg is not None else None
        if dims is not None and not missing_gpt_dims(dims):
            out["analytic_per_token"] = gpt_flops_per_token(dims)
            if tokens:
                out["analytic_per_step"] = out["analytic_per_token"] * tokens
        from gpuprof.measure.budget import per_micro_s

        budget = getattr(ctx, "budget", None)
        fits = True
        sharded = refusal(getattr(ctx, "sharding", None))
        if sharded and self.count and ctx.model is not None:
            fits = False
            out["errors"].append(f"count skipped: {sharded}")
        elif budget is not None:
            allotted = budget.allot(self.name)
            # FlopCounterMode runs one eager forward (~2x its time with the counter's dispatch)
            est = 2 * per_micro_s(ctx, ("forward",))
            if self.count and ctx.model is not None and (est > allotted or allotted <= 0):
                fits = False
                out["errors"].append(f"count skipped: one forward takes ~{est / 2:.1f} s, over the "
                                     f"{allotted:.1f} s left for it in the post-run budget")
        if self.count and ctx.model is not None and fits:
            try:
                from gpuprof.measure.optrace import OpTrace

                # The same forward shows how attention is computed (measure/kernels.py times it).
                trace = OpTrace(getattr(ctx.model, "_orig_mod", ctx.model))
                c = count_flops(ctx.model, tuple(ctx.example_args or ()), dict(ctx.example_kwargs or {}),
                                autocast_dtype=ctx.autocast_dtype, extra_modes=(trace,))
                ctx.op_trace = trace.summary()
                out["counted_forward_per_micro"] = c["forward"]
                out["counted_per_step"] = c["train"] * micro
                out["counted_by_op"] = c["by_op"]
                out["count_seconds"] = c["seconds"]
                out["compiled_model_unwrapped"] = c["compiled"]
                if tokens:
                    out["counted_per_token"] = out["counted_per_step"] / tokens
            except Exception as exc:  # a model the counter cannot run: keep the analytic figure
                out["errors"].append(f"FlopCounterMode failed: {exc.__class__.__name__}: {exc}")
        elif ctx.model is None:
            out["errors"].append("no eager model to count on")
        if budget is not None:
            budget.done(self.name, [] if fits else ["FlopCounterMode count (the analytic figure stands)"])
        a, c = out["analytic_per_step"], out["counted_per_step"]
        if a and c:
            out["agreement"] = c / a
        # Analytic is the standard MFU numerator (PaLM, nanoGPT, llm.c): use it when the model is
        # a known GPT; otherwise the count is all there is.
        out["used"] = "analytic" if a else ("counted" if c else None)
        return out


def _tokens_per_step(cfg: dict) -> int | None:
    if cfg.get("tokens_per_step"):
        return int(cfg["tokens_per_step"])
    try:
        return int(cfg["batch_size"]) * int(cfg["block_size"]) * int(cfg.get("grad_accum", 1))
    except (KeyError, TypeError, ValueError):
        return None


def _as_dict(cfg) -> dict:
    if cfg is None:
        return {}
    if isinstance(cfg, dict):
        return cfg
    from dataclasses import asdict, is_dataclass

    return asdict(cfg) if is_dataclass(cfg) else dict(vars(cfg))


def _device_type(args, kwargs, model) -> str:
    import torch

    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a.device.type
    for p in model.parameters():
        return p.device.type
    return "cpu"


def _cuda_index(args, kwargs, model) -> int | None:
    """Index of the CUDA device the model's inputs (else parameters) are on; None off CUDA."""
    import torch

    for a in [*args, *kwargs.values(), *model.parameters()]:
        if isinstance(a, torch.Tensor):
            return a.device.index if a.is_cuda else None
    return None


def _extra_formulas() -> dict:
    """FLOP formulas FlopCounterMode lacks: the CPU fused attention kernel (torch ≤ 2.13 counts
    only the CUDA flash/efficient/cudnn kernels, so CPU attention would count as zero)."""
    import torch
    from torch.utils import flop_counter as fc

    extra = {}
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is not None and op not in fc.flop_registry and hasattr(fc, "sdpa_flop_count"):
        def _sdpa_cpu(q, k, v, *args, out_shape=None, **kwargs):
            return fc.sdpa_flop_count(q, k, v)

        extra[op] = _sdpa_cpu
    return extra
