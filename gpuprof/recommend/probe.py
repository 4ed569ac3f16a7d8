"""Measured peak memory of real nanoGPT-style training steps, to check the memory model against.

`measured_peak` runs optimizer steps of the GPT (forward under autocast, `loss /= accum`,
backward, clip, AdamW step, zero_grad(set_to_none=True)) the way nanoGPT's train.py does,
including its habit of keeping `logits` alive in the caller while the backward runs, and
returns the tensor-storage high-water mark from `MemoryTracker`:

- on CPU with real tensors (small models),
- on CPU under FakeTensorMode (`fake=True`): same ops and shapes, nothing allocated, so GPT-2
  at batch 256 can be sized on a laptop,
- on CUDA with `torch.cuda.max_memory_allocated` (`device="cuda"`), the allocator's own count.

Two optimizer steps of two micro-steps each are run, so the peak includes the steady state:
AdamW states present, gradients present from the previous micro-step.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch.utils.checkpoint import checkpoint

from gpuprof.hardware import HALF_DTYPES, torch_dtype
from gpuprof.measure.cuda import is_cuda
from gpuprof.recommend.tracker import MemoryTracker
from gpuprof.dims import GPTConfig
from gpuprof.runners.gpt import GPT


def _attention_backend(flash: bool):
    """flash=False forces the math SDPA path (materialized T×T scores), as a PyTorch without
    fused attention or nanoGPT's manual attention would run."""
    if flash:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


def _checkpoint_blocks(model: GPT) -> None:
    # Per-block activation recomputation: only each block's input is kept for the backward.
    for block in model.transformer.h:
        block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)


def _adamw(model: torch.nn.Module, fake: bool):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    if fake:
        return _PlainAdamW(groups)
    return torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), foreach=False)


class _PlainAdamW:
    """AdamW with torch's for-loop state layout (exp_avg, exp_avg_sq per parameter) and a
    Python step counter: torch.optim reads its step tensor back with .item(), which
    FakeTensorMode cannot answer."""

    def __init__(self, groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8):
        self.groups, self.lr, self.betas, self.eps = groups, lr, betas, eps
        self.state: dict = {}
        self.t = 0

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        for group in self.groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state.setdefault(p, {"exp_avg": torch.zeros_like(p),
                                               "exp_avg_sq": torch.zeros_like(p)})
                p.mul_(1 - self.lr * group["weight_decay"])
                st["exp_avg"].lerp_(p.grad, 1 - b1)
                st["exp_avg_sq"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                denom = (st["exp_avg_sq"].sqrt() / (1 - b2**self.t) ** 0.5).add_(self.eps)
                p.addcdiv_(st["exp_avg"], denom, value=-self.lr / (1 - b1**self.t))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.groups:
            for p in group["params"]:
                p.grad = None


def measured_peak(cfg: GPTConfig, batch_size: int, dtype: str = "fp32", *, flash: bool = True,
                  checkpointing: bool = False, accum: int = 2, steps: int = 2,
                  fake: bool = False, device: str = "cpu", hold_logits: bool = True) -> int:
    """Peak bytes of live tensors over `steps` training steps of `accum` micro-steps."""
    if is_cuda(device):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        trainer = _Trainer(cfg, batch_size, dtype, flash, checkpointing, accum, device,
                           fake=False, compile=False, hold_logits=hold_logits)
        for _ in range(steps):
            trainer.step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    tracker = MemoryTracker()
    fake_ctx = contextlib.nullcontext()
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        fake_ctx = FakeTensorMode()
    with fake_ctx, tracker:
        trainer = _Trainer(cfg, batch_size, dtype, flash, checkpointing, accum, "cpu",
                           fake=fake, compile=False, hold_logits=hold_logits)
        for _ in range(steps):
            trainer.step()
        del trainer
    return tracker.peak_bytes


def measured_rss_peak(cfg: GPTConfig, batch_size: int, dtype: str = "fp32", *,
                      flash: bool = True, compile: bool = False, accum: int = 2,
                      warmup_steps: int = 2) -> int:
    """Peak bytes of one real CPU training step from the process's peak RSS (Linux only).

    This sees every allocation, including the buffers torch.compile's generated kernels make
    outside the dispatcher, which a TorchDispatchMode tracker cannot. glibc is told to serve
    every allocation above 64 KiB with mmap and to return freed memory at once, so RSS follows
    the allocator; after warm-up steps (compilation included) the peak-RSS counter is reset,
    one step runs, and the rise over the baseline plus the tensors alive at the baseline
    (weights, AdamW states, held logits) is the step's peak. The mallopt settings stay for the
    rest of the process: call this from a benchmark, not from the CLI."""
    import ctypes
    import gc

    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD: fixed, so it does not adapt upwards
    libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
    trainer = _Trainer(cfg, batch_size, dtype, flash, False, accum, "cpu", fake=False,
                       compile=compile, hold_logits=True)
    for _ in range(warmup_steps):
        trainer.step()
    gc.collect()
    live = trainer.live_bytes()
    base = _proc_status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    trainer.step()
    return _proc_status("VmHWM") - base + live


def _proc_status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


class _Trainer:
    """nanoGPT's optimizer step, minus the data loader (random tokens) and the logging."""

    def __init__(self, cfg, batch_size, dtype, flash, checkpointing, accum, device, *, fake,
                 compile, hold_logits):
        torch.manual_seed(0)
        self.cfg, self.batch_size, self.accum, self.device = cfg, batch_size, accum, device
        self.flash, self.hold_logits = flash, hold_logits
        model = GPT(cfg)
        if device != "cpu":
            model = model.to(device)
        if checkpointing:
            _checkpoint_blocks(model)
        self.model = model
        self.step_model = torch.compile(model) if compile else model
        self.opt = _adamw(model, fake)
        device_type = "cuda" if is_cuda(device) else "cpu"
        self.amp = (lambda: torch.autocast(device_type, dtype=torch_dtype(dtype))) \
            if dtype in HALF_DTYPES else contextlib.nullcontext
        self.logits = None
        self.X, self.Y = self._batch()

    def _batch(self):
        x = torch.randint(0, self.cfg.vocab_size, (self.batch_size, self.cfg.block_size + 1),
                          device=self.device)
        return x[:, :-1].contiguous(), x[:, 1:].contiguous()

    def step(self) -> None:
        with _attention_backend(self.flash):
            for _ in range(self.accum):
                with self.amp():
                    out, loss = self.step_model(self.X, self.Y)
                    loss = loss / self.accum
                if self.hold_logits:
                    self.logits = out  # nanoGPT: `logits, loss = model(X, Y)` outlives backward
                del out
                self.X, self.Y = self._batch()  # prefetch before the backward, as nanoGPT
                loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0, foreach=False)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)

    def live_bytes(self) -> int:
        """Bytes of the tensors alive between steps: weights, optimizer states, logits, batch."""
        storages = {}
        tensors = list(self.model.parameters()) + [self.X, self.Y]
        for state in self.opt.state.values():
            tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
        if self.logits is not None:
            tensors.append(self.logits)
        for t in tensors:
            st = t.untyped_storage()
            storages[id(st)] = st.nbytes()
        return sum(storages.values())
