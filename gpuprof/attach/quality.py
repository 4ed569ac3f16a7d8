"""How well the sampler could sample: its own view of how late a tick comes, and how busy the
host was, while py-spy records.

py-spy does not report per sample how late it was (its recorder warns only when it falls a
second behind). So gpuprof keeps a thread of its own at py-spy's niceness that sleeps to each
tick of the same rate and times how late it wakes: on a host whose cores the target fills, a
sampler's wake-ups come late during the target's compute, and a late sample lands later in the
target's step than it was due (the time the target sleeps or waits leaves a core free: late
samples land there). The host's CPU while sampling (psutil, all cores) says whether any core was
free. A sample late by more than one period can fall in another phase than the one it was due
in: that share of the ticks bounds how much of the time can be misattributed, and widens the
shares' stated interval (`systematic`).
"""

from __future__ import annotations

import os
import threading
import time

import psutil

from gpuprof.attach.gentle import at_start_priority
from gpuprof.stats import quantile


PROBE_MAX_HZ = 50  # the probe's own ticks: enough to see how late a wake-up comes, cheap to run


class SamplerQuality:
    """start(); ... stop() -> {ticks, late_share, late_ms: {p50, p95, max}, host_busy_cores,
    host_cores, saturated}. niceness: py-spy's (gpuprof.attach.pyspy.NICENESS). The probe wakes
    at most PROBE_MAX_HZ times a second; a wake-up later than the *sampler's* period (1/rate)
    counts as late."""

    def __init__(self, rate_hz: float, niceness: int = 0, clock=time.perf_counter):
        self.sampler_period = 1.0 / rate_hz
        self.period = 1.0 / min(rate_hz, PROBE_MAX_HZ)
        self.niceness = niceness
        self.clock = clock
        self._late: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuprof-sampler-quality", daemon=True)
        self._cpu0 = None

    def start(self) -> None:
        self._cpu0 = psutil.cpu_times()
        # created at py-spy's priority, whatever gpuprof's main thread's now (attach.gentle): a thread
        # inherits its creator's, and one cannot raise its own
        at_start_priority(self._thread.start)

    def _run(self) -> None:
        try:  # this thread alone (Linux: a thread id is a process id to setpriority)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.niceness)
        except (OSError, AttributeError):
            pass
        due = self.clock() + self.period
        while not self._stop.is_set():
            wait = due - self.clock()
            if wait > 0:
                time.sleep(wait)
            now = self.clock()
            self._late.append(max(0.0, now - due))
            due += self.period
            if now - due > self.period:  # fell behind: the next tick is the next one due from now
                due = now + self.period

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=2)
        late = list(self._late)
        out: dict = {"ticks": len(late), "period_ms": self.sampler_period * 1e3,
                     "late_share": (sum(1 for x in late if x > self.sampler_period) / len(late)) if late else None,
                     "late_ms": {"p50": _ms(quantile(late, 0.5)), "p95": _ms(quantile(late, 0.95)),
                                 "max": _ms(max(late) if late else None)}}
        try:
            t0, t1 = self._cpu0, psutil.cpu_times()
            busy = lambda t: t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + \
                getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0)  # noqa: E731
            total = sum(t1) - sum(t0)
            cores = psutil.cpu_count() or 1
            out["host_cores"] = cores
            out["host_busy_cores"] = (busy(t1) - busy(t0)) / total * cores if total > 0 else None
            out["saturated"] = (out["host_busy_cores"] is not None and out["host_busy_cores"] >= 0.9 * cores)
        except Exception:  # noqa: BLE001 - a reading, never the attach
            out["host_busy_cores"] = None
        return out


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1e3
