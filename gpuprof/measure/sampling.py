"""Shared machinery of the samplers: the sampling thread, statistics, and the attribution of a
timestamped sample to the phase span that contains it.

Sample timestamps are on the PhaseTimer's clock (nanoseconds since its origin), so a sample is
attributed to the phase span that contains it: a statistical picture (100 ms samples over
millisecond phases), exact in aggregate over many steps. The thread never raises.
"""

from __future__ import annotations

import bisect
import statistics
import threading
import time
from typing import Callable

from gpuprof.stats import median, quantile

TIMELINE_MAX_POINTS = 2000  # per sampler; longer runs are decimated in the stored timeline


def stats(values: list[float]) -> dict | None:
    """mean / min / max / p50 / p90 of the values that were read (None when none were)."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    return {"mean": statistics.fmean(xs), "min": xs[0], "max": xs[-1],
            "p50": median(xs), "p90": quantile(xs, 0.9), "n": len(xs)}


class PhaseLookup:
    """Which phase a timer-relative nanosecond timestamp falls in.

    Measured steps' spans give their labels; a timestamp inside a warmup step is 'warmup';
    anything else (setup, between steps, after the loop) is 'outside'."""

    def __init__(self, spans: list[tuple[int, int, str]], measured: list[tuple[int, int]] | None = None,
                 warmup: list[tuple[int, int]] | None = None):
        self.spans = sorted(spans)
        self.starts = [s[0] for s in self.spans]
        self.measured = sorted(measured) if measured is not None else None
        self.warmup = sorted(warmup or [])
        self._m_starts = [w[0] for w in self.measured or []]
        self._w_starts = [w[0] for w in self.warmup]

    @staticmethod
    def _inside(windows, starts, t) -> bool:
        i = bisect.bisect_right(starts, t) - 1
        return i >= 0 and windows[i][0] <= t < windows[i][1]

    def phase(self, t_ns: int) -> str:
        if self.measured is not None and not self._inside(self.measured, self._m_starts, t_ns):
            return "warmup" if self._inside(self.warmup, self._w_starts, t_ns) else "outside"
        i = bisect.bisect_right(self.starts, t_ns) - 1
        if i >= 0 and self.spans[i][0] <= t_ns < self.spans[i][1]:
            return self.spans[i][2]
        return "outside"

    @classmethod
    def from_ctx(cls, ctx) -> "PhaseLookup":
        spans = list(getattr(ctx.timer, "spans", []) or [])
        prof = getattr(ctx, "profile", None)
        if prof is None or not prof.steps:
            return cls(spans)

        def win(steps):
            return [(int(s.start_s * 1e9), int((s.start_s + s.wall_s) * 1e9)) for s in steps]

        return cls(spans, win(prof.steps), win(prof.warmup_steps))


def per_phase(samples: list[tuple[int, dict]], lookup: PhaseLookup, keys: list[str]) -> dict:
    """{phase: {"samples": n, key: mean, ...}} from (t_ns, values) samples."""
    groups: dict[str, list[dict]] = {}
    for t, vals in samples:
        groups.setdefault(lookup.phase(t), []).append(vals)
    out = {}
    for ph, rows in groups.items():
        entry: dict = {"samples": len(rows)}
        for k in keys:
            xs = [r[k] for r in rows if r.get(k) is not None]
            entry[k] = statistics.fmean(xs) if xs else None
        out[ph] = entry
    return out


def _timeline(samples: list[tuple[int, dict]], keys: list[str]) -> dict:
    step = max(1, -(-len(samples) // TIMELINE_MAX_POINTS))
    pick = samples[::step]
    tl = {"t_s": [round(t / 1e9, 4) for t, _ in pick]}
    for k in keys:
        tl[k] = [v.get(k) for _, v in pick]
    return tl


class _SamplerThread:
    """A daemon thread calling `tick(t_ns)` every interval, on the timer's clock. Never raises.

    `first_after_interval`: the first tick comes one interval after start instead of at once (a
    sampler of rates has nothing to measure over an interval that has not elapsed).

    The time source is injectable, as the PhaseTimer's clock is: `clock` is a nanosecond clock
    (perf_counter_ns), `wait(seconds)` waits that long or until stop() and answers whether the
    sampler was stopped (default: the stop event's wait). Tests pass a fake pair and run the loop
    (`run()`) on their own thread, or take single ticks with `tick_now()`; `threaded=False`
    makes start() align without starting a thread, so that only the caller's ticks happen."""

    def __init__(self, interval_s: float, tick: Callable[[int], None], clock: Callable[[], int], *,
                 first_after_interval: bool = False, wait: Callable[[float], bool] | None = None,
                 threaded: bool = True):
        self.interval_s = interval_s
        self.first_after_interval = first_after_interval
        self.tick = tick
        self.clock = clock
        self.threaded = threaded
        self.origin_ns = 0
        self.stop_evt = threading.Event()
        self.wait = wait if wait is not None else self.stop_evt.wait
        self.thread: threading.Thread | None = None
        self.ticks = self.late = self.errors = 0
        self.last_error: str | None = None
        self.cpu_s = 0.0
        self.busy_s = 0.0
        self.started_ns = self.stopped_ns = 0
        self._aligned = False

    def align(self, timer) -> None:
        """Put our timestamps on the PhaseTimer's: origin = now - (timer's seconds since origin)."""
        now = self.clock()
        self.origin_ns = now - int(timer.now_s() * 1e9) if timer is not None else now
        self.started_ns = now
        self._aligned = True

    def start(self, timer=None) -> None:
        if timer is not None or not self._aligned:
            self.align(timer)
        if not self.threaded:
            return  # the caller ticks (tick_now) or runs the loop (run) itself
        self.thread = threading.Thread(target=self.run, name="gpuprof-sampler", daemon=True)
        self.thread.start()

    def tick_now(self) -> None:
        """One tick now, on the clock: what the loop does each interval (counts ticks, errors and
        the time spent). Never raises."""
        self._tick_at(self.clock())

    def _tick_at(self, t0: int) -> None:
        try:
            self.tick(t0 - self.origin_ns)
            self.ticks += 1
        except Exception as exc:  # noqa: BLE001 - a sampler must never take the run down
            self.errors += 1
            self.last_error = f"{exc.__class__.__name__}: {exc}"
        self.busy_s += (self.clock() - t0) / 1e9

    def run(self) -> None:
        """The sampling loop (the thread's body): a tick every interval until stopped."""
        cpu0 = time.thread_time()
        interval_ns = int(self.interval_s * 1e9)
        next_ns = self.clock()
        if self.first_after_interval:
            next_ns += interval_ns
            if self.wait(self.interval_s):
                self.cpu_s = time.thread_time() - cpu0
                return
        while True:
            t0 = self.clock()
            if t0 - next_ns > interval_ns // 2:
                self.late += 1  # the thread was starved: the host (or the GIL) is busy
            self._tick_at(t0)
            next_ns += interval_ns
            if self.wait(max(0.0, (next_ns - self.clock()) / 1e9)):
                break
            if self.clock() > next_ns + interval_ns:  # fell far behind: resynchronise
                next_ns = self.clock()
        self.cpu_s = time.thread_time() - cpu0

    def stop(self) -> None:
        self.stop_evt.set()
        if self.thread is not None:
            self.thread.join(timeout=5.0)
        self.stopped_ns = self.clock()

    def cost(self) -> dict:
        dur = max((self.stopped_ns - self.started_ns) / 1e9, 1e-9)
        return {"thread_cpu_s": self.cpu_s, "busy_s": self.busy_s,
                "cpu_s_per_sample": self.cpu_s / self.ticks if self.ticks else None,
                "share_of_one_core": self.cpu_s / dur, "duration_s": dur}


def _err(exc: Exception) -> str:
    msg = str(exc) or type(exc).__name__
    return msg if type(exc).__name__ in msg else f"{type(exc).__name__}: {msg}"


def _cfg_get(cfg, key):
    if isinstance(cfg, dict):
        return cfg.get(key)
    return getattr(cfg, key, None)
