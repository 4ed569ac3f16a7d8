"""An in-process stack sampler: which of the user's own functions the training thread is in.

A daemon thread wakes every `interval_s`, reads the target thread's current frame through
`sys._current_frames()`, and walks it outwards to the innermost frame of *user code* (a file
outside the standard library, site-packages and gpuprof itself). Each sample is tagged with a
label the caller supplies at that moment (the current phase) and counted per (label, function).

Python's sampler thread needs the GIL to look, so it cannot sample while the training thread
holds the GIL in pure-Python code for longer than the switch interval (5 ms): samples lean
towards moments when the GIL is released (torch kernels, I/O, sleep). Late wake-ups are counted
as misses, so each run reports its own quality (samples, misses), as py-spy does.

The default period is 10 ms (py-spy's 100 Hz). Each sample costs the training thread a GIL
hand-off, not the few µs of the stack walk: on a Python-bound loop (a tiny model) measured at
~0.1-0.25 ms per sample on a loaded 2-core VM, so 5 ms would cost ~5% there (docs/script.md).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import gpuprof

# Library code: a frame from these folders is never "the user's function".
_LIB_DIRS = tuple(
    sorted({os.path.realpath(p) + os.sep for p in (
        sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib"),
        sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib"),
        os.path.dirname(gpuprof.__file__),
    ) if p})
)


def is_user_file(filename: str) -> bool:
    """True for a real source file that is not the standard library, site-packages or gpuprof."""
    if not filename or filename.startswith("<"):
        return False
    if "site-packages" in filename or "dist-packages" in filename:
        return False
    path = os.path.realpath(filename)
    return not any(path.startswith(d) for d in _LIB_DIRS)


@dataclass
class _Counts:
    total: int = 0
    lines: dict = field(default_factory=dict)  # current line -> samples


class StackSampler:
    """Samples one thread's stack every `interval_s` seconds.

    label: called at each sample; returns a tag (e.g. the phase) or None to skip the sample
    (outside measured steps). marker: optional predicate on a function name; for each label the
    sampler also counts samples with a marked function anywhere on the user's stack.
    """

    def __init__(self, thread_id: int, label: Callable[[], str | None], interval_s: float = 0.01,
                 marker: Callable[[str], bool] | None = None, clock: Callable[[], float] = time.perf_counter):
        self.thread_id = thread_id
        self.interval_s = interval_s
        self._label = label
        self._marker = marker
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._code_cache: dict = {}  # code object -> (key or None for library code, marked)
        self.counts: dict[str, dict[tuple, _Counts]] = {}  # label -> (func, file, line) -> counts
        self.marked: dict[str, int] = {}  # label -> samples with a marked function on the stack
        self.labelled: dict[str, int] = {}  # label -> samples taken under that label
        self.samples = 0  # samples taken inside a labelled moment
        self.skipped = 0  # wake-ups outside a labelled moment
        self.misses = 0  # sampling slots lost to late wake-ups
        self.no_user_frame = 0  # samples with no user frame on the stack
        self.errors = 0  # samples that failed
        self.wall_s = 0.0
        self.cpu_s = 0.0  # CPU time of the sampler thread itself

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpuprof-stack-sampler", daemon=True)
        self._t0 = self._clock()
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.wall_s = self._clock() - self._t0

    def _run(self) -> None:
        # time.sleep for short periods, not Event.wait: one C call per period instead of a
        # Condition's Python machinery (a lock per wait); stopping then takes one period.
        cpu0 = time.thread_time()
        period = self.interval_s
        sleep, clock, stop = time.sleep, self._clock, self._stop
        next_t = clock() + period
        while not stop.is_set():
            delay = next_t - clock()
            if delay > 0:
                if delay > 0.05:
                    stop.wait(delay)
                else:
                    sleep(delay)
                if stop.is_set():
                    break
            now = clock()
            late = now - next_t
            if late > period:
                lost = int(late / period)
                self.misses += lost
                next_t += lost * period
            next_t += period
            self.sample_once()
        self.cpu_s = time.thread_time() - cpu0

    def sample_once(self) -> None:
        """Take one sample now (the thread loop calls this; tests may call it directly).
        Never raises: a failed sample is counted in `errors`."""
        try:
            self._sample()
        except Exception:  # e.g. interpreter shutdown tearing modules down under the thread
            self.errors += 1

    def _sample(self) -> None:
        tag = self._label()
        if tag is None:
            self.skipped += 1
            return
        frame = sys._current_frames().get(self.thread_id)
        if frame is None:
            return
        self.samples += 1
        self.labelled[tag] = self.labelled.get(tag, 0) + 1
        innermost = None
        marked = False
        cache = self._code_cache
        f = frame
        while f is not None:
            code = f.f_code
            entry = cache.get(code)
            if entry is None:  # first sight of this code: (key or None if library, marked)
                user = is_user_file(code.co_filename)
                entry = cache[code] = (
                    (code.co_name, code.co_filename, code.co_firstlineno) if user else None,
                    bool(user and self._marker is not None and self._marker(code.co_name)))
            key = entry[0]
            if key is not None:
                if innermost is None:
                    innermost = (key, f.f_lineno)
                    if self._marker is None:
                        break
                if entry[1]:
                    marked = True
                    break
            f = f.f_back
        del frame, f
        if marked:
            self.marked[tag] = self.marked.get(tag, 0) + 1
        if innermost is None:
            self.no_user_frame += 1
            return
        key, line = innermost
        per = self.counts.setdefault(tag, {})
        c = per.get(key)
        if c is None:
            c = per[key] = _Counts()
        c.total += 1
        c.lines[line] = c.lines.get(line, 0) + 1

    def top(self, label: str, n: int = 5, relative_to: str | None = None) -> list[dict]:
        """The label's most-sampled user functions: function, file, line, samples, share, hot_line."""
        per = self.counts.get(label, {})
        total = self.labelled.get(label, 0) or 1
        out = []
        for (func, file, line), c in sorted(per.items(), key=lambda kv: -kv[1].total)[:n]:
            hot = max(c.lines.items(), key=lambda kv: kv[1])[0]
            shown = os.path.relpath(file, relative_to) if relative_to else file
            if shown.startswith(".."):
                shown = file
            out.append({"function": func, "file": shown, "line": line, "samples": c.total,
                        "share": c.total / total, "hot_line": hot})
        return out

    def stats(self) -> dict:
        expected = int(self.wall_s / self.interval_s) if self.interval_s else 0
        return {
            "method": "in-process thread reading sys._current_frames() of the script's thread",
            "interval_s": self.interval_s,
            "samples": self.samples,
            "misses": self.misses,
            "no_user_frame": self.no_user_frame,
            "errors": self.errors,
            "outside_steps": self.skipped,
            "expected_slots": expected,
            "thread_cpu_s": self.cpu_s,
            "samples_by_phase": dict(self.labelled),
        }
