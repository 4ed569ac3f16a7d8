"""Host-to-device copy bandwidth from pageable and from pinned memory (CUDA, after the run).

It sizes the h2d-pageable saving from bytes and bandwidths instead of from the host time a
pageable copy blocks: a pageable `x.to("cuda")` first waits for all queued GPU work (it is a
memcpy-and-sync), so most of its host time is the previous forward, not the copy. Here each
kind is timed alone, at the size of one of the run's copies: host wall time around the copy and a
synchronize of the measured device (the GPU is idle before, so the wait is the copy itself),
best of a few repetitions.
"""

from __future__ import annotations

import time

from gpuprof.measure.cuda import is_cuda

MIN_BYTES = 64 * 1024  # smaller copies measure call overhead, not bandwidth


def measure_copy_bandwidth(device, nbytes: int, reps: int = 10, budget_s: float = 1.0,
                           clock=time.perf_counter) -> dict:
    """Pageable and pinned host-to-device bandwidth (bytes/s) for copies of `nbytes`."""
    import torch

    from gpuprof.measure.cuda import cuda_device, synchronize

    dev = cuda_device(device)
    nbytes = max(int(nbytes), MIN_BYTES)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    sources = {"pageable": torch.empty(nbytes, dtype=torch.uint8),
               "pinned": torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)}
    out: dict = {"bytes_per_copy": nbytes, "device": str(dev),
                 "method": "min of host wall time (copy + synchronize), GPU idle before each copy"}
    deadline = clock() + budget_s
    for kind, src in sources.items():
        dst.copy_(src, non_blocking=kind == "pinned")  # warm-up: staging buffers, page tables
        synchronize(dev)
        times = []
        while len(times) < reps and (clock() < deadline or len(times) < 2):
            synchronize(dev)
            t0 = clock()
            dst.copy_(src, non_blocking=kind == "pinned")
            synchronize(dev)
            times.append(clock() - t0)
        out[f"{kind}_bytes_s"] = nbytes / min(times)
        out[f"{kind}_copies"] = len(times)
    return out


class CopyBandwidthProbe:
    """Instrument: pageable vs pinned copy bandwidth after the run → measurements['copies']."""

    name = "copies"

    def __init__(self, reps: int = 10, budget_s: float = 1.0):
        self.reps = reps
        self.budget_s = budget_s

    def start(self, ctx) -> None:
        return None

    def stop(self, ctx) -> dict | None:
        import torch

        if not is_cuda(ctx.device):
            return None
        first = next((a for a in (ctx.example_args or ()) if isinstance(a, torch.Tensor)), None)
        nbytes = first.numel() * first.element_size() if first is not None else MIN_BYTES
        budget = getattr(ctx, "budget", None)
        seconds = min(self.budget_s, budget.allot(self.name)) if budget is not None else self.budget_s
        if seconds <= 0:  # a stopped run, or one whose GPU never finished: touch nothing
            if budget is not None:
                budget.done(self.name, ["the copy bandwidths"])
            return {"not_measured": f"no time left in the post-run budget ({budget.source if budget else 'none'})"}
        try:
            return measure_copy_bandwidth(ctx.device, nbytes, self.reps, seconds)
        finally:
            if budget is not None:
                budget.done(self.name)
