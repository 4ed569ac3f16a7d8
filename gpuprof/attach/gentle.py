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
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Callable

GENTLE_NICE = 19

_launcher: "_Launcher | None" = None


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


def be_gentle() -> bool:
    """Start the launcher at the current priority, then lower the calling thread's (the main
    thread's) to GENTLE_NICE. False where per-thread priorities are not available."""
    global _launcher
    if _launcher is not None:
        return True
    if not (hasattr(os, "setpriority") and hasattr(threading, "get_native_id")):
        return False
    launcher = _Launcher()
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), GENTLE_NICE))
    except OSError:
        return False
    _launcher = launcher
    return True


def at_start_priority(fn: Callable):
    """Run `fn` (start a process, a thread) at the priority gpuprof was started with: in the
    launcher thread when gpuprof lowered its own, else here."""
    return _launcher.run(fn) if _launcher is not None else fn()


def gentle() -> bool:
    """Whether gpuprof's main thread runs at GENTLE_NICE (be_gentle() took)."""
    return _launcher is not None
