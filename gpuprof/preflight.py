"""Checks made before a built-in run starts, so that nothing runs for minutes in silence or
fails for memory at its end (output paths: gpuprof.files.check_outputs).

- `check_memory`: the built-in loop's peak memory by the recommend memory model
  (gpuprof.recommend.memory) against the device's memory — GPU memory on CUDA, available RAM on
  CPU — with the largest batch_size and block_size that would fit.
- `estimate_step`: one optimizer step's seconds = model FLOPs per step (the nanoGPT formula,
  gpuprof.dims) ÷ the device's ceiling: on CUDA the datasheet peak (gpuprof.hardware) at an
  assumed utilisation, elsewhere a short matmul probe (≤ PROBE_SECONDS). Configs too small to
  take a minute even at FLOOR_FLOPS_PER_S skip the probe, so the usual run pays nothing.
- `preflight_run`: both, as the CLI uses them: a run that cannot fit is refused; one whose step
  is estimated at minutes gets a warning line up front; one estimated at an hour or more is
  refused unless allow_slow.

No printing here: the CLI prints the warning and turns GpuprofError into one line and exit 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from gpuprof.dims import preset_config
from gpuprof.errors import GpuprofError
from gpuprof.hardware import HALF_DTYPES
from gpuprof.measure.cuda import is_cuda
from gpuprof.units import duration, flops_rate, gib

SLOW_STEP_S = 60.0  # "one step will take minutes": said up front
REFUSE_RUN_S = 3600.0  # a run estimated at an hour or more is refused unless --allow-slow
# A step's share of the datasheet peak when nothing was measured: the central value of the
# recommend model's MFU range (llm.c GPT-2 on H100: ≈40-46%, FACTS.md).
ASSUMED_UTILISATION = 0.40
PROBE_SECONDS = 0.2
# Slower than any matmul rate seen on a CPU here (emulated bf16 on a busy 2-core EPYC:
# 0.6-1.8 GFLOP/s). Below SLOW_STEP_S × this many FLOPs per step, no device takes a minute, so
# nothing is probed and nothing is printed.
FLOOR_FLOPS_PER_S = 1e8
# Emulated bf16/fp16 on a CPU runs ~1 GFLOP/s: a 512² product alone would take 0.3 s.
_CPU_HALF_PROBE_SIZE = 256


# -- memory ---------------------------------------------------------------------------------


def _gpt_config(loop, block_size: int | None = None):
    return preset_config(loop.model, block_size or loop.block_size, n_layer=loop.n_layer,
                         n_head=loop.n_head, n_embd=loop.n_embd, vocab_size=loop.vocab_size)


def device_memory(device: str) -> tuple[int, str]:
    """(bytes, what they are) a run on `device` may use: the CUDA device's total memory (as
    `gpuprof recommend` uses), or the RAM available now on a CPU."""
    if is_cuda(device):
        import torch

        from gpuprof.measure.cuda import cuda_device

        dev = cuda_device(device)
        return (torch.cuda.get_device_properties(dev).total_memory,
                f"memory of {torch.cuda.get_device_name(dev)} ({device})")
    import psutil

    return psutil.virtual_memory().available, "available RAM"


@dataclass(frozen=True)
class MemoryCheck:
    """The memory model's estimate against the device, and what would fit instead."""

    estimate: object  # gpuprof.recommend.memory.MemoryEstimate, capacity set
    capacity_source: str
    max_batch: int  # largest batch_size that fits at this block_size (0: none)
    max_block: int  # largest block_size that fits at this batch_size (0: none)

    @property
    def fits(self) -> bool:
        return bool(self.estimate.fits)

    def message(self, loop) -> str:
        """The one-line refusal: estimated bytes vs available, the largest terms, what fits."""
        est = self.estimate
        top = sorted(est.terms, key=lambda t: -t.bytes)[:2]
        text = (f"this run would not fit: its peak memory is estimated at {gib(est.total_bytes)} "
                f"(memory model, at the {est.moment}; largest terms "
                f"{', '.join(f'{t.name} {gib(t.bytes)}' for t in top)}) vs "
                f"{gib(est.capacity_bytes)} {self.capacity_source} "
                f"({gib(est.capacity_bytes - est.margin_bytes)} after a "
                f"{est.margin_bytes / est.capacity_bytes:.0%} margin)")
        fits = []
        if self.max_batch:
            fits.append(f"--batch-size {self.max_batch} at --block-size {loop.block_size}")
        if self.max_block:
            fits.append(f"--block-size {self.max_block} at --batch-size {loop.batch_size}")
        if fits:
            return text + "; largest that fit (estimated): " + " or ".join(fits)
        state = sum(t.bytes for t in est.terms if t.name in ("weights", "gradients", "optimizer"))
        return (text + f"; not even --batch-size 1 at --block-size 1 fits: the weights, gradients "
                f"and AdamW state alone are estimated at {gib(state)}; choose a smaller --model")


def check_memory(loop, capacity: tuple[int, str] | None = None) -> MemoryCheck:
    """Model the built-in loop's peak (`loop`: a LoopConfig) against the device's memory.

    The loop uses fused attention (SDPA picks a flash/memory-efficient kernel for causal
    attention on CPU and CUDA) and nanoGPT's optimizer choice (fused AdamW on CUDA)."""
    from gpuprof.recommend.memory import estimate_memory, max_batch_that_fits

    cap_bytes, source = capacity if capacity is not None else device_memory(loop.device)
    kw = dict(dtype=loop.dtype, compile=loop.compile, grad_accum=loop.grad_accum,
              device="cuda" if is_cuda(loop.device) else "cpu")
    est = estimate_memory(_gpt_config(loop), loop.batch_size, capacity_bytes=cap_bytes, **kw)
    if est.fits:
        return MemoryCheck(est, source, loop.batch_size, loop.block_size)
    max_batch = max_batch_that_fits(_gpt_config(loop), cap_bytes, **kw)
    # Memory grows with block_size (tokens and position embeddings): bisect below the request.
    lo, hi = 0, loop.block_size
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if estimate_memory(_gpt_config(loop, mid), loop.batch_size, capacity_bytes=cap_bytes,
                           **kw).fits:
            lo = mid
        else:
            hi = mid
    return MemoryCheck(est, source, max_batch, lo)


# -- step time ------------------------------------------------------------------------------


def _rate(flops_per_s: float) -> str:
    """A ceiling given in FLOP/s, in the report's words: 0.8 GFLOP/s, 156.9 GFLOP/s, 395.8 TFLOP/s."""
    return flops_rate(flops_per_s / 1e12)


def _sci(x: float) -> str:
    """2.4e8, 5.2e10: two significant digits, no '+' or leading zero in the exponent."""
    mantissa, _, exp = f"{x:.1e}".partition("e")
    return f"{mantissa}e{int(exp)}"


@dataclass(frozen=True)
class Ceiling:
    """The FLOP/s a step is assumed to reach on this device, and how that figure was obtained."""

    flops_per_s: float
    how: str


def probe_ceiling(device: str, dtype: str) -> Ceiling:
    """A matmul probe of at most ~PROBE_SECONDS in the run's dtype (the seam tests replace)."""
    from gpuprof.measure.probe import matmul_ceiling

    on_cpu = not is_cuda(device)
    size = _CPU_HALF_PROBE_SIZE if on_cpu and dtype in HALF_DTYPES else None
    res = matmul_ceiling(device, dtype, seconds=PROBE_SECONDS, size=size)
    rate = float(res["tflops"]) * 1e12
    return Ceiling(rate, f"the {_rate(rate)} {res['dtype']} matmul ceiling a {res['seconds']:.2f} s "
                         f"probe measured on this {'CPU' if on_cpu else 'GPU'} ({res['size']}² products)")


def device_ceiling(device: str, dtype: str, tf32: bool = True, *, gpu: str | None = None,
                   peak_tflops: float | None = None,
                   probe: Callable[[str, str], Ceiling] | None = None) -> Ceiling:
    """What a step of the built-in loop may reach: a peak the user gave or the datasheet peak of
    the CUDA device at ASSUMED_UTILISATION; else (a CPU, a GPU not in the table) a short probe."""
    from gpuprof.hardware import find_gpu

    on_cuda = is_cuda(device)
    math = "tf32" if on_cuda and dtype == "fp32" and tf32 else dtype
    u = ASSUMED_UTILISATION
    if peak_tflops:
        return Ceiling(peak_tflops * 1e12 * u, f"{u:.0%} (assumed utilisation) of --peak-tflops "
                                               f"{peak_tflops:g}")
    if on_cuda:
        name = gpu
        if name is None:
            import torch

            from gpuprof.measure.cuda import cuda_device

            name = torch.cuda.get_device_name(cuda_device(device))
        spec = find_gpu(name)
        peak = spec.peak_tflops(math) if spec is not None else None
        if peak:
            return Ceiling(peak * 1e12 * u, f"{u:.0%} (assumed utilisation) of the {spec.name}'s "
                                            f"{math} datasheet peak, {peak:g} TFLOP/s")
    return (probe or probe_ceiling)(device, math)


@dataclass(frozen=True)
class StepEstimate:
    """One optimizer step's estimated seconds (None when not estimated, with why in `how`)."""

    flops_per_step: float
    seconds: float | None
    how: str

    @property
    def slow(self) -> bool:
        return self.seconds is not None and self.seconds >= SLOW_STEP_S


def estimate_step(loop, *, gpu: str | None = None, peak_tflops: float | None = None,
                  ceiling: Ceiling | None = None,
                  probe: Callable[[str, str], Ceiling] | None = None) -> StepEstimate:
    """Model FLOPs per optimizer step ÷ the device's ceiling (`ceiling` injected, else
    device_ceiling). A failed probe leaves the step not estimated; it never stops a run."""
    from gpuprof.dims import flops_per_token

    flops = float(flops_per_token(_gpt_config(loop))) * loop.batch_size * loop.block_size * loop.grad_accum
    if ceiling is None:
        if flops < SLOW_STEP_S * FLOOR_FLOPS_PER_S:
            return StepEstimate(flops, None, f"not probed: {_sci(flops)} FLOPs per step is under a "
                                             f"minute even at {_rate(FLOOR_FLOPS_PER_S)}")
        try:
            ceiling = device_ceiling(loop.device, loop.dtype, loop.tf32, gpu=gpu,
                                     peak_tflops=peak_tflops, probe=probe)
        except Exception as exc:  # an estimate is advice: the run goes ahead without one
            return StepEstimate(flops, None, f"not estimated: {exc.__class__.__name__}: {exc}")
    if not ceiling.flops_per_s or ceiling.flops_per_s <= 0:
        return StepEstimate(flops, None, f"not estimated: no ceiling ({ceiling.how})")
    return StepEstimate(flops, flops / ceiling.flops_per_s,
                        f"{_sci(flops)} FLOPs per step by the nanoGPT formula ÷ {ceiling.how}")


def slow_message(est: StepEstimate, n_steps: int) -> str:
    """'one optimizer step is estimated at 8.3 min (how); the 12 steps of this run ≈ 1.7 h'."""
    return (f"one optimizer step is estimated at {duration(est.seconds)} ({est.how}); "
            f"the {n_steps} step{'s' if n_steps != 1 else ''} of this run (warmup + measured) ≈ "
            f"{duration(est.seconds * n_steps)}")


# -- both, as the CLI runs them -------------------------------------------------------------


def preflight_run(loop, *, allow_slow: bool = False, gpu: str | None = None,
                  peak_tflops: float | None = None, capacity: tuple[int, str] | None = None,
                  ceiling: Ceiling | None = None) -> str | None:
    """Refuse (GpuprofError) a built-in run that cannot fit in the device's memory. Say up front
    when one step is estimated at SLOW_STEP_S or more (the returned warning line), and refuse a
    run estimated at REFUSE_RUN_S or more unless allow_slow (an absurd --block-size that fits
    would otherwise run for hours in silence). Memory first: a run that cannot fit is never probed."""
    mem = check_memory(loop, capacity)
    if not mem.fits:
        raise GpuprofError(mem.message(loop))
    est = estimate_step(loop, gpu=gpu, peak_tflops=peak_tflops, ceiling=ceiling)
    if not est.slow:
        return None
    n = loop.warmup + loop.steps
    text = slow_message(est, n)
    if est.seconds * n >= REFUSE_RUN_S and not allow_slow:
        raise GpuprofError(f"{text}; pass --allow-slow to run it anyway, or lower --block-size, "
                           f"--batch-size, --grad-accum or --model")
    return f"{text}; running it, Ctrl-C stops it"
