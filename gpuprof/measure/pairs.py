"""Timing a pair: the run's way and the changed way, alternately, on the run's device.

What measure/kernels.py and measure/compiled.py time with: `alternate` runs each variant once as a
warm-up, then rounds of one run of each (A, B, A, B, …) and keeps the best of each, so a drift in
the machine's speed hits both; `alternate_rounds` runs the same warm-up and rounds but keeps every
round's seconds (each round's order reversed from the last: A B, B A, A B, …, so a drift within a
round cancels over two rounds), the paired differences gpuprof.measure.paired turns into an
interval; `Clock` times a part with CUDA events on the measured device's current stream, else wall
time; `rng_kept` leaves the run's random streams as they were."""

from __future__ import annotations

import contextlib
import time

MAX_REPS = 12
MIN_REPS = 5
MAX_ROUNDS = 16  # alternate_rounds: enough for a 90% paired interval of useful width
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


def _warm_up(clock, variants: dict, seconds: float, now) -> tuple[float, float]:
    """Run each variant once (kernel selection, allocator, autotuning caches); (the deadline, the
    seconds of that warm-up round). Raises TimeoutError when it leaves no room for 2 timed rounds."""
    deadline = now() + seconds
    t0 = now()
    for parts in variants.values():
        clock.spans(*parts)
    clock.sync()
    one_round = now() - t0
    if one_round * 3 > seconds:
        raise TimeoutError(f"one round takes {one_round:.2f} s; {seconds:.2f} s would not hold 2 timed rounds")
    return deadline, one_round


def alternate(clock: Clock, variants: dict, seconds: float, now=time.perf_counter) -> dict:
    """{name: [best seconds of each part]} for variants {name: [part fns]} run alternately: a
    warm-up of each, then rounds of one run of each until the bests settle (a round after the
    MIN_REPS-th improves neither by more than 2%), `seconds` is spent, or MAX_REPS rounds; at
    least 2 rounds. Raises TimeoutError when the warm-up alone leaves no room for 2 rounds."""
    deadline, one_round = _warm_up(clock, variants, seconds, now)
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


def alternate_rounds(clock: Clock, variants: dict, seconds: float, now=time.perf_counter, *,
                     max_rounds: int = MAX_ROUNDS, min_rounds: int = 2, until=None, lead_in: int = 0) -> dict:
    """Every round's seconds of variants {name: [part fns]}, for paired intervals: the same warm-up
    and deadline as `alternate` (a warm-up of each; TimeoutError when it leaves no room for 2
    rounds), then rounds of one run of each, round r in the given order when r is even and
    reversed when odd (A B, B A, A B, …). Rounds go on while another fits before the deadline
    (judged by the warm-up round's seconds), up to `max_rounds`, at least `min_rounds`; an even
    count is kept when the deadline allows one more round rather than two. `until(result)`, asked
    after each even round from `min_rounds` on, stops early when it returns True (say, once the
    interval is decided). With `lead_in` n, each variant's first n parts run in every round but
    are not kept: the parts timed then run after the variant's own (a loop's micro-steps run after
    one of their own, not after the other way's: benchmarks/alternation_bias.py). Returns
    {"times": {name: [[part seconds] per round]}, "order": [[names] per round], "rounds": n,
    "best": {name: [best seconds of each part]}, "warm_up_s": s}."""
    if any(len(parts) <= lead_in for parts in variants.values()):
        raise ValueError(f"a lead-in of {lead_in} part(s) leaves a variant nothing to time")
    deadline, one_round = _warm_up(clock, variants, seconds, now)
    names = list(variants)
    res = {"times": {name: [] for name in names}, "order": [], "rounds": 0, "best": {}, "warm_up_s": one_round}
    while res["rounds"] < max_rounds:
        r = res["rounds"]
        if r >= min_rounds:
            # Start a pair of rounds only when both fit; finish a pair when its second one fits.
            need = one_round * (2 if r % 2 == 0 and r + 1 < max_rounds else 1)
            if now() + need >= deadline or (r % 2 == 0 and until is not None and until(res)):
                break
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            res["times"][name].append(clock.spans(*variants[name])[lead_in:])
        res["order"].append(list(order))
        res["rounds"] = r + 1
    res["best"] = {name: [min(p) for p in zip(*res["times"][name])] for name in names}
    return res


def round_seconds(res: dict, name: str) -> list[float]:
    """One variant's seconds in each round of `alternate_rounds` (its parts summed)."""
    return [sum(parts) for parts in res["times"][name]]


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
