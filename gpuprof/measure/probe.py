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

    fp32 uses the process's current TF32 setting (as the run did); 'tf32' turns it on for the
    probe only. fp8 is probed as bf16 (no portable fp8 matmul). Returns tflops (best batch),
    tflops_mean, method, size, dtype, matmuls, seconds."""
    import torch

    want = normalize_dtype(dtype)
    probe_dtype = "bf16" if want == "fp8" else want
    tdtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
              "fp16": torch.float16}[probe_dtype]
    is_cuda = str(device).startswith("cuda")
    t_start = time.perf_counter()
    deadline = t_start + max(0.1, float(seconds))
    tf32_ctx = _tf32(torch, on=True) if (probe_dtype == "tf32" and is_cuda) else contextlib.nullcontext()
    with tf32_ctx, torch.no_grad():
        if is_cuda:
            res = _cuda(torch, device, tdtype, size or _CUDA_SIZE[probe_dtype], deadline)
        else:
            res = _cpu(torch, device, tdtype, size, deadline)
    res.update({
        "device": str(device),
        "dtype": probe_dtype,
        "requested_dtype": want,
        "tf32_allowed": bool(torch.backends.cuda.matmul.allow_tf32) if is_cuda else None,
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
    while True:
        try:
            a = torch.randn(n, n, dtype=tdtype, device=device)
            b = torch.randn(n, n, dtype=tdtype, device=device)
            break
        except torch.cuda.OutOfMemoryError:
            if n <= 1024:
                raise
            n //= 2
    out = torch.empty(n, n, dtype=tdtype, device=device)
    for _ in range(3):  # warm-up: cuBLAS heuristics, clocks up
        torch.matmul(a, b, out=out)
    torch.cuda.synchronize(device)
    flops = 2.0 * n**3
    k = 10
    rates, matmuls = [], 0
    while time.perf_counter() < deadline or not rates:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(k):
            torch.matmul(a, b, out=out)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        rates.append(k * flops / (ms / 1e3) / 1e12)
        matmuls += k
    del a, b, out
    return {"tflops": max(rates), "tflops_mean": sum(rates) / len(rates), "method": "cuda-events",
            "size": n, "matmuls": matmuls, "batches": len(rates)}


@contextlib.contextmanager
def _tf32(torch, on: bool):
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev


def run_dtype(autocast_dtype, device: str) -> str:
    """The dtype the run's matmuls ran in: the autocast dtype, else fp32 (tf32 when allowed)."""
    if autocast_dtype is not None:
        return normalize_dtype(str(autocast_dtype))
    if str(device).startswith("cuda"):
        import torch

        if torch.backends.cuda.matmul.allow_tf32:
            return "tf32"
    return "fp32"


class CeilingProbe:
    """Runs matmul_ceiling in the run's dtype after the measured steps → measurements['probe']."""

    name = "probe"

    def __init__(self, seconds: float = 1.5):
        self.seconds = seconds

    def start(self, ctx) -> None:
        return None

    def stop(self, ctx) -> dict | None:
        dtype = run_dtype(ctx.autocast_dtype, ctx.device)
        try:
            return matmul_ceiling(ctx.device, dtype, self.seconds)
        except Exception as exc:  # the run's result stands without a ceiling
            return {"tflops": None, "dtype": dtype, "device": str(ctx.device),
                    "error": f"{exc.__class__.__name__}: {exc}"}
