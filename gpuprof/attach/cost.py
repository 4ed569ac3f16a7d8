"""What attaching costs the target, from the target's own counters: how long its threads waited
for a CPU (Linux's /proc/PID/task/TID/schedstat: time on a CPU, time runnable but waiting for
one) in a short window before sampling, and while sampled. Every CPU-second py-spy and gpuprof
take while the target could have run shows there as the target's threads waiting; what other
processes take shows in both windows alike. Sums over the target's threads (those alive in both
readings): the threads of one step may wait at the same moment, so the share of the target's time
it stands for is an upper bound on what its step lost.
"""

from __future__ import annotations

import time

from gpuprof.measure.os_counters import thread_files

BEFORE_S = 2.0  # the window before sampling: the target's waits with gpuprof idle


def read(pid: int) -> dict[int, tuple[int, int]] | None:
    """tid -> (ns on a CPU, ns waiting for one); None where schedstat cannot be read."""
    out = {}
    for tid, text in (thread_files(pid, "schedstat") or {}).items():
        try:
            run, wait, *_ = text.split()
            out[tid] = (int(run), int(wait))
        except ValueError:
            continue
    return out or None


def rates(a: dict | None, b: dict | None, seconds: float) -> dict | None:
    """CPU (cores) and waiting (seconds per second) between two readings, over the threads in both."""
    if not a or not b or seconds <= 0:
        return None
    common = set(a) & set(b)
    run = sum(b[t][0] - a[t][0] for t in common) / 1e9
    wait = sum(b[t][1] - a[t][1] for t in common) / 1e9
    return {"seconds": seconds, "threads": len(common), "cpu_cores": run / seconds, "wait_s_per_s": wait / seconds}


class CostWatch:
    """before(): a BEFORE_S reading with gpuprof idle (call just before sampling starts); start()
    at the sampling's start; stop() at its end -> {before, during, added_wait_s_per_s, method}."""

    def __init__(self, pid: int, clock=time.monotonic, sleep=time.sleep):
        self.pid, self._clock, self._sleep = pid, clock, sleep
        self._before: dict | None = None
        self._r1 = self._t1 = None

    def before(self, seconds: float = BEFORE_S) -> None:
        r0, t0 = read(self.pid), self._clock()
        self._sleep(seconds)
        self._before = rates(r0, read(self.pid), self._clock() - t0)

    def start(self) -> None:
        self._r1, self._t1 = read(self.pid), self._clock()

    def stop(self) -> dict:
        during = rates(self._r1, read(self.pid), self._clock() - self._t1) if self._t1 is not None else None
        out = {"method": ("the target's threads' time waiting for a CPU (/proc/PID/task/*/schedstat), per second, "
                          f"in {BEFORE_S:g} s before sampling (gpuprof idle) and while sampled; summed over its "
                          "threads, so an upper bound on the share of its time lost"),
               "before": self._before, "during": during}
        if self._before and during:
            out["added_wait_s_per_s"] = max(0.0, during["wait_s_per_s"] - self._before["wait_s_per_s"])
        else:
            out["not_measured"] = "schedstat not readable (not Linux, or the target ended)"
        return out
