"""Which (batch_size, gradient_accumulation_steps) reaches a token target fastest and fits.

Candidates: every micro-batch B up to 65,536 (all B ≤ 64, multiples of 8 above, every power
of two) with the accumulation A whose B·T·A·world_size lies within ±tolerance of the target:
the A closest to the target, and also the power-of-two A when one is in range. Each gets the
memory model's estimate and, when a throughput model is known, a step time.

Ranking: configurations that fit come first, by estimated tokens/s. The winner is then picked
among the fitting ones whose estimate is within 1% of the fastest (the models cannot resolve
less): a power-of-two configuration (B and A both powers of two: what kernels tile and what
people compare) before others, then the one needing the least memory — the headroom is worth
more than a difference the model cannot see. Without a throughput model: power-of-two first,
then fewest micro-steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from gpuprof.errors import GpuprofError
from gpuprof.hardware import TORCH_NAME, TRAIN_DTYPES, GpuSpec, normalize_dtype
from gpuprof.measure.cuda import is_cuda
from gpuprof.recommend.memory import DEFAULT_MARGIN, MemoryEstimate, estimate_memory
from gpuprof.recommend.throughput import ThroughputModel
from gpuprof.recommend.tokens import is_power_of_two
from gpuprof.dims import GPTConfig, flops_per_token
from gpuprof.units import nbytes

NEAR_BEST = 0.01  # estimates this close to the fastest count as equally fast


@dataclass(frozen=True)
class Candidate:
    batch_size: int  # micro-batch per rank
    grad_accum: int  # micro-steps per optimizer step, per rank
    block_size: int
    world_size: int
    memory: MemoryEstimate
    step_s: float | None = None
    step_s_range: tuple[float, float] | None = None

    @property
    def tokens(self) -> int:
        return self.batch_size * self.block_size * self.grad_accum * self.world_size

    @property
    def gradient_accumulation_steps(self) -> int:
        """nanoGPT's config value: train.py divides it by the world size."""
        return self.grad_accum * self.world_size

    @property
    def fits(self) -> bool | None:
        return self.memory.fits

    @property
    def pow2(self) -> bool:
        return is_power_of_two(self.batch_size) and is_power_of_two(self.grad_accum)

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.step_s if self.step_s else None

    def overrides(self) -> dict:
        return {"batch_size": self.batch_size,
                "gradient_accumulation_steps": self.gradient_accumulation_steps}

    def to_dict(self, target: int | None = None) -> dict:
        d = {
            "batch_size": self.batch_size,
            "grad_accum": self.grad_accum,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "tokens": self.tokens,
            "memory_bytes": self.memory.total_bytes,
            "peak_allocated_bytes": self.memory.peak_allocated_bytes,
            "fits": self.fits,
            "step_s": self.step_s,
            "step_s_range": list(self.step_s_range) if self.step_s_range else None,
            "tokens_per_s": self.tokens_per_s,
            "power_of_two": self.pow2,
        }
        if target:
            d["target_delta"] = (self.tokens - target) / target
        return d


@dataclass
class Recommendation:
    target_tokens: int
    tolerance: float
    model: GPTConfig
    dtype: str
    compile: bool
    flash: bool
    checkpointing: bool
    world_size: int
    gpu: GpuSpec | None
    capacity_bytes: int | None
    throughput: ThroughputModel | None
    candidates: list[Candidate]
    best: Candidate | None
    reason: str
    current: Candidate | None = None
    notes: list[str] = field(default_factory=list)
    margin: float = DEFAULT_MARGIN
    capacity_source: str = ""  # where capacity_bytes came from, for the report

    @property
    def block_size(self) -> int:
        return self.model.block_size

    def flop_floor_s(self, cand: Candidate | None) -> float | None:
        """Seconds for cand's tokens at 100% of the GPU's dense peak: no config beats it."""
        if cand is None or self.gpu is None:
            return None
        key = "tf32" if self.dtype == "fp32" and self.gpu.peak_tflops("tf32") else self.dtype
        peak = self.gpu.peak_tflops(key)
        if not peak:
            return None
        per_rank = cand.tokens / self.world_size
        return per_rank * flops_per_token(self.model) / (peak * 1e12)

    def overrides(self) -> dict:
        """The corrected nanoGPT settings for the winner (the assumptions it was sized under)."""
        if self.best is None:
            return {}
        return {**self.best.overrides(), "block_size": self.block_size,
                "dtype": TORCH_NAME[self.dtype], "compile": self.compile}

    def shown(self, limit_other: int = 3) -> list[Candidate]:
        """Rows worth showing: every power-of-two candidate plus the best few others."""
        pow2 = [c for c in self.candidates if c.pow2]
        others = [c for c in self.candidates if not c.pow2 and c.fits is not False][:limit_other]
        rows = pow2 + others
        return sorted(rows, key=self.candidates.index)

    def to_dict(self) -> dict:
        t = self.target_tokens
        return {
            "target_tokens": t,
            "tolerance": self.tolerance,
            "window": list(token_window(t, self.tolerance)),
            "model": self.model.to_dict(),
            "dtype": self.dtype,
            "compile": self.compile,
            "flash": self.flash,
            "checkpointing": self.checkpointing,
            "world_size": self.world_size,
            "gpu": None if self.gpu is None else {"key": self.gpu.key, "name": self.gpu.name},
            "capacity_bytes": self.capacity_bytes,
            "capacity_source": self.capacity_source,
            "margin": self.margin,
            "throughput": None if self.throughput is None else self.throughput.to_dict(),
            "candidates": [c.to_dict(t) for c in self.candidates],
            "best": None if self.best is None else self.best.to_dict(t),
            "reason": self.reason,
            "breakdown": None if self.best is None else self.best.memory.to_dict(),
            "current": None if self.current is None else self.current.to_dict(t),
            "current_breakdown": None if self.current is None else self.current.memory.to_dict(),
            "flop_floor_s": self.flop_floor_s(self.best),
            "overrides": self.overrides(),
            "notes": self.notes,
        }


def token_window(target: int, tolerance: float) -> tuple[int, int]:
    """Smallest and largest token counts accepted: target × (1 ∓ tolerance), whole tokens."""
    tol = Fraction(tolerance).limit_denominator(10**6)
    lo = target * (1 - tol)
    hi = target * (1 + tol)
    return -(-lo.numerator // lo.denominator), hi.numerator // hi.denominator


MAX_MICRO_BATCH = 1 << 16  # sequences per micro-step; far beyond any GPU's memory


def _micro_batches(limit: int) -> list[int]:
    limit = min(limit, MAX_MICRO_BATCH)
    return [b for b in range(1, limit + 1) if b <= 64 or b % 8 == 0 or is_power_of_two(b)]


def _accumulations(b: int, a_lo: int, a_hi: int, exact: Fraction) -> set[int]:
    """The accumulation closest to the target for micro-batch b, and the closest power of two
    in [a_lo, a_hi] if there is one. Arithmetic, not a search: the range can be huge."""
    x = exact / b
    near = {max(a_lo, min(a_hi, v)) for v in (x.numerator // x.denominator,
                                               -(-x.numerator // x.denominator))}
    out = {min(near, key=lambda a: (abs(b * a - exact), a))}
    xc = max(a_lo, min(a_hi, x.numerator // x.denominator))
    p = 1 << (xc.bit_length() - 1)  # the powers of two around x, and at the range's ends
    ends = (1 << (a_hi.bit_length() - 1), 1 << (a_lo - 1).bit_length())
    pows = [q for q in (p, p * 2, *ends) if a_lo <= q <= a_hi]
    if pows:
        out.add(min(pows, key=lambda a: (abs(b * a - exact), a)))
    return out


def evaluate(cfg: GPTConfig, batch_size: int, grad_accum: int, *, dtype: str, compile: bool,
             flash: bool, checkpointing: bool, world_size: int, capacity_bytes: int | None,
             throughput: ThroughputModel | None, margin: float = DEFAULT_MARGIN,
             device: str = "cuda") -> Candidate:
    """Memory and time estimate for one (batch_size, grad_accum) on this setup."""
    mem = estimate_memory(cfg, batch_size, dtype=dtype, flash=flash, checkpointing=checkpointing,
                          compile=compile, grad_accum=grad_accum, world_size=world_size,
                          device=device, capacity_bytes=capacity_bytes, margin=margin)
    step = rng = None
    if throughput is not None:
        step = throughput.step_s(batch_size, cfg.block_size, grad_accum)
        rng = throughput.step_range(batch_size, cfg.block_size, grad_accum)
    return Candidate(batch_size, grad_accum, cfg.block_size, world_size, mem, step, rng)


def recommend(model_cfg: GPTConfig, target_tokens: int, gpu: GpuSpec | None = None,
              dtype: str = "bf16", compile: bool = False, flash: bool = True,
              checkpointing: bool = False, world_size: int = 1,
              capacity_bytes: int | None = None, throughput: ThroughputModel | None = None, *,
              tolerance: float = 0.05, current: tuple[int, int] | None = None,
              margin: float = DEFAULT_MARGIN, device: str = "cuda") -> Recommendation:
    """Rank the configurations that reach `target_tokens` per optimizer step.

    current = (batch_size, grad_accum per rank) of the user's present config, if known.
    capacity_bytes defaults to the GPU's memory; throughput to the FLOP estimate for the GPU.
    Raises GpuprofError for targets that no configuration reaches."""
    T, W = model_cfg.block_size, world_size
    _check_positive(target_tokens=target_tokens, world_size=W, block_size=T)
    if not 0 <= tolerance < 1:
        raise GpuprofError(f"--tolerance must be in [0, 1), got {tolerance}")
    dtype = normalize_dtype(dtype, allowed=TRAIN_DTYPES)
    notes: list[str] = []
    if capacity_bytes is None and gpu is not None:
        capacity_bytes = gpu.memory_bytes
    if throughput is None and gpu is not None:
        throughput = ThroughputModel.from_flops(model_cfg, gpu, dtype)

    unit = T * W
    if target_tokens < unit:
        raise GpuprofError(
            f"target {target_tokens:,} tokens is smaller than one sequence per rank "
            f"(block_size {T:,} × world_size {W} = {unit:,} tokens)")
    lo, hi = token_window(target_tokens, tolerance)
    n_lo, n_hi = -(-lo // unit), hi // unit
    if n_lo > n_hi:
        below, above = (target_tokens // unit) * unit, (target_tokens // unit + 1) * unit
        raise GpuprofError(
            f"no configuration reaches {target_tokens:,} tokens ±{tolerance:.0%}: tokens per step "
            f"come in multiples of {unit:,} (block_size × world_size); nearest are "
            f"{below:,} ({(below - target_tokens) / target_tokens:+.1%}) and "
            f"{above:,} ({(above - target_tokens) / target_tokens:+.1%}); "
            f"widen --tolerance or pick one of those")

    kw = dict(dtype=dtype, compile=compile, flash=flash, checkpointing=checkpointing,
              world_size=W, capacity_bytes=capacity_bytes, throughput=throughput, margin=margin,
              device=device)
    exact = Fraction(target_tokens, unit)
    cands: list[Candidate] = []
    for b in _micro_batches(n_hi):
        a_lo, a_hi = -(-n_lo // b), n_hi // b
        if a_lo > a_hi:
            continue
        for a in sorted(_accumulations(b, a_lo, a_hi, exact)):
            cands.append(evaluate(model_cfg, b, a, **kw))
    cands.sort(key=lambda c: _rank_key(c, target_tokens))
    best = _pick_best(cands)
    if best is not None:
        cands.remove(best)
        cands.insert(0, best)
    cur = None
    if current is not None:
        cb, ca = current
        _check_positive(batch_size=cb, grad_accum=ca)
        cur = evaluate(model_cfg, cb, ca, **kw)
        if not (lo <= cur.tokens <= hi):
            notes.append(f"the current config makes {cur.tokens:,} tokens per step, outside "
                         f"the target window {lo:,}-{hi:,}")
    reason = _reason(best, cands, cur, capacity_bytes)
    if best is not None and compile and capacity_bytes:
        eager = estimate_memory(model_cfg, best.batch_size, dtype=dtype, flash=flash,
                                checkpointing=checkpointing, compile=False,
                                grad_accum=best.grad_accum, world_size=W, device=device,
                                capacity_bytes=capacity_bytes, margin=margin)
        if not eager.fits:
            notes.append(f"batch_size={best.batch_size} fits only compiled: without torch.compile "
                         f"it would need {nbytes(eager.total_bytes)} (eager keeps the loss's fp32 "
                         f"B·T·vocab buffers)")
    if compile:
        notes.append("compiled memory terms were read from inductor's generated code and "
                     "checked on CPU; not measured on a GPU")
    if is_cuda(device):
        notes.append("allocator overhead (10%) and CUDA context (1 GiB) are assumptions, "
                     "not measurements")
    if W > 1:
        notes.append(f"nanoGPT divides gradient_accumulation_steps by the world size: write "
                     f"{W} × grad_accum in the config; DDP all-reduce time is not modeled")
    return Recommendation(target_tokens, tolerance, model_cfg, dtype, compile, flash,
                          checkpointing, W, gpu, capacity_bytes, throughput, cands, best, reason,
                          cur, notes, margin,
                          capacity_source=f"{gpu.name} (hardware table)" if gpu else "")


def _check_positive(**values) -> None:
    for key, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise GpuprofError(f"{key.replace('_', '-')} must be a positive integer, got {v!r}")


def _rank_key(c: Candidate, target: int):
    fit_rank = 1 if c.fits is False else 0
    delta = abs(c.tokens - target)
    if c.step_s is None:
        return (fit_rank, not c.pow2, c.grad_accum, delta, c.batch_size)
    return (fit_rank, -c.tokens / c.step_s, delta, c.batch_size)


def _pick_best(ranked: list[Candidate]) -> Candidate | None:
    fitting = [c for c in ranked if c.fits is not False]
    if not fitting:
        return None
    if fitting[0].tokens_per_s is None:
        return fitting[0]
    fastest = fitting[0].tokens_per_s
    near = [c for c in fitting if c.tokens_per_s >= fastest * (1 - NEAR_BEST)]
    return min(near, key=lambda c: (not c.pow2, c.memory.total_bytes, c.batch_size))


def _reason(best: Candidate | None, cands: list[Candidate], cur: Candidate | None,
            capacity: int | None) -> str:
    if best is None:
        smallest = min(cands, key=lambda c: c.memory.total_bytes)
        return (f"nothing fits: even batch_size={smallest.batch_size} needs "
                f"{nbytes(smallest.memory.total_bytes)} of {nbytes(capacity or 0)}; try "
                f"--checkpointing, bf16, a shorter block or a smaller model")
    b, a = best.batch_size, best.grad_accum
    if capacity:
        parts = [f"batch_size={b} × {a} micro-steps needs {nbytes(best.memory.total_bytes)} of "
                 f"{nbytes(capacity)} ({best.memory.total_bytes / capacity:.0%})"]
    else:
        parts = [f"batch_size={b} × {a} micro-steps (memory capacity unknown)"]
    if best.step_s is not None:
        parts.append(f"est. {best.step_s:.3g} s/step, {best.tokens_per_s:,.0f} tokens/s")
        bigger_fit = [c for c in cands if c.batch_size > b and c.fits is not False]
        if bigger_fit:
            top = max(bigger_fit, key=lambda c: c.batch_size)
            gain = max(c.tokens_per_s for c in bigger_fit) / best.tokens_per_s - 1
            parts.append(f"bigger micro-batches fit (up to {top.batch_size}, "
                         f"{nbytes(top.memory.total_bytes)}) but are at most {gain:.1%} faster by "
                         f"this estimate, within its resolution")
    too_big = [c for c in cands if c.batch_size > b and c.fits is False and c.pow2]
    if too_big:
        nxt = min(too_big, key=lambda c: c.batch_size)
        parts.append(f"batch_size={nxt.batch_size} × {nxt.grad_accum} would need "
                     f"{nbytes(nxt.memory.total_bytes)} and does not fit")
    if cur is not None and cur.fits is False:
        parts.append(f"the current batch_size={cur.batch_size} needs "
                     f"{nbytes(cur.memory.total_bytes)} and would run out of memory")
    elif best.step_s is not None and cur is not None and cur.tokens_per_s \
            and cur.step_s != best.step_s:
        parts.append(f"{best.tokens_per_s / cur.tokens_per_s:.2f}× the current tokens/s")
    return "; ".join(parts)
