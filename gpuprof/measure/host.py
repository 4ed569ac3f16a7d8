"""The host sampler (psutil): CPU per core, process RSS, bytes read, major page faults, and the
read throughput of the disk holding the data file, summarised overall and per phase. Like the
NVML sampler it never raises and reports its own sample count and cost.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable

from gpuprof.measure.sampling import (PhaseLookup, _cfg_get, _err, _SamplerThread, _timeline,
                                      per_phase, stats)

# --------------------------------------------------------------------------------------- host
HOST_KEYS = ["cpu_pct", "cpu_pct_max_core", "proc_cpu_pct", "rss_bytes", "read_bytes_s",
             "read_chars_s", "major_faults_s", "disk_read_bytes_s", "disk_busy_pct"]


def disk_for_path(path: str | None) -> tuple[str | None, str | None]:
    """(block device name as psutil.disk_io_counters(perdisk=True) knows it, reason if None)."""
    if not path:
        return None, "no data file known"
    try:
        st = os.stat(path)
    except OSError as exc:
        return None, f"cannot stat {path}: {exc.strerror}"
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    if major == 0:
        return None, "the data file is on a filesystem without a block device (overlay, tmpfs, network)"
    sys_link = f"/sys/dev/block/{major}:{minor}"
    if not os.path.exists(sys_link):
        return None, f"no {sys_link} (not Linux?)"
    return os.path.basename(os.path.realpath(sys_link)), None


def _whole_disks(names) -> list[str]:
    """Physical whole disks among psutil's per-disk names (no partitions, loop, ram, zram)."""
    out = []
    for n in names:
        if n.startswith(("loop", "ram", "zram", "dm-", "md")):
            continue
        if os.path.exists(f"/sys/block/{n}") or not os.path.exists("/sys/block"):
            out.append(n)
    return out


def _major_faults(pid: int) -> int | None:
    """Major page faults of the process from /proc/<pid>/stat (Linux), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[9])  # field 12 (majflt); `rest` starts at field 3
    except (OSError, IndexError, ValueError):
        return None


class HostSampler:
    """CPU % per core, process CPU/RSS/reads/major faults, and the data disk's reads (psutil)
    → measurements['host'].

    All disks' counters are recorded; the data file's disk is chosen at stop(), when the run has
    said which file it read (a generated dataset is only known then). When that file has no block
    device (overlay, tmpfs, NFS), the sum over physical disks stands in, and the report says so."""

    name = "host"

    def __init__(self, interval_s: float = 0.1, data_path: str | None = None, *, psutil_mod=None,
                 pid: int | None = None, clock: Callable[[], int] = time.perf_counter_ns):
        self.interval_s = interval_s
        self.data_path = data_path
        self._ps = psutil_mod
        self.pid = pid or os.getpid()
        self._thread = _SamplerThread(interval_s, self._tick, clock)
        self._samples: list[tuple[int, dict]] = []
        self._disk_raw: list[tuple[int, dict]] = []  # (t_ns end of interval, {disk: (read_bytes, busy_ms)})
        self._prev: dict | None = None
        self._unreadable: dict[str, str] = {}
        self._reason: str | None = None
        self._per_core: list[list[float]] = []

    def start(self, ctx) -> None:
        if self._ps is None:
            try:
                import psutil
            except ImportError:
                self._reason = "psutil is not installed"
                return
            self._ps = psutil
        try:
            self._proc = self._ps.Process(self.pid)
            self._proc.cpu_percent(None)  # prime: the first call has no interval
            self._ps.cpu_percent(percpu=True)
        except Exception as exc:  # noqa: BLE001
            self._reason = f"psutil cannot read this process: {_err(exc)}"
            return
        self._thread.align(ctx.timer)
        self._prev = self._counters()
        self._prev_t = self._thread.clock()
        self._disk_raw.append((self._prev_t - self._thread.origin_ns, self._prev["disks"]))
        self._thread.start()

    def _counters(self) -> dict:
        c: dict = {"io": None, "disks": {}}
        try:
            c["io"] = self._proc.io_counters()
        except Exception as exc:  # noqa: BLE001 - needs permissions on some OSes, absent on macOS
            self._unreadable["io_counters"] = _err(exc)
        try:
            disks = self._ps.disk_io_counters(perdisk=True) or {}
            c["disks"] = {k: (d.read_bytes, getattr(d, "busy_time", None)) for k, d in disks.items()}
        except Exception as exc:  # noqa: BLE001
            self._unreadable["disk_io_counters"] = _err(exc)
        c["majflt"] = _major_faults(self.pid)
        if c["majflt"] is None:
            self._unreadable["major_faults"] = "no /proc/<pid>/stat (not Linux)"
        return c

    def _tick(self, t_ns: int) -> None:
        now = self._thread.clock()
        dt = max((now - self._prev_t) / 1e9, 1e-9)
        v: dict = {}
        try:
            cores = self._ps.cpu_percent(percpu=True)
            v["cpu_pct"] = sum(cores) / len(cores) if cores else None
            v["cpu_pct_max_core"] = max(cores) if cores else None
            self._per_core.append(list(cores))
        except Exception as exc:  # noqa: BLE001
            self._unreadable["cpu_percent"] = _err(exc)
        try:
            v["proc_cpu_pct"] = self._proc.cpu_percent(None)
            v["rss_bytes"] = self._proc.memory_info().rss
        except Exception as exc:  # noqa: BLE001
            self._unreadable["process"] = _err(exc)
        cur = self._counters()
        prev = self._prev
        if cur["io"] is not None and prev["io"] is not None:
            v["read_bytes_s"] = (cur["io"].read_bytes - prev["io"].read_bytes) / dt
            if hasattr(cur["io"], "read_chars"):
                v["read_chars_s"] = (cur["io"].read_chars - prev["io"].read_chars) / dt
        if cur["majflt"] is not None and prev["majflt"] is not None:
            v["major_faults"] = cur["majflt"] - prev["majflt"]
            v["major_faults_s"] = v["major_faults"] / dt
        self._prev, self._prev_t = cur, now
        # Rates describe the interval that just ended: attribute them to its midpoint.
        self._samples.append((t_ns - int(dt * 1e9 / 2), v))
        self._disk_raw.append((t_ns, cur["disks"]))

    def _disk_rates(self, names: list[str]) -> None:
        """Fill disk_read_bytes_s / disk_busy_pct of each sample from the raw counters of `names`."""
        for (t0, a), (t1, b), (_, v) in zip(self._disk_raw, self._disk_raw[1:], self._samples):
            dt = max((t1 - t0) / 1e9, 1e-9)
            rb = [b[n][0] - a[n][0] for n in names if n in a and n in b]
            if rb:
                v["disk_read_bytes_s"] = sum(rb) / dt
            busy = [b[n][1] - a[n][1] for n in names if n in a and n in b and a[n][1] is not None]
            if busy:  # Linux: ms the device was busy; with several disks, the busiest
                v["disk_busy_pct"] = min(100.0, max(busy) / 10.0 / dt)

    def stop(self, ctx) -> dict | None:
        if self._prev is None:
            return {"available": False, "reason": self._reason, "samples": 0}
        self._thread.stop()
        path = self.data_path
        if path is None:
            run = getattr(getattr(ctx, "profile", None), "run", None) or {}
            path = run.get("data_path") or _cfg_get(ctx.config, "data")
        disk, disk_reason = disk_for_path(path)
        seen = set().union(*(d.keys() for _, d in self._disk_raw)) if self._disk_raw else set()
        if disk is not None and disk not in seen:
            disk, disk_reason = None, f"{disk} is not in the kernel's disk statistics"
        names = [disk] if disk else _whole_disks(sorted(seen))
        self._disk_rates(names)
        lookup = PhaseLookup.from_ctx(ctx)
        measured = [(t, v) for t, v in self._samples if lookup.phase(t) not in ("warmup", "outside")] or self._samples
        phases = per_phase(self._samples, lookup, HOST_KEYS + ["major_faults"])
        per_core = [statistics.fmean(c) for c in zip(*self._per_core)] if self._per_core else None
        t = self._thread
        return {
            "available": True, "reason": None, "interval_s": self.interval_s,
            "samples": t.ticks, "late_ticks": t.late, "errors": t.errors, "last_error": t.last_error,
            "unreadable": dict(self._unreadable), "cost": t.cost(),
            "data_path": path, "disk": disk if disk else ("all:" + ",".join(names) if names else None),
            "disk_reason": disk_reason,
            "cpu_count": len(per_core) if per_core else None,
            "cpu_pct_per_core_mean": per_core,
            "major_faults_total": sum(v.get("major_faults", 0) for _, v in measured),
            "summary": {k: stats([v.get(k) for _, v in measured]) for k in HOST_KEYS},
            "phases": phases,
            "timeline": _timeline(self._samples, HOST_KEYS),
        }
