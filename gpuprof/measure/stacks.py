"""An in-process stack sampler: where in the user's code (or their trainer's) the training thread is.

A daemon thread wakes every `interval_s`, reads the target thread's current frame through
`sys._current_frames()`, and walks it outwards to the *deepest informative frame*: the innermost
frame that is either the user's own function (a file outside the standard library,
site-packages and gpuprof, other than a module's top level) or a library function outside torch
internals whose name says what training is doing (`transformers/trainer.py training_step`,
`lightning/pytorch/loops/... advance`). The walk stops at the first user module-level frame
(the script itself): what lies above it is gpuprof running the script. That module level is the
answer only when nothing deeper informs. Each sample is tagged with a label the caller supplies
at that moment (the current phase) and counted per (label, function).

Python's sampler thread needs the GIL to look, so it cannot sample while the training thread
holds the GIL in pure-Python code for longer than the switch interval (5 ms): samples lean
towards moments when the GIL is released (torch kernels, I/O, sleep). Late wake-ups are counted
as misses, so each run reports its own quality (samples, misses), as py-spy does.

Cost: each wake-up costs the training thread a GIL hand-off, whatever the sampler then does.
On a 2-core VM, against a Python-heavy small-model step, measured ~120 µs of the training
thread's wall time and ~100-300 µs of CPU per sample at periods of 10-25 ms (less at 1 ms, when
nothing idles between samples); the walk itself is ~3 µs (each code object is classified once
and cached). See docs/script.md. So the period adapts to the step: `min_interval_s` (10 ms, as
py-spy's 100 Hz) until steps complete, then step time / `per_step` (2), within
[min_interval_s, max_interval_s (50 ms)]: a 15 ms step is sampled every 10 ms, a 50 ms step
every 25 ms, a step of 100 ms or more every 50 ms (a 1 s GPU step 20 times). Each period is
jittered (x 0.5-1.5) so that it cannot lock onto the loop's own rhythm.
"""

from __future__ import annotations

import os
import random
import re
import site
import sys
import sysconfig
import threading
import time
from typing import Callable

import gpuprof
from gpuprof.stats import median


def _dirs(paths) -> tuple[str, ...]:
    # longest first: site-packages usually sits inside the standard library's folder
    return tuple(sorted({os.path.realpath(p) + os.sep for p in paths if p}, key=len, reverse=True))


_PATHS = sysconfig.get_paths()
_STDLIB_DIRS = _dirs([_PATHS.get("stdlib"), _PATHS.get("platstdlib")])
_SITE_DIRS = _dirs([_PATHS.get("purelib"), _PATHS.get("platlib"),
                    *getattr(site, "getsitepackages", lambda: [])(),
                    getattr(site, "getusersitepackages", lambda: None)()])
_OWN_DIR = os.path.realpath(os.path.dirname(gpuprof.__file__)) + os.sep
_SITE_NAMES = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)

# Installed packages never named as "where the time went": torch's own machinery (autograd,
# nn.Module's call path, the DataLoader), array and progress-bar libraries whose function names
# read like training concepts (numpy's memmap.__getitem__ under a get_batch, tqdm's __iter__
# around a loader) while the frame that called them is the one that tells the user something,
# and gpuprof itself.
INTERNAL_PACKAGES = frozenset({"torch", "torchgen", "functorch", "triton", "numpy", "scipy", "pandas",
                               "pyarrow", "tqdm", "wrapt", "typing_extensions", "gpuprof"})
# A library function whose name says what training is doing at that moment.
_CONCEPT = re.compile(r"train|step|forward|backward|loss|optim|batch|data|load|fetch|collate|sampl|"
                      r"advance|run|fit|eval|predict|valid|iter|next|getitem|update|clip|zero_grad|"
                      r"scale|accum|epoch|loop|grad|save|checkpoint|log|token|generat|attention|attn",
                      re.I)
# Code objects of a user function that are part of it, not functions of their own (3.11).
_TRANSPARENT = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"})

# Frame kinds (cached per code object).
_SKIP, _OWN, _LIB, _MODULE = 0, 1, 2, 3
_ORIGIN = {_OWN: "user", _LIB: "library", _MODULE: "module"}


def file_origin(filename: str) -> tuple[str, str]:
    """Where a source file comes from: ("user", filename), ("library", path relative to its
    site-packages folder, e.g. "transformers/trainer.py") or ("internal", path) for the standard
    library, gpuprof, torch internals and the INTERNAL_PACKAGES."""
    if not filename or filename.startswith("<"):
        return "internal", filename or ""
    path = os.path.realpath(filename)
    rel = next((path[len(d):] for d in _SITE_DIRS if path.startswith(d)), None)
    if rel is None:
        for p in (path, filename):
            i = max(p.rfind(n) for n in _SITE_NAMES)
            if i >= 0:
                rel = p[p.index(os.sep, i + 1) + 1:]
                break
    if rel is not None:
        top = rel.split(os.sep, 1)[0].split(".", 1)[0]
        return ("internal" if top in INTERNAL_PACKAGES else "library"), rel
    if path.startswith(_OWN_DIR):
        return "internal", path
    if any(path.startswith(d) for d in _STDLIB_DIRS):
        return "internal", path
    return "user", filename


def is_user_file(filename: str) -> bool:
    """True for a real source file that is not the standard library, site-packages or gpuprof."""
    return file_origin(filename)[0] == "user"


class _Counts:
    __slots__ = ("total", "lines")

    def __init__(self) -> None:
        self.total = 0
        self.lines: dict[int, int] = {}  # current line -> samples


class StackSampler:
    """Samples one thread's stack; see the module docstring for which frame a sample counts in.

    label: called at each sample; returns a tag (e.g. the phase) or None to skip the sample
    (outside measured steps). marker: optional predicate on a function name; for each label the
    sampler also counts samples with a marked user function anywhere on the stack (below the
    script's module level). steps: optional, the number of steps completed so far; with it the
    period adapts to the step time (step / per_step, within [interval_s, max_interval_s]).

    clock (seconds) and wait: the time source, injectable as the PhaseTimer's clock is.
    `wait(seconds)` waits that long or until stop() and answers whether the sampler was stopped;
    by default the loop sleeps (time.sleep up to 50 ms, the stop event's wait beyond). Tests pass a
    fake pair and run the loop (`run()`) on their own thread, or take samples with sample_once().
    """

    def __init__(self, thread_id: int, label: Callable[[], str | None], interval_s: float = 0.01,
                 marker: Callable[[str], bool] | None = None, clock: Callable[[], float] = time.perf_counter,
                 *, steps: Callable[[], int] | None = None, per_step: float = 2.0, max_interval_s: float = 0.05,
                 wait: Callable[[float], bool] | None = None, code_marker: Callable[[object], bool] | None = None):
        self.thread_id = thread_id
        self.min_interval_s = interval_s
        self.max_interval_s = max_interval_s
        self.per_step = per_step
        self.interval_s = interval_s  # the current period
        self._label = label
        self._marker = marker
        self._code_marker = code_marker  # optional predicate on a user code object (a loader found by discovery)
        self._clock = clock
        self._wait = wait
        self._steps = steps
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._code_cache: dict = {}  # code object -> (kind, key or None, marked)
        self._file_cache: dict[str, tuple[str, str]] = {}  # co_filename -> file_origin()
        self._step_times: list[float] = []  # the last few step durations seen by the sampler
        self.counts: dict[str, dict[tuple, _Counts]] = {}  # label -> (func, file, line, origin) -> counts
        self.marked: dict[str, int] = {}  # label -> samples with a marked function on the stack
        self.labelled: dict[str, int] = {}  # label -> samples taken under that label
        self.samples = 0  # samples taken inside a labelled moment
        self.skipped = 0  # wake-ups outside a labelled moment
        self.misses = 0  # sampling slots lost to late wake-ups that ended in a measured moment
        self.slots = 0  # sampling slots elapsed (wake-ups + misses)
        self.no_user_frame = 0  # samples with no informative or user frame on the stack
        self.errors = 0  # samples that failed
        self.wall_s = 0.0
        self.cpu_s = 0.0  # CPU time of the sampler thread itself
        self.intervals_used: set[float] = set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="gpuprof-stack-sampler", daemon=True)
        self._t0 = self._clock()
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.wall_s = self._clock() - self._t0

    # -- the thread ---------------------------------------------------------------------------

    def run(self) -> None:
        """The sampling loop (the thread's body) until stopped, or until an injected wait says so."""
        # time.sleep for short periods, not Event.wait: one C call per period instead of a
        # Condition's Python machinery (a lock per wait); stopping then takes one period.
        cpu0 = time.thread_time()
        sleep, clock, stop, steps, wait = time.sleep, self._clock, self._stop, self._steps, self._wait
        # Each period is jittered (x 0.5-1.5): a fixed period can lock onto a loop's own rhythm
        # (a 50 ms period and 50 ms micro-steps sample the same moment of each, forever).
        jitter = random.Random(self.thread_id).random
        period = self.interval_s
        self.intervals_used.add(period)
        seen = self._read_steps()
        seen_t = next_t = clock()
        next_t += period
        while not stop.is_set():
            delay = next_t - clock()
            if delay > 0:
                if wait is not None:
                    if wait(delay):
                        break
                elif delay > 0.05:
                    stop.wait(delay)
                else:
                    sleep(delay)
                if stop.is_set():
                    break
            now = clock()
            late = now - next_t
            lost = 0
            if late > period:
                lost = int(late / period)
                self.slots += lost
                next_t += lost * period
            next_t += period * (0.5 + jitter())
            self.slots += 1
            skipped = self.skipped
            self.sample_once()
            if lost and self.skipped == skipped:  # late inside a measured step (not in warmup,
                self.misses += lost  # nor in the script's teardown after the stop)
            if steps is not None:
                n = self._read_steps()
                if n != seen:
                    period = self._adapt((now - seen_t) / max(1, n - seen))
                    seen, seen_t = n, now
                    next_t = now + period * (0.5 + jitter())
        self.cpu_s = time.thread_time() - cpu0

    def _read_steps(self) -> int:
        try:
            return self._steps() if self._steps is not None else 0
        except Exception:  # noqa: BLE001 - the sampler must never fail the run
            return 0

    def _adapt(self, step_s: float) -> float:
        """A new period from a completed step's duration: step / per_step, within the bounds
        (the median of the last five steps, so an eval or checkpoint step does not swing it)."""
        times = self._step_times
        times.append(step_s)
        del times[:-5]
        period = max(self.min_interval_s, min(self.max_interval_s, median(times) / self.per_step))
        self.interval_s = period
        self.intervals_used.add(period)
        return period

    # -- one sample ---------------------------------------------------------------------------

    def sample_once(self) -> None:
        """Take one sample now (the thread loop calls this; tests may call it directly).
        Never raises: a failed sample is counted in `errors`."""
        try:
            self._sample()
        except Exception:  # e.g. interpreter shutdown tearing modules down under the thread
            self.errors += 1

    def _classify(self, code) -> tuple:
        """(kind, key, marked) of a code object; key = (function, file shown, def line, origin)."""
        fname = code.co_filename
        origin = self._file_cache.get(fname)
        if origin is None:
            origin = self._file_cache[fname] = file_origin(fname)
        where, shown = origin
        name = code.co_name
        if where == "user":
            kind = _MODULE if name == "<module>" else _SKIP if name in _TRANSPARENT else _OWN
        elif where == "library" and _CONCEPT.search(name):
            kind = _LIB
        else:
            kind = _SKIP
        marked = kind == _OWN and ((self._marker is not None and bool(self._marker(name)))
                                   or (self._code_marker is not None and bool(self._code_marker(code))))
        key = (name, shown, code.co_firstlineno, _ORIGIN[kind]) if kind else None
        entry = self._code_cache[code] = (kind, key, marked)
        return entry

    def _sample(self) -> None:
        tag = self._label()
        if tag is None:
            self.skipped += 1
            return
        f = sys._current_frames().get(self.thread_id)
        if f is None:
            return
        self.samples += 1
        labelled = self.labelled
        labelled[tag] = labelled.get(tag, 0) + 1
        cache, want_mark = self._code_cache, self._marker is not None or self._code_marker is not None
        key = None
        line = 0
        marked = False
        while f is not None:
            entry = cache.get(f.f_code)
            if entry is None:
                entry = self._classify(f.f_code)
            kind = entry[0]
            if kind:
                if key is None:
                    key, line = entry[1], f.f_lineno
                if entry[2]:
                    marked = True
                if kind == _MODULE or marked or not want_mark:
                    break  # the script's top level bounds the walk; nothing more to look for
            f = f.f_back
        f = None
        if marked:
            self.marked[tag] = self.marked.get(tag, 0) + 1
        if key is None:
            self.no_user_frame += 1
            return
        per = self.counts.get(tag)
        if per is None:
            per = self.counts[tag] = {}
        c = per.get(key)
        if c is None:
            c = per[key] = _Counts()
        c.total += 1
        lines = c.lines
        lines[line] = lines.get(line, 0) + 1

    # -- results ------------------------------------------------------------------------------

    def top(self, label: str, n: int = 5, relative_to: str | None = None) -> list[dict]:
        """The label's most-sampled functions: function, file, line, samples, share, hot_line,
        origin (user | library | module). A user file is shown relative to `relative_to` (the
        script's folder) when it lies inside it; a library file relative to its site-packages."""
        per = self.counts.get(label, {})
        total = self.labelled.get(label, 0) or 1
        out = []
        for (func, file, line, origin), c in sorted(per.items(), key=lambda kv: -kv[1].total)[:n]:
            hot = max(c.lines.items(), key=lambda kv: kv[1])[0]
            shown = file
            if origin != "library" and relative_to:
                shown = os.path.relpath(file, relative_to)
                if shown.startswith(".."):
                    shown = file
            out.append({"function": func, "file": shown, "line": line, "samples": c.total,
                        "share": c.total / total, "hot_line": hot, "origin": origin})
        return out

    def stats(self) -> dict:
        return {
            "method": "in-process thread reading sys._current_frames() of the script's thread",
            "interval_s": self.interval_s,
            "interval_range_s": [min(self.intervals_used, default=self.interval_s),
                                 max(self.intervals_used, default=self.interval_s)],
            "interval_rule": (f"step time / {self.per_step:g}, within {self.min_interval_s * 1e3:g}-"
                              f"{max(self.min_interval_s, self.max_interval_s) * 1e3:g} ms"
                              if self._steps is not None else "fixed"),
            "samples": self.samples,
            "misses": self.misses,
            "no_user_frame": self.no_user_frame,
            "errors": self.errors,
            "outside_steps": self.skipped,
            "expected_slots": self.slots,
            "thread_cpu_s": self.cpu_s,
            "samples_by_phase": dict(self.labelled),
        }
