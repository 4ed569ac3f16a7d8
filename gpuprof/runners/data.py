"""Token data exactly as nanoGPT reads it: a uint16 file, a fresh np.memmap per micro-batch,
random offsets, slices of block_size+1 tokens stacked into int64 tensors.

Without --data a token file is generated once into the cache folder ($XDG_CACHE_HOME/gpuprof,
else ~/.cache/gpuprof) and reused.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gpuprof.errors import GpuprofError
from gpuprof.files import atomic_write
from gpuprof.measure.cuda import is_cuda

TOKEN_BYTES = 2  # uint16, as nanoGPT's prepare.py writes
DEFAULT_TOKENS = 4 * 1024 * 1024  # 8 MiB: plenty of distinct offsets for any block size


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpuprof"


def generated_dataset(vocab_size: int, n_tokens: int = DEFAULT_TOKENS, seed: int = 0) -> Path:
    """A uint16 token file of uniformly random tokens, created once and reused."""
    if vocab_size > 65536:
        raise GpuprofError(f"vocab_size {vocab_size} does not fit uint16 tokens (max 65536)")
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"synthetic-v{vocab_size}-n{n_tokens}-s{seed}.bin"
    if path.exists() and path.stat().st_size == n_tokens * TOKEN_BYTES:
        return path
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab_size, size=n_tokens, dtype=np.uint16)
    return atomic_write(path, tokens.tobytes())


def check_token_file(path: str | os.PathLike, block_size: int) -> int:
    """Validate a token file for this block size; returns its token count."""
    p = Path(path)
    if not p.exists():
        raise GpuprofError(f"data file {p} does not exist")
    if not p.is_file():
        raise GpuprofError(f"data path {p} is not a file")
    size = p.stat().st_size
    n = size // TOKEN_BYTES
    if n < block_size + 1:
        raise GpuprofError(
            f"data file {p} holds {n} tokens; block_size {block_size} needs at least {block_size + 1}"
        )
    try:
        with open(p, "rb"):
            pass
    except OSError as exc:
        raise GpuprofError(f"cannot read data file {p}: {exc.strerror}") from None
    return n


@dataclass
class LoaderFaults:
    """Conditions injected into the loader (scenarios and tests; not a user option).

    read_latency_s: sleep per sample read (emulates a slow device's per-read latency).
    read_bandwidth_bytes_s: sleep bytes/bandwidth per sample (emulates a bandwidth cap).
    batch_delay_s: one sleep per micro-batch."""

    read_latency_s: float = 0.0
    read_bandwidth_bytes_s: float = 0.0
    batch_delay_s: float = 0.0

    def any(self) -> bool:
        return bool(self.read_latency_s or self.read_bandwidth_bytes_s or self.batch_delay_s)


class MemmapLoader:
    """nanoGPT's get_batch as an object. `timer` (optional) gets the host→device copy as `h2d`."""

    def __init__(self, path, batch_size: int, block_size: int, device: str,
                 pin_memory: bool = True, faults: LoaderFaults | None = None,
                 generator: torch.Generator | None = None, timer=None):
        self.path = str(path)
        self.n_tokens = check_token_file(path, block_size)
        self.batch_size = batch_size
        self.block_size = block_size
        self.device = device
        self.cuda = is_cuda(device)
        self.pin_memory = pin_memory and self.cuda
        self.faults = faults or LoaderFaults()
        self.generator = generator
        self.timer = timer
        # Host-to-device copies so far (CUDA): the h2d-pageable rule sizes its saving from these.
        self.copied = {"h2d_copies": 0, "h2d_bytes": 0, "h2d_pageable": 0, "h2d_pageable_bytes": 0}

    def get_batch(self):
        # A new memmap every call, as nanoGPT does, to avoid a memory leak
        # (https://stackoverflow.com/questions/45132940).
        data = np.memmap(self.path, dtype=np.uint16, mode="r")
        T = self.block_size
        ix = torch.randint(len(data) - T, (self.batch_size,), generator=self.generator)
        f = self.faults
        if f.any():
            per_read = f.read_latency_s
            if f.read_bandwidth_bytes_s:
                per_read += (T + 1) * TOKEN_BYTES / f.read_bandwidth_bytes_s
            time.sleep(f.batch_delay_s + per_read * self.batch_size)
        x = torch.stack([torch.from_numpy(data[i : i + T].astype(np.int64)) for i in ix.tolist()])
        y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + T].astype(np.int64)) for i in ix.tolist()])
        if self.timer is not None:
            with self.timer.phase("h2d"):
                return self._to_device(x, y)
        return self._to_device(x, y)

    def _to_device(self, x, y):
        if self.cuda:
            nbytes = x.numel() * x.element_size() + y.numel() * y.element_size()
            c = self.copied
            c["h2d_copies"] += 2
            c["h2d_bytes"] += nbytes
            if not self.pin_memory:
                c["h2d_pageable"] += 2
                c["h2d_pageable_bytes"] += nbytes
            if self.pin_memory:
                # Pinned host memory lets the copy run asynchronously (non_blocking).
                x = x.pin_memory().to(self.device, non_blocking=True)
                y = y.pin_memory().to(self.device, non_blocking=True)
            else:
                # Pageable memory: the copy is staged by the driver and blocks the host.
                x, y = x.to(self.device), y.to(self.device)
        else:
            x, y = x.to(self.device), y.to(self.device)
        return x, y
