"""The host sampler (psutil): the machine's CPU per core, this run's own CPU (this process and its
child processes) and the rest of the machine's, process RSS, bytes read, major page faults, and the
read throughput of the disk holding the data file, summarised overall and per phase. Like the NVML
sampler it never raises and reports its own sample count, cost and the samples it merged or dropped.

CPU figures are rates of raw counters over the interval between two samples, never a reading of
a library's "percent since the last call": an interval shorter than half the nominal one (a tick
right after start or after a starved one) carries too few 10 ms clock ticks to mean anything and
is merged into the next sample, and no figure leaves its physical bound (a core busy 0-100%, this
run's CPU at most the machine's cores): a sample that would is dropped and counted.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable

from gpuprof.measure.cpu_bounds import TICKS_OFF_PER_COUNTER, CpuRate, within_cores
from gpuprof.measure.os_counters import (TICK_S, core_counters, disk_for_path, major_faults,
                                         proc_children, whole_disks)
from gpuprof.measure.sampling import (PhaseLookup, _cfg_get, _err, _SamplerThread, _timeline,
                                      per_phase, stats)

__all__ = ["HOST_KEYS", "OWN_CPU_INCLUDES", "HostSampler", "disk_for_path"]

# --------------------------------------------------------------------------------------- host
HOST_KEYS = ["cpu_pct", "cpu_pct_max_core", "cpu_busy_cores", "own_cpu_cores", "proc_cpu_pct",
             "children_cpu_cores", "others_cpu_cores", "rss_bytes", "read_bytes_s", "read_chars_s",
             "major_faults_s", "disk_read_bytes_s", "disk_busy_pct"]

MERGE_BELOW = 0.5  # an interval shorter than this share of the nominal one merges into the next
OWN_CPU_INCLUDES = ("this process (all its threads: the training loop, torch's compute threads, the "
                    "samplers) and its descendant processes (DataLoader workers, compile workers), "
                    "live or exited and reaped during the run")


class HostSampler:
    """CPU % per core, this run's CPU and the other processes', process RSS/reads/major faults, and
    the data disk's reads (psutil) → measurements['host'].

    This run's own CPU is this process plus its descendant processes (OWN_CPU_INCLUDES); the
    others' is the machine's busy CPU minus it. All disks' counters are recorded; the data file's
    disk is chosen at stop(), when the run has said which file it read (a generated dataset is only
    known then). When that file has no block device (overlay, tmpfs, NFS), the sum over physical
    disks stands in, and the report says so.

    psutil_mod, pid: tests pass a fake psutil and its process. clock (nanoseconds), wait and
    threaded: the time source, as _SamplerThread takes it; the defaults (perf_counter_ns, the stop
    event's wait, a thread) are the production ones. With threaded=False no thread starts and the
    caller takes each sample with sample_now(), on the clock."""

    name = "host"

    def __init__(self, interval_s: float = 0.1, data_path: str | None = None, *, psutil_mod=None,
                 pid: int | None = None, clock: Callable[[], int] = time.perf_counter_ns,
                 wait: Callable[[float], bool] | None = None, threaded: bool = True):
        self.interval_s = interval_s
        self.data_path = data_path
        self._ps = psutil_mod
        self.pid = pid or os.getpid()
        # This process's CPU from its own CPU clock (nanoseconds, every thread, exited ones too) when
        # it is the sampled one and psutil is the real module; else psutil's tick counters.
        self._precise_self = psutil_mod is None and self.pid == os.getpid()
        self._thread = _SamplerThread(interval_s, self._tick, clock, first_after_interval=True,
                                      wait=wait, threaded=threaded)
        self._samples: list[tuple[int, dict]] = []
        self._disk_pairs: list[tuple[dict, dict, float]] = []  # per sample: disk counters before, after, dt
        self._prev: dict | None = None
        self._unreadable: dict[str, str] = {}
        self._reason: str | None = None
        self._per_core: list[list[float]] = []
        self._procs: dict = {}  # pid -> psutil.Process of a descendant, reused across ticks
        self._children_via_proc = False
        self.merged_short = 0
        self.dropped: dict[str, int] = {}
        self.own_carried = 0
        self.own_above_machine = 0
        self.descendants_max = 0

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
            self._proc.cpu_times()
        except Exception as exc:  # noqa: BLE001
            self._reason = f"psutil cannot read this process: {_err(exc)}"
            return
        self._children_via_proc = (self._precise_self
                                   and os.path.exists(f"/proc/{self.pid}/task/{self.pid}/children"))
        self._thread.align(ctx.timer)
        self._prev = self._counters()
        self._prev_t = self._thread.clock()
        own = self._prev["own"]
        self._self_rate = CpuRate(own[0] if own else 0.0)
        self._own_rate = CpuRate(own[0] + own[1] if own else 0.0)
        self._kids_hwm = own[1] if own else 0.0
        self._thread.start()

    def sample_now(self) -> None:
        """Take one sample now, on the clock, as the thread does each interval (never raises)."""
        if self._prev is not None:
            self._thread.tick_now()

    @property
    def sample_count(self) -> int:
        """Samples recorded so far (not those merged into the next or dropped)."""
        return len(self._samples)

    # ------------------------------------------------------------------------------ counters
    def _descendants(self) -> list:
        """Descendant processes, parents before their children (so a child reaped between two
        reads is never counted twice: once in its parent's children_* times and once itself)."""
        if not self._children_via_proc:
            return list(self._proc.children(recursive=True))
        out, queue, seen = [], [self.pid], {self.pid}
        while queue:
            for cpid in proc_children(queue.pop(0)):
                if cpid not in seen:
                    seen.add(cpid)
                    queue.append(cpid)
                    proc = self._procs.get(cpid)
                    if proc is None:
                        try:
                            proc = self._procs[cpid] = self._ps.Process(cpid)
                        except Exception:  # noqa: BLE001 - it exited already
                            continue
                    out.append(proc)
        for gone in set(self._procs) - seen:
            del self._procs[gone]
        return out

    def _own_cpu(self) -> tuple[float, float, int]:
        """(this process's CPU seconds, its children's CPU seconds, live descendants).

        The children's seconds are those of the children this process reaped (children_user/system)
        plus every live descendant's own and reaped ones: when a worker exits, its time leaves the
        live readings and enters this process's reaped times, so the sum stays continuous. The
        reaped times are read first, the descendants after, parents before children."""
        ct = self._proc.cpu_times()
        if self._precise_self:
            self_s = time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)
        else:
            self_s = ct.user + ct.system
        kids = getattr(ct, "children_user", 0.0) + getattr(ct, "children_system", 0.0)
        n = 0
        for proc in self._descendants():
            try:
                c = proc.cpu_times()
            except Exception:  # noqa: BLE001 - exited between listing and reading
                continue
            kids += c.user + c.system + getattr(c, "children_user", 0.0) + getattr(c, "children_system", 0.0)
            n += 1
        return self_s, kids, n

    def _counters(self) -> dict:
        c: dict = {"io": None, "disks": {}, "cores": None, "own": None}
        try:
            c["cores"] = [core_counters(t) for t in self._ps.cpu_times(percpu=True)]
        except Exception as exc:  # noqa: BLE001
            self._unreadable["cpu_times"] = _err(exc)
        try:
            c["own"] = self._own_cpu()
        except Exception as exc:  # noqa: BLE001
            self._unreadable["process_cpu_times"] = _err(exc)
        try:
            c["io"] = self._proc.io_counters()
        except Exception as exc:  # noqa: BLE001 - needs permissions on some OSes, absent on macOS
            self._unreadable["io_counters"] = _err(exc)
        try:
            disks = self._ps.disk_io_counters(perdisk=True) or {}
            c["disks"] = {k: (d.read_bytes, getattr(d, "busy_time", None)) for k, d in disks.items()}
        except Exception as exc:  # noqa: BLE001
            self._unreadable["disk_io_counters"] = _err(exc)
        c["majflt"] = major_faults(self.pid)
        if c["majflt"] is None:
            self._unreadable["major_faults"] = "no /proc/<pid>/stat (not Linux)"
        return c

    # --------------------------------------------------------------------------------- ticks
    def _own_method(self) -> str:
        this = "its CPU clock (ns)" if self._precise_self else "psutil cpu_times (clock ticks)"
        found = "/proc/<pid>/task/*/children" if self._children_via_proc else "psutil children(recursive=True)"
        return f"this process: {this}; descendants: found through {found}, read with psutil cpu_times"

    def _drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def _cpu(self, prev: dict, cur: dict, dt: float, v: dict) -> str | None:
        """Fill the CPU figures of one interval into `v`; the reason to drop the sample, or None."""
        reason = busy = None
        if prev["cores"] is not None and cur["cores"] is not None and len(prev["cores"]) == len(cur["cores"]):
            fracs = []
            for (b0, a0), (b1, a1) in zip(prev["cores"], cur["cores"]):
                d_all, d_busy = a1 - a0, b1 - b0
                if d_all <= 0 or d_busy < -1e-9 or d_busy > d_all + 1e-9:
                    reason = "core_busy_out_of_range"  # a counter that did not move or went backwards
                    break
                fracs.append(min(max(d_busy / d_all, 0.0), 1.0))  # min/max only absorb float rounding
            else:
                busy = sum(fracs)
                v["cpu_busy_cores"] = busy
                v["cpu_pct"] = busy / len(fracs) * 100.0
                v["cpu_pct_max_core"] = max(fracs) * 100.0
                v["_per_core"] = [f * 100.0 for f in fracs]
        own, cores = cur["own"], len(cur["cores"] or prev["cores"] or [])
        if own is None or not cores:
            return reason
        self_s, kids_s, n_desc = own
        self.descendants_max = max(self.descendants_max, n_desc)
        # A descendant that exits and is read neither live nor yet in its parent's reaped times makes
        # the sum dip for a sample: the high-water mark keeps its time from being counted twice when
        # it reappears.
        self._kids_hwm = max(self._kids_hwm, kids_s)
        own_s = self_s + self._kids_hwm
        tick_counters = n_desc + 1 + (0 if self._precise_self else 1)
        resolution_s = TICKS_OFF_PER_COUNTER * TICK_S * tick_counters
        p_self, s_self = self._self_rate.propose(self_s, dt, cores, resolution_s)
        p_own, s_own = self._own_rate.propose(own_s, dt, cores, resolution_s)
        if reason is None and "over" in (s_self, s_own):
            reason = "own_cpu_above_cores"
        if reason is not None:  # the interval is discarded: nothing of it is counted or carried
            self._self_rate.commit(self_s, None, dt)
            self._own_rate.commit(own_s, None, dt)
            return reason
        self._self_rate.commit(self_s, p_self, dt)
        self._own_rate.commit(own_s, p_own, dt)
        if "carried" in (s_self, s_own):
            self.own_carried += 1
        v["proc_cpu_pct"] = p_self * 100.0
        v["own_cpu_cores"] = p_own
        v["children_cpu_cores"] = max(0.0, p_own - p_self)  # max: float rounding only (own >= self)
        if busy is not None:
            if p_own > busy + 1e-9:
                # Two counters, 10 ms ticks each: this run's share can read above the machine's.
                self.own_above_machine += 1
            v["others_cpu_cores"] = max(0.0, busy - p_own)
        return None

    def _tick(self, t_ns: int) -> None:
        now = self._thread.clock()
        dt = (now - self._prev_t) / 1e9
        if dt < MERGE_BELOW * self.interval_s:
            # Too short to mean anything (a few clock ticks at most): leave the previous counters
            # in place, so the next sample covers this interval too.
            self.merged_short += 1
            return
        cur = self._counters()
        prev = self._prev
        self._prev, self._prev_t = cur, now
        v: dict = {}
        reason = self._cpu(prev, cur, dt, v)
        if reason is not None:
            self._drop(reason)
            return
        try:
            v["rss_bytes"] = self._proc.memory_info().rss
        except Exception as exc:  # noqa: BLE001
            self._unreadable["process"] = _err(exc)
        if cur["io"] is not None and prev["io"] is not None:
            v["read_bytes_s"] = (cur["io"].read_bytes - prev["io"].read_bytes) / dt
            if hasattr(cur["io"], "read_chars"):
                v["read_chars_s"] = (cur["io"].read_chars - prev["io"].read_chars) / dt
        if cur["majflt"] is not None and prev["majflt"] is not None:
            v["major_faults"] = cur["majflt"] - prev["majflt"]
            v["major_faults_s"] = v["major_faults"] / dt
        per_core = v.pop("_per_core", None)
        if per_core is not None:
            self._per_core.append(per_core)
        # Rates describe the interval that just ended: attribute them to its midpoint.
        self._samples.append((t_ns - int(dt * 1e9 / 2), v))
        self._disk_pairs.append((prev["disks"], cur["disks"], dt))

    def _disk_rates(self, names: list[str]) -> None:
        """Fill disk_read_bytes_s / disk_busy_pct of each sample from the raw counters of `names`."""
        for (a, b, dt), (_, v) in zip(self._disk_pairs, self._samples):
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
        seen = set().union(*(d.keys() for pair in self._disk_pairs for d in pair[:2])) if self._disk_pairs else set()
        seen |= set(self._prev["disks"])
        if disk is not None and disk not in seen:
            disk, disk_reason = None, f"{disk} is not in the kernel's disk statistics"
        names = [disk] if disk else whole_disks(sorted(seen))
        self._disk_rates(names)
        lookup = PhaseLookup.from_ctx(ctx)
        measured = [(t, v) for t, v in self._samples if lookup.phase(t) not in ("warmup", "outside")] or self._samples
        phases = per_phase(self._samples, lookup, HOST_KEYS + ["major_faults"])
        per_core = [statistics.fmean(c) for c in zip(*self._per_core)] if self._per_core else None
        cores = self._prev["cores"]
        t = self._thread
        return within_cores({
            "available": True, "reason": None, "interval_s": self.interval_s,
            "samples": len(self._samples), "ticks": t.ticks, "late_ticks": t.late, "errors": t.errors,
            "last_error": t.last_error, "merged_short": self.merged_short, "dropped": dict(self.dropped),
            "own_cpu_carried": self.own_carried, "own_above_machine": self.own_above_machine,
            "unreadable": dict(self._unreadable), "cost": t.cost(),
            "data_path": path, "disk": disk if disk else ("all:" + ",".join(names) if names else None),
            "disk_reason": disk_reason,
            "cpu_count": len(cores) if cores else None,
            "cpu_pct_per_core_mean": per_core,
            "own_cpu_includes": OWN_CPU_INCLUDES,
            "own_cpu_method": self._own_method(),
            "descendants_max": self.descendants_max,
            "major_faults_total": sum(v.get("major_faults", 0) for _, v in measured),
            "summary": {k: stats([v.get(k) for _, v in measured]) for k in HOST_KEYS},
            "phases": phases,
            "timeline": _timeline(self._samples, HOST_KEYS),
        })
