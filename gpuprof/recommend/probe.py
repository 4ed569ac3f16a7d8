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

from gpuprof.recommend.tracker import MemoryTracker
from gpuprof.runners.gpt import GPT, GPTConfig

_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


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


def _adamw(model: torch.nn.Module, fake: bool) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    # Under FakeTensorMode the step counter cannot be read back with .item(); the for-loop
    # implementation keeps the same states (exp_avg, exp_avg_sq) either way.
    return torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), foreach=False,
                             capturable=fake)


def measured_peak(cfg: GPTConfig, batch_size: int, dtype: str = "fp32", *, flash: bool = True,
                  checkpointing: bool = False, accum: int = 2, steps: int = 2,
                  fake: bool = False, device: str = "cpu", hold_logits: bool = True) -> int:
    """Peak bytes of live tensors over `steps` training steps of `accum` micro-steps."""
    if device.startswith("cuda"):
        return _cuda_peak(cfg, batch_size, dtype, flash=flash, checkpointing=checkpointing,
                          accum=accum, steps=steps, device=device, hold_logits=hold_logits)
    tracker = MemoryTracker()
    fake_ctx = contextlib.nullcontext()
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        fake_ctx = FakeTensorMode()
    with fake_ctx, tracker:
        _train(cfg, batch_size, dtype, flash, checkpointing, accum, steps, "cpu", fake, hold_logits)
    return tracker.peak_bytes


def _cuda_peak(cfg, batch_size, dtype, *, flash, checkpointing, accum, steps, device,
               hold_logits) -> int:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    _train(cfg, batch_size, dtype, flash, checkpointing, accum, steps, device, False, hold_logits)
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def _train(cfg, batch_size, dtype, flash, checkpointing, accum, steps, device, fake, hold_logits):
    torch.manual_seed(0)
    model = GPT(cfg)
    if device != "cpu":
        model = model.to(device)
    if checkpointing:
        _checkpoint_blocks(model)
    opt = _adamw(model, fake)
    device_type = "cuda" if device.startswith("cuda") else "cpu"
    amp = (torch.autocast(device_type, dtype=_AUTOCAST[dtype]) if dtype in _AUTOCAST
           else contextlib.nullcontext())
    T = cfg.block_size

    def batch():
        x = torch.randint(0, cfg.vocab_size, (batch_size, T + 1), device=device)
        return x[:, :-1].contiguous(), x[:, 1:].contiguous()

    logits = None
    X, Y = batch()
    with _attention_backend(flash):
        for _ in range(steps):
            for _ in range(accum):
                with amp:
                    out, loss = model(X, Y)
                    loss = loss / accum
                if hold_logits:
                    logits = out  # nanoGPT: `logits, loss = model(X, Y)` lives through backward
                del out
                X, Y = batch()  # prefetch the next batch before the backward, as nanoGPT
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=False)
            opt.step()
            opt.zero_grad(set_to_none=True)
    del logits
