"""Time-based read measurements on an open file. Plain results, no printing.

Each function runs for `duration_s` of its clock (injectable: tests pass a fake one) and
returns a RunResult with per-operation latencies. Threads doing os.preadv release the GIL
during the syscall, so N threads keep N reads in flight (fio's numjobs=N, psync engine).
"""

from __future__ import annotations

import mmap
import os
import resource
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import psutil

from gpuprof.disk.fs import aligned_buffer
from gpuprof.errors import GpuprofError
from gpuprof.stats import median, quantile
from gpuprof.units import MiB

Clock = Callable[[], float]
TOKEN_BYTES = 2  # nanoGPT stores GPT-2 tokens as uint16
_OFFSET_CHUNK = 8192  # random offsets drawn per numpy call


@dataclass
class RunResult:
    """One timed run. latencies_s has one entry per read (per sample for the loader)."""

    ops: int
    bytes: int
    elapsed_s: float
    latencies_s: np.ndarray = field(repr=False)
    device_read_bytes: int | None = None
    major_faults: int | None = None

    @property
    def iops(self) -> float:
        return self.ops / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mb_s(self) -> float:
        return self.bytes / self.elapsed_s / 1e6 if self.elapsed_s > 0 else 0.0


def _io_read_bytes() -> int | None:
    """Bytes this process caused to be fetched from storage (/proc/self/io read_bytes)."""
    try:
        return int(psutil.Process().io_counters().read_bytes)
    except (AttributeError, psutil.Error, OSError):
        return None


def _major_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def check_read(n: int, want: int, offset: int) -> None:
    if n != want:
        raise GpuprofError(f"short read at offset {offset}: got {n} of {want} bytes "
                           "(was the file truncated while measuring?)")


def read_sequential(fd: int, span: int, block: int, duration_s: float,
                    clock: Clock = time.perf_counter,
                    on_wrap: Callable[[], None] | None = None, first_block: int = 0,
                    max_blocks: int | None = None) -> RunResult:
    """Read [0, span) in `block`-byte reads from block `first_block` on, wrapping around, for
    duration_s or until `max_blocks` reads, whichever comes first.

    max_blocks bounds a cold run to its own share of the file, so no byte is read twice (a
    cache below the machine would answer the second read). on_wrap runs (untimed) each time
    the reads wrap to the start: the fadvise method evicts there so a second pass is cold too.
    """
    buf = aligned_buffer(block)
    view = memoryview(buf)[:block]
    nblocks = span // block
    if nblocks < 1:
        raise GpuprofError(f"file too small for {block}-byte sequential reads")
    lat: list[float] = []
    paused = 0.0
    i = first_block % nblocks
    start = clock()
    deadline = start + duration_s
    now = start
    while now - paused < deadline and (max_blocks is None or len(lat) < max_blocks):
        if i == nblocks:
            i = 0
            if on_wrap is not None:
                p0 = clock()
                on_wrap()
                paused += clock() - p0
        off = i * block
        t0 = clock()
        n = os.preadv(fd, [view], off)
        now = clock()
        check_read(n, block, off)
        lat.append(now - t0)
        i += 1
    view.release()
    buf.close()
    return RunResult(len(lat), len(lat) * block, now - start - paused, np.asarray(lat))


def random_offsets(rng: np.random.Generator, span: int, size: int, align: int,
                   count: int = _OFFSET_CHUNK) -> list[int]:
    """`count` random offsets, multiples of `align`, with offset + size <= span."""
    slots = (span - size) // align + 1
    return (rng.integers(0, slots, size=count, dtype=np.int64) * align).tolist()


def _random_worker(fd: int, span: int, size: int, align: int, rng: np.random.Generator,
                   clock: Clock, deadline_of: Callable[[], float], stop: threading.Event,
                   out: dict) -> None:
    buf = aligned_buffer(size)
    view = memoryview(buf)[:size]
    lat: list[float] = []
    try:
        deadline = deadline_of()
        now = clock()
        while now < deadline and not stop.is_set():
            for off in random_offsets(rng, span, size, align):
                t0 = clock()
                n = os.preadv(fd, [view], off)
                now = clock()
                if n != size:
                    check_read(n, size, off)
                lat.append(now - t0)
                if now >= deadline:
                    break
        out["lat"] = lat
        out["end"] = now
    except BaseException as exc:  # re-raised in the calling thread
        out["error"] = exc
    finally:
        view.release()
        buf.close()


def read_random(fd: int, span: int, size: int, align: int, duration_s: float,
                readers: int = 1, seed: int | None = None,
                clock: Clock = time.perf_counter) -> RunResult:
    """Random `size`-byte reads at `align`-aligned offsets in [0, span), one per reader.

    readers=1 runs in this thread (one outstanding read, like nanoGPT's get_batch);
    readers>1 starts that many threads, each with one read in flight.
    """
    if span < size:
        raise GpuprofError(f"file too small for {size}-byte random reads")
    seeds = np.random.SeedSequence(seed).spawn(readers)
    rngs = [np.random.default_rng(s) for s in seeds]
    io0 = _io_read_bytes()
    if readers == 1:
        start = clock()
        out: dict = {}
        _random_worker(fd, span, size, align, rngs[0], clock, lambda: start + duration_s,
                       threading.Event(), out)
        if "error" in out:
            raise out["error"]
        lat = np.asarray(out["lat"])
        elapsed = out["end"] - start
    else:
        stop = threading.Event()
        state = {}
        # The barrier's action runs once, when every reader is ready: all start together.
        barrier = threading.Barrier(readers, action=lambda: state.update(start=clock()))

        def deadline_of() -> float:
            barrier.wait()
            return state["start"] + duration_s

        outs = [{} for _ in range(readers)]
        threads = [threading.Thread(target=_random_worker, daemon=True, name=f"reader-{k}",
                                    args=(fd, span, size, align, rngs[k], clock, deadline_of,
                                          stop, outs[k]))
                   for k in range(readers)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():  # short joins keep Ctrl-C deliverable
                    t.join(0.05)
        finally:
            stop.set()
            barrier.abort()
            for t in threads:
                t.join()
        for o in outs:
            if "error" in o and not isinstance(o["error"], threading.BrokenBarrierError):
                raise o["error"]
        lat = np.concatenate([np.asarray(o.get("lat", []), dtype=float) for o in outs])
        elapsed = max(o["end"] for o in outs) - state["start"]
    io1 = _io_read_bytes()
    dev = io1 - io0 if io0 is not None and io1 is not None else None
    return RunResult(len(lat), len(lat) * size, elapsed, lat, device_read_bytes=dev)


def read_loader(path: str, span: int, block_size: int, batch_size: int, duration_s: float,
                seed: int | None = None, clock: Clock = time.perf_counter,
                before_sample: Callable[[], None] | None = None) -> RunResult:
    """nanoGPT's get_batch, timed: a new np.memmap per batch, `batch_size` random token
    offsets, x = data[i:i+T], y = data[i+1:i+1+T] (T+1 tokens per sample), astype(int64).

    before_sample runs untimed before each sample (the cold run evicts the file there, so
    every sample pays a cold read). Latencies are per sample (two slices + astype); the
    elapsed time also holds memmap creation and stacking. Returns the bytes this process
    read from the device and its major page faults; ops counts samples and bytes counts
    the useful (T+1)*2 bytes each.
    """
    ntok = span // TOKEN_BYTES
    if ntok <= block_size + 1:
        raise GpuprofError(f"file too small for samples of {block_size + 1} tokens")
    rng = np.random.default_rng(seed)
    lat: list[float] = []
    paused = 0.0
    io0, f0 = _io_read_bytes(), _major_faults()
    start = clock()
    deadline = start + duration_s
    now = start
    while now - paused < deadline:
        data = np.memmap(path, dtype=np.uint16, mode="r", shape=(ntok,))
        ix = rng.integers(0, ntok - block_size, size=batch_size)
        xs, ys = [], []
        for i in ix:
            if before_sample is not None:
                p0 = clock()
                mm = getattr(data, "_mmap", None)
                if mm is not None and hasattr(mm, "madvise"):
                    # Unmap what earlier samples mapped: mapped pages (whole large folios)
                    # cannot be evicted, and would make this sample a hit.
                    mm.madvise(mmap.MADV_DONTNEED)
                before_sample()
                paused += clock() - p0
            s0 = clock()
            xs.append(data[i:i + block_size].astype(np.int64))
            ys.append(data[i + 1:i + 1 + block_size].astype(np.int64))
            lat.append(clock() - s0)
        np.stack(xs), np.stack(ys)
        del data, xs, ys
        now = clock()
    io1, f1 = _io_read_bytes(), _major_faults()
    sample = (block_size + 1) * TOKEN_BYTES
    dev = io1 - io0 if io0 is not None and io1 is not None else None
    return RunResult(len(lat), len(lat) * sample, now - start - paused, np.asarray(lat),
                     device_read_bytes=dev, major_faults=f1 - f0)


def warm(fd: int, span: int, block: int = MiB) -> None:
    """Read [0, span) once through the page cache so later buffered reads hit memory."""
    buf = bytearray(block)
    view = memoryview(buf)
    off = 0
    while off < span:
        n = os.preadv(fd, [view[:min(block, span - off)]], off)
        if n <= 0:
            break
        off += n


def summarize(values: list[float]) -> dict:
    """Median and spread of repeated runs: {median, runs, spread_pct = (max-min)/median}."""
    arr = np.asarray(values, dtype=float)
    med = median(arr) if len(arr) else 0.0
    spread = float((arr.max() - arr.min()) / med * 100) if len(arr) and med > 0 else 0.0
    return {"median": med, "runs": [float(v) for v in arr], "spread_pct": spread}


def latency_ms(lat: np.ndarray) -> dict:
    """p50/p99 (ms) of pooled per-operation latencies."""
    if len(lat) == 0:
        return {"p50_ms": None, "p99_ms": None}
    return {"p50_ms": quantile(lat, 0.5) * 1e3, "p99_ms": quantile(lat, 0.99) * 1e3}


__all__ = ["RunResult", "check_read", "read_sequential", "read_random", "read_loader", "warm",
           "summarize", "latency_ms", "random_offsets", "TOKEN_BYTES"]
