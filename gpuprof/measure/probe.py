"""The measured ceiling: how fast this device multiplies matrices in the run's dtype.

A short square-matmul loop (1-2 s): on CUDA timed with CUDA events around batches of matmuls
(no host timing error, no sync inside a batch), on CPU with wall time. The best batch is the
ceiling: what this device actually delivers, beside the datasheet peak. Large products reach
~80% of the datasheet on H100/H200; a CPU has no datasheet in the table at all, so there the
ceiling is the only denominator that makes sense.
"""

from __future__ import annotations

import contextlib
import time

from gpuprof.hardware import normalize_dtype, torch_dtype
from gpuprof.measure.sharding import refusal

_CUDA_SIZE = {"fp32": 4096, "tf32": 8192, "bf16": 8192, "fp16": 8192}
_CPU_MIN_SIZE = 512  # smaller products measure call overhead, not arithmetic
_CPU_MAX_SIZE = 2048


def matmul_ceiling(device: str = "cpu", dtype: str = "fp32", seconds: float = 1.5, *,
                   size: int | None = None) -> dict:
    """Achieved dense matmul TFLOP/s on `device` in `dtype` (fp32, tf32, bf16, fp16).

    On CUDA 'fp32' turns TF32 off and 'tf32' turns it on for the probe only (restored after),
    so the probe measures exactly the dtype asked for. fp8 is probed as bf16 (no portable fp8
    matmul). Returns tflops (best batch), tflops_mean, method, size, dtype, matmuls, seconds."""
    import torch

    from gpuprof.measure.cuda import is_cuda
    from gpuprof.measure.precision import matmul_tf32_state, tf32_matmul

    want = normalize_dtype(dtype)
    probe_dtype = "bf16" if want == "fp8" else want
    tdtype = torch_dtype(probe_dtype)
    on_cuda = is_cuda(device)
    t_start = time.perf_counter()
    deadline = t_start + max(0.1, float(seconds))
    tf32_ctx = (tf32_matmul(probe_dtype == "tf32") if on_cuda and probe_dtype in ("fp32", "tf32")
                else contextlib.nullcontext())
    with tf32_ctx, torch.no_grad():
        tf32_during = matmul_tf32_state()["tf32_matmul"] if on_cuda else None
        if on_cuda:
            res = _cuda(torch, device, tdtype, size or _CUDA_SIZE[probe_dtype], deadline)
        else:
            res = _cpu(torch, device, tdtype, size, deadline)
    res.update({
        "device": str(device),
        "dtype": probe_dtype,
        "requested_dtype": want,
        "tf32_during_probe": tf32_during,
        "seconds": time.perf_counter() - t_start,
    })
    return res


def _cpu(torch, device, tdtype, size, deadline) -> dict:
    # Grow the size until one product takes ~1/30 of the budget, so a 2-core box and a 64-core
    # server both spend about the same time and the product is big enough to be compute-bound.
    budget = deadline - time.perf_counter()
    n = size or _CPU_MIN_SIZE
    while True:
        a = torch.randn(n, n, dtype=tdtype, device=device)
        b = torch.randn(n, n, dtype=tdtype, device=device)
        torch.matmul(a, b)  # warm-up: thread pool, packing buffers
        t = time.perf_counter()
        torch.matmul(a, b)
        one = max(time.perf_counter() - t, 1e-6)
        # Doubling n costs 8x: grow while the next size still fits ~1/20 of the budget.
        if size or n >= _CPU_MAX_SIZE or one * 8 > budget / 20:
            break
        n *= 2
    k = max(1, int(budget / 10 / one))  # ~10 timed batches
    rates = []
    matmuls = 0
    flops = 2.0 * n**3
    batch_s = k * one
    while not rates or time.perf_counter() + batch_s < deadline:
        t = time.perf_counter()
        for _ in range(k):
            torch.matmul(a, b)
        batch_s = time.perf_counter() - t
        rates.append(k * flops / batch_s / 1e12)
        matmuls += k
    return {"tflops": max(rates), "tflops_mean": sum(rates) / len(rates), "method": "wall",
            "size": n, "matmuls": matmuls, "batches": len(rates)}


def _cuda(torch, device, tdtype, n, deadline) -> dict:
    # Everything on the measured device and its current stream: torch.cuda's defaults follow
    # the current device, which for a script on cuda:1 is an idle GPU 0.
    from gpuprof.measure.cuda import cuda_device

    dev = cuda_device(device)
    stream = torch.cuda.current_stream(dev)
    while True:
        try:
            a = torch.randn(n, n, dtype=tdtype, device=dev)
            b = torch.randn(n, n, dtype=tdtype, device=dev)
            break
        except torch.cuda.OutOfMemoryError:
            if n <= 1024:
                raise
            n //= 2
    out = torch.empty(n, n, dtype=tdtype, device=dev)
    for _ in range(3):  # warm-up: cuBLAS heuristics, clocks up
        torch.matmul(a, b, out=out)
    torch.cuda.synchronize(dev)
    flops = 2.0 * n**3
    k = 10
    rates, matmuls = [], 0
    while time.perf_counter() < deadline or not rates:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        for _ in range(k):
            torch.matmul(a, b, out=out)
        end.record(stream)
        end.synchronize()
        ms = start.elapsed_time(end)
        rates.append(k * flops / (ms / 1e3) / 1e12)
        matmuls += k
    del a, b, out
    return {"tflops": max(rates), "tflops_mean": sum(rates) / len(rates), "method": "cuda-events",
            "size": n, "matmuls": matmuls, "batches": len(rates)}


PRECISIONS_MAX_S = 4.0  # the precision sweep's cap, whatever the budget
ROUND_MARGIN = 1.25  # a paired round's seconds, planned from the run's own: room for a slower moment


class CeilingProbe:
    """After the measured steps: the square-matmul ceiling in the run's compute dtype (the same
    one the MFU divides by: ctx.precision['compute_dtype']), and every precision the device offers
    at the model's own matmul shapes (measure/precisions.py) → measurements['probe'].

    With a post-run budget (ctx.budget) both shrink to its 'probe' part: about a third for the
    ceiling (at most `seconds`), the rest for the precisions (at most PRECISIONS_MAX_S)."""

    name = "probe"

    def __init__(self, seconds: float = 1.5, precisions: bool = True):
        self.seconds = seconds
        self.precisions = precisions

    def start(self, ctx) -> None:
        return None

    def stop(self, ctx) -> dict | None:
        budget = getattr(ctx, "budget", None)
        allotted = budget.allot(self.name) if budget is not None else self.seconds + PRECISIONS_MAX_S
        skipped: list[str] = []
        precision = getattr(ctx, "precision", None) or {}
        dtype = precision.get("compute_dtype") or "fp32"
        square_s = min(self.seconds, allotted * 0.3)
        if square_s >= 0.1:
            try:
                out = matmul_ceiling(ctx.device, dtype, square_s)
            except Exception as exc:  # the run's result stands without a ceiling
                out = {"tflops": None, "dtype": dtype, "device": str(ctx.device),
                       "not_measured": f"matmul probe failed: {exc.__class__.__name__}: {exc}",
                       "error": f"{exc.__class__.__name__}: {exc}"}
        else:
            out = {"tflops": None, "dtype": dtype, "device": str(ctx.device),
                   "not_measured": f"no time left in the post-run budget ({allotted:.2f} s)"}
            skipped.append("square-matmul ceiling")
        if self.precisions:
            t0 = time.perf_counter()
            left = allotted - (out.get("seconds") or 0.0)
            out["precisions"] = self._precisions(ctx, min(PRECISIONS_MAX_S, left * 0.6), skipped)
            left -= time.perf_counter() - t0
            looped = any(x.startswith("precision:") for x in getattr(ctx, "experimented", ()))
            if out["precisions"].get("tflops") and not looped:
                out["precisions"]["switch"] = self._switch(ctx, out["precisions"], left, skipped)
            elif looped:  # the switch was timed on the script's own steps (measure/experiments.py)
                out["precisions"]["switch"] = {"not_measured": "measured on the script's own loop (experiments)"}
        if budget is not None:
            budget.done(self.name, skipped)
        return out

    @staticmethod
    def _switch(ctx, prec: dict, seconds: float, skipped: list[str]) -> dict | None:
        """When another dtype multiplies markedly faster at the model's shapes (or, on a CPU, when
        none does and a half-precision run's full-precision runner-up multiplies within
        hardware.RUNNER_UP_WITHIN of it: `chosen_by` says which), time the model itself in both:
        forward+backward at the run's micro-batch, eagerly, in the run's dtype and
        in the faster one, in paired rounds (precisions.time_steps_paired: ABBA, at least
        ADVISED_ROUNDS when they fit). This measures what the switch saves, norms, softmax and
        casts included, not only the matmuls, with an interval for the ratio (measure/paired.py)."""
        from gpuprof.hardware import pick_faster, runner_up
        from gpuprof.measure.budget import per_micro_s
        from gpuprof.measure.paired import ADVISED_ROUNDS
        from gpuprof.measure.precisions import RUN_CALLS, time_steps_paired

        precision = getattr(ctx, "precision", None) or {}
        current = precision.get("compute_dtype")
        rates = prec["tflops"]
        if current not in rates:
            return None
        best, chosen_by = pick_faster(rates, current), "matmul rate"
        if best is None and str(ctx.device).startswith("cpu"):
            # the matmuls do not decide a step: time the full precision too (hardware.RUNNER_UP_WITHIN)
            best, chosen_by = runner_up(rates, current), "runner-up"
        if best is None:
            return None
        t_run = per_micro_s(ctx)
        out = {"from": current, "to": best, "chosen_by": chosen_by, "run_fwd_bwd_per_micro_s": t_run}
        if best in ("fp32", "tf32") and precision.get("param_dtype") in ("bfloat16", "float16"):
            out["not_measured"] = "the weights are half precision: running fp32 needs a cast model copy"
            return out
        # One round: RUN_CALLS calls of the run's dtype (eager) and of the faster one (at the
        # measured rate ratio).
        one_round = t_run * (1 + rates[current] / rates[best]) * RUN_CALLS * ROUND_MARGIN
        if not t_run or 3 * one_round > seconds:  # a warm-up and 2 rounds: alternate_rounds' least
            skipped.append(f"the model timed in {best}")
            out["not_measured"] = (f"~{3 * one_round:.1f} s needed, {max(seconds, 0):.1f} s left in the post-run budget"
                                   if t_run else "the run's forward+backward time is unknown")
            return out
        enough = (1 + ADVISED_ROUNDS) * one_round <= seconds
        try:
            paired = time_steps_paired(ctx.model, ctx.example_args, ctx.device, current, best, seconds,
                                       ctx.example_kwargs, min_rounds=ADVISED_ROUNDS if enough else 2)
        except Exception as exc:  # noqa: BLE001 - a model that will not run in that dtype
            out["not_measured"] = f"{exc.__class__.__name__}: {exc}"
            return out
        if paired["rounds"] < ADVISED_ROUNDS:
            skipped.append(f"paired rounds of the model in {current} and {best}: {paired['rounds']} of "
                           f"{ADVISED_ROUNDS} fit")
        out.update(fwd_bwd_per_micro_s=paired["median_s"][best], eager_fwd_bwd_per_micro_s=paired["median_s"][current],
                   ratio=paired["ratio"], interval=paired["interval"], rounds=paired["rounds"],
                   round_seconds=paired["round_seconds"], round_s=paired["round_s"],
                   method=(f"eager model, forward+backward at the run's micro-batch in {current} and in {best}, "
                           f"{paired['rounds']} paired rounds (ABBA) after a warm-up, each way {paired['calls_per_round']} "
                           f"calls in a row, the first untimed; the ratio is the median of "
                           f"the rounds' {best}/{current} with its sign-test interval"))
        return out

    @staticmethod
    def _precisions(ctx, seconds: float, skipped: list[str]) -> dict:
        from gpuprof.measure.precisions import measure_precisions, model_matmuls, offered_dtypes

        if seconds < 0.2:
            skipped.append("precisions at the model's shapes")
            return {"not_measured": f"no time left in the post-run budget ({seconds:.2f} s)"}
        sharded = refusal(getattr(ctx, "sharding", None))
        if sharded:  # its shapes come from a forward of the model
            return {"not_measured": sharded}
        try:
            matmuls = model_matmuls(ctx.model, ctx.example_args, example_kwargs=ctx.example_kwargs)
            dtypes, not_probed = offered_dtypes(ctx.device)
            try:  # the run's own dtype, timed first: a half precision slower than it is cut short
                reference = normalize_dtype((getattr(ctx, "precision", None) or {}).get("compute_dtype") or "fp32")
            except ValueError:
                reference = None
            res = measure_precisions(ctx.device, matmuls, dtypes, seconds, reference=reference)
            res["skipped"] = {**not_probed, **res["skipped"]}
            return res
        except Exception as exc:  # noqa: BLE001 - an odd model: the ceiling stands alone
            return {"not_measured": f"{exc.__class__.__name__}: {exc}"}
