"""What the host and the GPU did over each window of a watched run, with memory bounded however
long it runs.

- WindowCounters: the host over one window, as rates of raw counters between two reads (one read
  at each window's close, on the training thread: ~1 ms, no thread of its own): this run's CPU
  (this process and its descendants), the other processes', the process's reads from storage and
  through read(), its resident memory, major page faults, and the child processes that started
  (DataLoader workers respawned at an epoch boundary show as new PIDs).
- FirstOpens: the files this process opened for the first time, with when (Python's audit hook,
  as gpuprof.measure.opened sees them): a loader that moved to a new shard, or to another
  filesystem.
- BoundedHost, BoundedNvml: diagnose's samplers (gpuprof.measure.host, .nvml) for the final
  report, keeping at most MAX_SAMPLES samples (every other one is dropped when full: an even
  thinning over the whole run); BoundedNvml also hands each window its own samples.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import deque

from gpuprof.measure.host import HostSampler
from gpuprof.measure.nvml import NvmlSampler, decode_throttle
from gpuprof.measure.opened import OpenedFiles
from gpuprof.measure.os_counters import core_counters, major_faults, proc_children

SAMPLE_S = 0.5  # the host and NVML samplers' period under watch (diagnose: 0.1 s)
MAX_SAMPLES = 1024  # 10 samples per second fill it in ~100 s; then an even thinning of the whole run
MAX_NEW_FILES = 20  # per window: the first ones, and how many more


class WindowCounters:
    """read() -> the host's figures since the previous read (the first read only starts)."""

    def __init__(self, pid: int | None = None, psutil_mod=None, clock=time.monotonic):
        self.pid = pid or os.getpid()
        self._ps = psutil_mod
        self._clock = clock
        self._prev: dict | None = None
        self._children: set[int] = set()
        self.unavailable: str | None = None

    def start(self) -> None:
        if self._ps is None:
            try:
                import psutil
            except ImportError:
                self.unavailable = "psutil is not installed"
                return
            self._ps = psutil
        try:
            self._proc = self._ps.Process(self.pid)
            self._prev = self._read()
        except Exception as exc:  # noqa: BLE001 - a sampler never ends the run
            self.unavailable = f"psutil cannot read this process: {exc.__class__.__name__}: {exc}"
        self._children = set(self._descendants())

    def _descendants(self) -> list[int]:
        out, queue = [], [self.pid]
        while queue and len(out) < 4096:
            for c in proc_children(queue.pop()):
                out.append(c)
                queue.append(c)
        return out

    def _read(self) -> dict:
        c: dict = {"t": self._clock()}
        ct = self._proc.cpu_times()
        own = ct.user + ct.system + getattr(ct, "children_user", 0.0) + getattr(ct, "children_system", 0.0)
        for pid in self._descendants():
            try:
                t = self._ps.Process(pid).cpu_times()
                own += t.user + t.system
            except Exception:  # noqa: BLE001 - it exited meanwhile
                continue
        c["own_cpu_s"] = own
        try:
            cores = [core_counters(t) for t in self._ps.cpu_times(percpu=True)]
            c["busy_s"], c["total_s"], c["cores"] = (sum(b for b, _ in cores), sum(a for _, a in cores),
                                                     len(cores))
        except Exception:  # noqa: BLE001
            pass
        try:
            io = self._proc.io_counters()
            c["read_bytes"], c["read_chars"] = io.read_bytes, getattr(io, "read_chars", None)
        except Exception:  # noqa: BLE001 - needs permissions on some systems
            pass
        try:
            c["rss_bytes"] = self._proc.memory_info().rss
        except Exception:  # noqa: BLE001
            pass
        c["majflt"] = major_faults(self.pid)
        return c

    def read(self) -> dict:
        """{"seconds", "own_cpu_cores", "others_cpu_cores", "cpu_busy_cores", "cpu_count",
        "read_bytes_s", "read_chars_s", "rss_bytes", "major_faults_s", "children",
        "children_started"}; {"not_measured": why} without psutil."""
        if self._prev is None:
            return {"not_measured": self.unavailable or "not started"}
        try:
            cur = self._read()
        except Exception as exc:  # noqa: BLE001
            return {"not_measured": f"{exc.__class__.__name__}: {exc}"}
        prev, self._prev = self._prev, cur
        dt = cur["t"] - prev["t"]
        out: dict = {"seconds": dt}
        if dt <= 0:
            return out
        own = max(0.0, (cur["own_cpu_s"] - prev["own_cpu_s"]) / dt)
        if "cores" in cur:  # known whether or not the kernel's CPU times moved since the last read
            out["cpu_count"] = cur["cores"]
        if "total_s" in cur and "total_s" in prev and cur["total_s"] > prev["total_s"]:
            busy = (cur["busy_s"] - prev["busy_s"]) / (cur["total_s"] - prev["total_s"]) * cur["cores"]
            busy = min(max(busy, 0.0), float(cur["cores"]))
            own = min(own, float(cur["cores"]))
            out.update(cpu_busy_cores=busy, others_cpu_cores=max(0.0, busy - own))
        out["own_cpu_cores"] = own
        for key, name in (("read_bytes", "read_bytes_s"), ("read_chars", "read_chars_s"), ("majflt", "major_faults_s")):
            if cur.get(key) is not None and prev.get(key) is not None:
                out[name] = max(0.0, (cur[key] - prev[key]) / dt)
        if cur.get("rss_bytes") is not None:
            out["rss_bytes"] = cur["rss_bytes"]
        kids = set(self._descendants())
        out["children"] = len(kids)
        out["children_started"] = len(kids - self._children)
        self._children = kids
        return out


class FirstOpens(OpenedFiles):
    """`with FirstOpens() as f:` — each path opened for the first time, with the monotonic time;
    `take()` hands over (and forgets) those since the last take. The set of paths seen is bounded
    by OpenedFiles' limit."""

    def __init__(self, clock=time.monotonic):
        super().__init__()
        self._clock = clock
        self._new: deque = deque(maxlen=MAX_NEW_FILES)
        self._more = 0

    def add(self, path: str) -> None:
        if path in self.paths:
            return
        before = len(self.paths)
        super().add(path)
        if len(self.paths) > before:
            if len(self._new) == self._new.maxlen:
                self._more += 1
            self._new.append((self._clock(), path))

    def take(self) -> tuple[list[tuple[float, str]], int]:
        new, more = list(self._new), self._more
        self._new.clear()
        self._more = 0
        return new, more


def _thin(*lists: list) -> None:
    """Every other element dropped from each list, in place (the same positions in each)."""
    for xs in lists:
        xs[:] = xs[::2]


class BoundedHost(HostSampler):
    """diagnose's host sampler with at most MAX_SAMPLES samples kept (thinned by 2 when full)."""

    cap = MAX_SAMPLES

    def _tick(self, t_ns: int) -> None:
        super()._tick(t_ns)
        if len(self._samples) > self.cap:
            _thin(self._samples, self._disk_pairs)  # appended together: thinned together
        if len(self._per_core) > self.cap:
            _thin(self._per_core)


class BoundedNvml(NvmlSampler):
    """diagnose's NVML sampler with at most MAX_SAMPLES samples kept per GPU (thinned by 2 when
    full), handing each window the samples taken during it (`take_window`)."""

    cap = MAX_SAMPLES

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._window: deque = deque(maxlen=MAX_SAMPLES)

    def _tick(self, t_ns: int) -> None:
        super()._tick(t_ns)
        if self._samples and self._samples[0]:
            self._window.append(self._samples[0][-1][1])
        for s in self._samples:
            if len(s) > self.cap:
                _thin(s)

    def take_window(self) -> list[dict]:
        out = []
        while self._window:
            out.append(self._window.popleft())
        return out


def nvml_window(samples: list[dict], reason: str | None = None) -> dict:
    """A window's GPU figures from its NVML samples: utilisation, SM clock, temperature, memory
    used, power (means, and the extremes that matter), and each throttle reason's share of the
    samples; {"not_measured": reason} without samples."""
    if not samples:
        return {"not_measured": reason or "no NVML sample in this window"}

    def vals(k):
        return [s[k] for s in samples if s.get(k) is not None]

    out: dict = {"samples": len(samples)}
    for k, how in (("gpu_util_pct", "mean"), ("mem_util_pct", "mean"), ("sm_clock_mhz", "mean"),
                   ("sm_clock_share", "mean"), ("power_w", "mean"), ("temp_c", "max"), ("mem_used_bytes", "max")):
        xs = vals(k)
        out[k] = (statistics.fmean(xs) if how == "mean" else max(xs)) if xs else None
    masks = vals("throttle_mask")
    if masks:
        counts: dict[str, int] = {}
        for m in masks:
            for r in decode_throttle(int(m)):
                counts[r] = counts.get(r, 0) + 1
        out["throttle_share"] = {r: c / len(masks) for r, c in sorted(counts.items())}
    else:
        out["throttle_share"] = None
    return out


def bounded_instruments(instruments: list) -> list:
    """diagnose's instruments with its host and NVML samplers swapped for the bounded ones, reading
    every SAMPLE_S (at least diagnose's period)."""
    out = []
    for inst in instruments:
        if type(inst) is HostSampler:
            inst = BoundedHost(max(SAMPLE_S, inst.interval_s), inst.data_path)
        elif type(inst) is NvmlSampler:
            inst = BoundedNvml(max(SAMPLE_S, inst.interval_s), pcie_every=inst.pcie_every)
        out.append(inst)
    return out
