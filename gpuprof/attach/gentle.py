"""gpuprof's own work kept out of the way of the process it attaches to.

On a host whose cores the target fills, every CPU-second gpuprof spends while the target computes
is taken from the target: its imports before the window (~0.9 s of CPU), its polling during it,
parsing and analysing after it (~0.4 s). So `gpuprof attach`, run from the command line, lowers
the priority of its own main thread to GENTLE_NICE before anything heavy is imported
(gpuprof.console): that thread then runs when a core is idle (the target
sleeping in its data loading, waiting on the GPU). py-spy is another matter: a sampler that waits
for an idle core samples late and bunches its samples where the target sleeps (pyspy.NICENESS),
so it is started, with the sampler-quality probe that times py-spy's lateness, from a launcher
thread kept at the priority gpuprof was started with. Linux sets a nice value per thread, and a
thread or process inherits the one of the thread that creates it; elsewhere nothing changes.
Nothing here changes the target.

Only where the host has idle CPU for it: at the lowest priority on a host with no idle core, gpuprof
waits for one that never comes (a 5 s attach to a target filling both cores of a 2-core VM took
68 s, for the same ~1.6 s of CPU). So the host's idle cores are read first (/proc/stat over
IDLE_PROBE_S); under MIN_IDLE_CORES gpuprof keeps its priority, since the target then pays for
gpuprof's CPU whatever the priority, and the report states that cost (gpuprof.attach.cost).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Callable

GENTLE_NICE = 19
IDLE_PROBE_S = 0.3  # how long the host's idle CPU is read before choosing
MIN_IDLE_CORES = 0.25  # the idle CPU below which the lowest priority would starve gpuprof

_launcher: "_Launcher | None" = None
_choice: dict | None = None  # what be_gentle() read and chose, for the profile


class _Launcher:
    """A daemon thread at the priority gpuprof started with, running what it is given."""

    def __init__(self):
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="gpuprof-launcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            fn, done = self._jobs.get()
            try:
                done["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                done["error"] = exc
            done["event"].set()

    def run(self, fn: Callable):
        done = {"event": threading.Event()}
        self._jobs.put((fn, done))
        done["event"].wait()
        if "error" in done:
            raise done["error"]
        return done.get("value")


def _cpu_jiffies(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(idle incl. iowait, total) of the host's CPUs, in clock ticks; None where not readable."""
    try:
        with open(path) as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return fields[3] + fields[4], total


def idle_cores(seconds: float = IDLE_PROBE_S, sleep=None, read=_cpu_jiffies) -> float | None:
    """The host's idle CPU, in cores, over `seconds`; None where /proc/stat cannot be read."""
    a = read()
    (sleep or time.sleep)(seconds)
    b = read()
    if a is None or b is None or b[1] <= a[1]:
        return None
    return (b[0] - a[0]) / (b[1] - a[1]) * (os.cpu_count() or 1)


def choice() -> dict | None:
    """What be_gentle() read and decided ({idle_cores, gentle, nice, why}); None if not called."""
    return _choice


def be_gentle(idle: float | None | object = ...) -> bool:
    """Start the launcher at the current priority, then lower the calling thread's (the main
    thread's) to GENTLE_NICE, if the host has MIN_IDLE_CORES idle (read now unless given). False
    where it does not, or where per-thread priorities are not available."""
    global _launcher, _choice
    if _launcher is not None:
        return True
    if not (hasattr(os, "setpriority") and hasattr(threading, "get_native_id")):
        _choice = {"gentle": False, "why": "per-thread priorities not available here"}
        return False
    if idle is ...:
        idle = idle_cores()
    if idle is not None and idle < MIN_IDLE_CORES:
        _choice = {"gentle": False, "idle_cores": idle,
                   "why": (f"the host had {idle:.2f} idle cores (under {MIN_IDLE_CORES:g}): at the lowest priority "
                           "gpuprof would wait for a CPU for minutes, and the target pays for its CPU either way")}
        return False
    launcher = _Launcher()
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), GENTLE_NICE))
    except OSError:
        _choice = {"gentle": False, "idle_cores": idle, "why": "its priority could not be lowered"}
        return False
    _launcher = launcher
    _choice = {"gentle": True, "idle_cores": idle, "nice": GENTLE_NICE,
               "why": (f"gpuprof's own work at niceness {GENTLE_NICE}, on the host's idle CPU"
                       + (f" ({idle:.2f} cores idle as it started)" if idle is not None else ""))}
    return True


def at_start_priority(fn: Callable):
    """Run `fn` (start a process, a thread) at the priority gpuprof was started with: in the
    launcher thread when gpuprof lowered its own, else here."""
    return _launcher.run(fn) if _launcher is not None else fn()


def gentle() -> bool:
    """Whether gpuprof's main thread runs at GENTLE_NICE (be_gentle() took)."""
    return _launcher is not None
