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

from gpuprof.hardware import normalize_dtype

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
    tdtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
              "fp16": torch.float16}[probe_dtype]
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


class CeilingProbe:
    """Runs matmul_ceiling after the measured steps in the run's compute dtype (the same one the
    MFU divides by: ctx.precision['compute_dtype']) → measurements['probe']."""

    name = "probe"

    def __init__(self, seconds: float = 1.5):
        self.seconds = seconds

    def start(self, ctx) -> None:
        return None

    def stop(self, ctx) -> dict | None:
        precision = getattr(ctx, "precision", None) or {}
        dtype = precision.get("compute_dtype") or "fp32"
        try:
            return matmul_ceiling(ctx.device, dtype, self.seconds)
        except Exception as exc:  # the run's result stands without a ceiling
            return {"tflops": None, "dtype": dtype, "device": str(ctx.device),
                    "not_measured": f"matmul probe failed: {exc.__class__.__name__}: {exc}",
                    "error": f"{exc.__class__.__name__}: {exc}"}
