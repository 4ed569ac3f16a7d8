"""`--measure`: time forward+backward at micro-batch 1, 2, 4, … on the device at hand.

The sweep logic (`sweep`) is separate from what it times (`GptMicroStep`), so tests drive it
with a fake clock and a fake step. It stops at the first out-of-memory, when the next size
would not finish inside the time budget (each size is assumed to take at least twice the
previous one), or past the largest micro-batch any candidate needs.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from gpuprof.errors import GpuprofError
from gpuprof.hardware import HALF_DTYPES, torch_dtype
from gpuprof.measure.cuda import is_cuda
from gpuprof.stats import median
from gpuprof.dims import GPTConfig


@dataclass
class SweepPoint:
    batch_size: int
    seconds: float | None  # forward + backward of one micro-step (median of reps)
    peak_bytes: int | None = None  # CUDA max_memory_allocated; None on CPU (not measured)
    error: str | None = None  # "out of memory" when this size did not fit


@dataclass
class SweepResult:
    device: str
    block_size: int
    points: list[SweepPoint] = field(default_factory=list)
    optimizer_s: float = 0.0
    stopped: str = ""

    def timed(self) -> list[tuple[int, float]]:
        """(tokens, seconds) of every size that ran."""
        return [(p.batch_size * self.block_size, p.seconds) for p in self.points
                if p.seconds is not None]

    @property
    def largest_ok(self) -> int:
        return max((p.batch_size for p in self.points if p.seconds is not None), default=0)

    def to_dict(self) -> dict:
        return asdict(self)


class OutOfMemory(Exception):
    """Raised by a micro-step runner when the size does not fit on the device."""


def sweep(run: Callable[[int], tuple[float, int | None]], *, block_size: int, max_batch: int,
          budget_s: float, device: str = "cpu", optimizer: Callable[[], float] | None = None,
          clock: Callable[[], float] = time.perf_counter) -> SweepResult:
    """Run `run(batch_size) -> (seconds, peak_bytes)` for 1, 2, 4, … until a stop condition."""
    if budget_s <= 0:
        raise GpuprofError(f"--measure-budget must be positive, got {budget_s}")
    res = SweepResult(device=device, block_size=block_size)
    t0 = clock()
    b = 1
    last_cost = 0.0
    while True:
        started = clock()
        try:
            seconds, peak = run(b)
        except OutOfMemory:
            res.points.append(SweepPoint(b, None, None, "out of memory"))
            res.stopped = f"batch {b} ran out of memory"
            break
        res.points.append(SweepPoint(b, seconds, peak))
        last_cost = clock() - started
        spent = clock() - t0
        if b * 2 > max_batch:
            res.stopped = f"reached the largest micro-batch needed ({b})"
            break
        if spent + 2 * last_cost > budget_s:
            res.stopped = f"time budget {budget_s:g} s: batch {b * 2} would not finish in it"
            break
        b *= 2
    if optimizer is not None and res.largest_ok:
        res.optimizer_s = optimizer()
    return res


class GptMicroStep:
    """Times forward+backward of the GPT at a given micro-batch on a device, nanoGPT-style."""

    def __init__(self, cfg: GPTConfig, device: str, dtype: str, *, compile: bool = False,
                 flash: bool = True, reps: int = 3, seed: int = 0):
        import torch

        from gpuprof.runners.gpt import GPT

        self.torch = torch
        self.cfg, self.device, self.reps = cfg, device, reps
        self.cuda = is_cuda(device)
        torch.manual_seed(seed)
        try:
            self.model = GPT(cfg).to(device)
        except RuntimeError as exc:
            if "out of memory" in str(exc).lower():
                raise GpuprofError(f"the model alone does not fit on {device}") from None
            raise
        self.step_model = torch.compile(self.model) if compile else self.model
        ptdtype = torch_dtype(dtype) if dtype in HALF_DTYPES else None
        dev_type = "cuda" if self.cuda else "cpu"
        self.amp = (lambda: torch.autocast(dev_type, dtype=ptdtype)) if ptdtype else contextlib.nullcontext
        self.flash = flash

    def _sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def __call__(self, batch_size: int) -> tuple[float, int | None]:
        torch = self.torch
        T, V = self.cfg.block_size, self.cfg.vocab_size
        attn = contextlib.nullcontext()
        if not self.flash:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            attn = sdpa_kernel(SDPBackend.MATH)
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        times = []
        try:
            with attn:
                for i in range(self.reps + 1):  # the first run warms up (and compiles)
                    x = torch.randint(0, V, (batch_size, T), device=self.device)
                    self._sync()
                    t = time.perf_counter()
                    with self.amp():
                        logits, loss = self.step_model(x, x)
                    loss.backward()
                    self._sync()  # timing needs the GPU finished; outside any real step
                    if i:
                        times.append(time.perf_counter() - t)
                    del logits, loss
        except RuntimeError as exc:  # torch.cuda.OutOfMemoryError is a RuntimeError
            if "out of memory" in str(exc).lower():
                self.model.zero_grad(set_to_none=True)
                if self.cuda:
                    torch.cuda.empty_cache()
                raise OutOfMemory(str(exc)) from None
            raise
        peak = torch.cuda.max_memory_allocated(self.device) if self.cuda else None
        self.model.zero_grad(set_to_none=True)
        return median(times), peak

    def optimizer_s(self) -> float:
        """Seconds of one clip + AdamW step + zero_grad (gradients made up, states created)."""
        torch = self.torch
        params = list(self.model.parameters())
        for p in params:
            p.grad = torch.zeros_like(p)
        opt = torch.optim.AdamW(params, lr=1e-4, fused=True if self.cuda else None)
        opt.step()  # creates the states
        self._sync()
        t = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        self._sync()
        return time.perf_counter() - t
