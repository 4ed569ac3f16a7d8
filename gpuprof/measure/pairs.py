"""Timing a pair: the run's way and the changed way, alternately, on the run's device.

What measure/kernels.py and measure/compiled.py time with: `alternate` runs each variant once as a
warm-up, then rounds of one run of each (A, B, A, B, …) and keeps the best of each, so a drift in
the machine's speed hits both; `Clock` times a part with CUDA events on the measured device's
current stream, else wall time; `rng_kept` leaves the run's random streams as they were."""

from __future__ import annotations

import contextlib
import time

MAX_REPS = 12
MIN_REPS = 5
SETTLED = 0.02  # a round that improves neither best by more than 2% ends the timing (after MIN_REPS)


class Clock:
    """Seconds of fn(): CUDA events on the device's current stream, else wall time."""

    def __init__(self, device):
        import torch

        from gpuprof.measure.cuda import cuda_device, is_cuda

        self.torch = torch
        self.cuda = is_cuda(device)
        self.dev = cuda_device(device) if self.cuda else torch.device(str(device))

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)

    def spans(self, *fns) -> list[float]:
        """Run fns in order; the seconds of each."""
        if self.cuda:
            stream = self.torch.cuda.current_stream(self.dev)
            evs = [self.torch.cuda.Event(enable_timing=True) for _ in range(len(fns) + 1)]
            evs[0].record(stream)
            for fn, ev in zip(fns, evs[1:]):
                fn()
                ev.record(stream)
            evs[-1].synchronize()
            return [max(a.elapsed_time(b) / 1e3, 1e-9) for a, b in zip(evs, evs[1:])]
        out, t = [], time.perf_counter()
        for fn in fns:
            fn()
            now = time.perf_counter()
            out.append(max(now - t, 1e-9))
            t = now
        return out


def alternate(clock: Clock, variants: dict, seconds: float, now=time.perf_counter) -> dict:
    """{name: [best seconds of each part]} for variants {name: [part fns]} run alternately: a
    warm-up of each, then rounds of one run of each until the bests settle (a round after the
    MIN_REPS-th improves neither by more than 2%), `seconds` is spent, or MAX_REPS rounds; at
    least 2 rounds. Raises TimeoutError when the warm-up alone leaves no room for 2 rounds."""
    deadline = now() + seconds
    t0 = now()
    for parts in variants.values():
        clock.spans(*parts)  # warm-up: kernel selection, allocator, autotuning caches
    clock.sync()
    one_round = now() - t0
    if one_round * 3 > seconds:
        raise TimeoutError(f"one round takes {one_round:.2f} s; {seconds:.2f} s would not hold 2 timed rounds")
    best = {name: None for name in variants}
    rounds = 0
    while rounds < MAX_REPS and (rounds < 2 or now() + one_round < deadline):
        improved = False
        for name, parts in variants.items():
            got = clock.spans(*parts)
            if best[name] is None or sum(got) < (1 - SETTLED) * sum(best[name]):
                improved = True
            best[name] = got if best[name] is None else [min(a, b) for a, b in zip(best[name], got)]
        rounds += 1
        if rounds >= MIN_REPS and not improved:
            break
    return {"best": best, "rounds": rounds}


def autocast_for(device, dtype):
    import torch

    from gpuprof.hardware import torch_dtype
    from gpuprof.measure.cuda import is_cuda

    if dtype in ("bf16", "fp16"):
        return torch.autocast("cuda" if is_cuda(device) else "cpu", dtype=torch_dtype(dtype))
    return contextlib.nullcontext()


# -- attention -------------------------------------------------------------------------------------

def how(device) -> str:
    from gpuprof.measure.cuda import is_cuda

    return "CUDA events" if is_cuda(device) else "wall time"


# -- the instrument --------------------------------------------------------------------------------

@contextlib.contextmanager
def rng_kept(device):
    import torch

    from gpuprof.measure.cuda import cuda_device, is_cuda

    cpu = torch.get_rng_state()
    dev = cuda_device(device) if is_cuda(device) else None
    gpu = torch.cuda.get_rng_state(dev) if dev is not None else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if gpu is not None:
            torch.cuda.set_rng_state(gpu, dev)
