"""Phase timing for a training step: host wall time per phase, and on CUDA the GPU timeline.

The step is a sequence of contiguous phase spans: at any moment exactly one phase label is
current (``other`` by default), and `switch` closes the current span and opens the next. So the
host spans of a step add up to its wall time by construction, and nested phases (a copy inside
a forward) are exclusive: the parent is paused while the child runs.

On CUDA each transition also records a CUDA event, from a pool, on the training stream of the
measured device (gpuprof.measure.cuda.CudaEvents). Recording does not synchronize, and events
are read only after the run (`steps()`), so timing adds no sync inside the step and no CUDA
error can surface in the user's optimizer step. The GPU reaches a transition's event when it
has finished all work enqueued before it, so the elapsed time between two consecutive events is
the phase's span on the GPU timeline. For a phase that enqueues no GPU work (data loading on the
host) that span is exactly the time the GPU sat idle waiting for the host: the exposed idle. A
step whose events cannot be read keeps its host times and is reported as not measured on the
GPU timeline, with the reason.

Events are reused: at each step's end the timer asks (Event.query, which never blocks or
syncs) whether earlier steps have finished on the GPU, reads those, and returns their events to
the pool; a run of any length holds only the events of the steps the GPU has not finished.
After the run it waits for the rest with a bound (see `steps`): a stopped rank whose NCCL peer
is gone has a collective that never completes, and its steps after it are reported as not
finished on the GPU instead of hanging the rank.
"""

from __future__ import annotations

import random
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

from gpuprof.measure.os_counters import counts_between, thread_rusage
from gpuprof.profile import StepRecord

@dataclass
class _Pending:
    index: int
    start_ns: int
    wall_ns: int
    host: dict[str, int]
    tokens: int
    micro_steps: int
    events: list  # [(event, label_of_span_that_ENDS_at_this_event)], first label is None
    extra: dict
    spans: tuple[int, int] = (0, 0)  # this step's slice of PhaseTimer.spans (joined after the run)
    gpu: tuple | None = None  # (gpu_s, gpu_phases) once read; its events are back in the pool


class PhaseTimer:
    """Times the phases of training steps.

    clock: a nanosecond clock (perf_counter_ns); tests inject a fake one.
    events: None on CPU; on CUDA `PhaseTimer.for_device(dev)` supplies a CudaEvents source
    (record() -> event or None, elapsed_s(a, b), wait(ev), top_up(n), report()).
    """

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns, events=None,
                 gpu_unavailable: str | None = None, keep_steps: int | None = None, keep_first: int = 0,
                 seed: int = 0, rusage: Callable[[], tuple[int, float] | None] | None = thread_rusage):
        self._clock = clock
        # The training thread's page faults and kernel time per step (StepRecord.extra `minor_faults`,
        # `kernel_s`: analysis.rules.host_memory); rusage None: not read.
        self._rusage, self._ru0 = rusage, None
        self._events = events
        self._origin = clock()
        self._label = "other"
        self._in_step = False
        self._pending: list[_Pending] = []
        self._done: list[StepRecord] = []
        self._resolved = False
        self._index = 0
        self._most_events = 0  # the most events one step has recorded (sizes the pool top-up)
        self.enabled = True
        self.gpu_unavailable = gpu_unavailable  # why there is no GPU timeline at all
        self.unresolved: dict[int, str] = {}  # step index -> why its GPU timeline is not measured
        self.gpu_unfinished = False  # the GPU had not finished the run's work when the steps were read
        self._harvested = 0  # pending steps [0, n) whose GPU timelines are read
        # Host-time spans (start_ns, end_ns, label) relative to the origin, for aligning
        # sampler data to phases. Appending a tuple per transition is ~0.1 µs.
        self.spans: list[tuple[int, int, str]] = []
        # Called with each closed step's host figures (index, wall_s, phases, tokens, micro_steps)
        # for a live display; a listener that raises is dropped, never the run.
        self.listener: Callable[[dict], None] | None = None
        # Bounded mode (`gpuprof watch`: a run of days): at most `keep_steps` steps after the first
        # `keep_first` are kept, a uniform random sample of all of them (reservoir sampling, seeded),
        # and only their spans; None keeps every step (diagnose).
        self.keep_steps = keep_steps
        self.keep_first = keep_first
        self.steps_closed = 0  # every step closed, kept or not
        self._rng = random.Random(seed)
        self._first: list[tuple[_Pending, list]] = []
        self._kept: list[tuple[_Pending, list]] = []
        self._offered = 0  # steps offered to the reservoir
        self._spans_base = 0  # spans of retired steps dropped from the front of `spans`

    @classmethod
    def for_device(cls, device, clock: Callable[[], int] = time.perf_counter_ns,
                   pool: int = 256, **bounded) -> "PhaseTimer":
        """A timer for `device`: with CUDA events on its stream when it is a CUDA device. If the
        events cannot be set up, the timer still times the host and says why there is no GPU
        timeline (it never raises into a training script)."""
        from gpuprof.measure.cuda import CudaEvents, is_cuda

        if not is_cuda(device):
            return cls(clock=clock, **bounded)
        try:
            events = CudaEvents(device, pool=pool)
        except Exception as exc:  # noqa: BLE001
            return cls(clock=clock, gpu_unavailable=f"CUDA events unavailable: {exc.__class__.__name__}: {exc}",
                       **bounded)
        if events.failed:
            return cls(clock=clock, gpu_unavailable=events.failed, **bounded)
        return cls(clock=clock, events=events, **bounded)

    @property
    def current(self) -> str:
        return self._label

    @property
    def in_step(self) -> bool:
        return self._in_step

    @property
    def step_index(self) -> int | None:
        """Index of the open step (0 for the first, warmup included), None between steps."""
        return self._index if self._in_step else None

    def start_step(self) -> None:
        """Open a step; the current label continues (a step starts in `other` unless switched)."""
        now = self._clock()
        self._in_step = True
        self._step_start = now
        self._ru0 = (threading.get_ident(), self._rusage()) if self._rusage is not None else None
        self._span0 = self._spans_base + len(self.spans)
        self._mark = now
        self._host: dict[str, int] = {}
        self._ev: list = []
        if self._events is not None:
            self._ev.append((self._events.record(), None))

    def switch(self, name: str) -> str:
        """Make `name` the current phase; returns the previous label (to switch back to)."""
        prev = self._label
        if name == prev:
            return prev
        if self._in_step:
            now = self._clock()
            self._host[prev] = self._host.get(prev, 0) + (now - self._mark)
            self.spans.append((self._mark - self._origin, now - self._origin, prev))
            self._mark = now
            if self._events is not None:
                self._ev.append((self._events.record(), prev))
        self._label = name
        return prev

    @contextmanager
    def phase(self, name: str):
        """`with timer.phase("data"): ...` — the enclosing phase resumes afterwards."""
        prev = self.switch(name)
        try:
            yield
        finally:
            self.switch(prev)

    def end_step(self, tokens: int = 0, micro_steps: int = 0, extra: dict | None = None) -> None:
        """Close the step. Its CUDA events are only read after the run (`steps()`): nothing here
        waits for the GPU or can raise a CUDA error into the training script."""
        if not self._in_step:
            return
        now = self._clock()
        self._host[self._label] = self._host.get(self._label, 0) + (now - self._mark)
        self.spans.append((self._mark - self._origin, now - self._origin, self._label))
        self._mark = now
        if self._events is not None:
            self._ev.append((self._events.record(), self._label))
        ru0 = self._ru0  # counted where the thread that opened the step closes it: its own counts
        mine = ru0 is not None and ru0[0] == threading.get_ident()
        extra = dict(extra or {}, **(counts_between(ru0[1], self._rusage()) if mine else {}))
        # Only the slice is kept here; the spans are joined after the run (_resolve), not in the step.
        self._pending.append(
            _Pending(self._index, self._step_start, now - self._step_start, self._host, tokens,
                     micro_steps, self._ev, extra, (self._span0, self._spans_base + len(self.spans)))
        )
        self._index += 1
        self.steps_closed += 1
        self._in_step = False
        if self.listener is not None:
            try:
                self.listener({"index": self._index - 1, "wall_s": (now - self._step_start) / 1e9,
                               "phases": {k: v / 1e9 for k, v in self._host.items()},
                               "tokens": tokens, "micro_steps": micro_steps})
            except Exception:  # noqa: BLE001 - a display never ends the run
                self.listener = None
        if self._events is not None:
            self._harvest()
            # Refill the pool between steps, so the next step creates no event of its own.
            self._most_events = max(self._most_events, len(self._ev))
            self._events.top_up(self._most_events + 8)
        if self.keep_steps is not None:
            self._retire()

    def _retire(self) -> None:
        """Bounded mode: the pending steps that are complete (on CUDA: their GPU timeline read)
        leave the pending list for the reservoir, and their spans leave `spans` (a kept step keeps
        its own slice). Per step: a list slice and one random draw."""
        n = self._harvested if self._events is not None else len(self._pending)
        if n <= 0:
            return
        base = self._spans_base
        done = self._pending[:n]
        del self._pending[:n]
        if self._events is not None:
            self._harvested -= n
        for p in done:
            raw = self.spans[p.spans[0] - base:p.spans[1] - base]
            self._offer(p, raw)
        end = done[-1].spans[1] - base
        del self.spans[:end]
        self._spans_base += end

    def _offer(self, p: _Pending, raw: list) -> None:
        """Algorithm R: the first keep_first steps always; then every step is kept with
        probability keep_steps ÷ steps offered so far, replacing a kept one at random."""
        if p.index < self.keep_first:
            self._first.append((p, raw))
            return
        self._offered += 1
        if len(self._kept) < self.keep_steps:
            self._kept.append((p, raw))
            return
        j = self._rng.randrange(self._offered)
        if j < self.keep_steps:
            self._kept[j] = (p, raw)

    def _harvest(self) -> None:
        """Read the GPU timelines of the steps the GPU has finished (a query, never a wait) and
        give their events back to the pool."""
        while self._harvested < len(self._pending):
            p = self._pending[self._harvested]
            done = self._events.done(p.events[-1][0]) if p.events and p.events[-1][0] is not None else True
            if not done:
                return
            p.gpu = self._gpu_timeline(p, None)
            self._events.recycle([ev for ev, _ in p.events if ev is not None])
            p.events = []
            self._harvested += 1

    def open_step(self) -> dict | None:
        """Where an unfinished step is now: its index, the current phase, how long the step has
        run and each phase's host seconds in it (an exception unwinding out of a phase has closed
        it: `longest` is where the time went); None between steps. Read before abandon_step: a
        stopped run says where it was stuck."""
        if not self._in_step:
            return None
        now = self._clock()
        phases = dict(self._host)
        phases[self._label] = phases.get(self._label, 0) + (now - self._mark)
        longest = max(phases, key=phases.get)
        return {"index": self._index, "phase": self._label, "step_s": (now - self._step_start) / 1e9,
                "phases": {k: v / 1e9 for k, v in phases.items()},
                "longest": longest, "longest_s": phases[longest] / 1e9}

    def abandon_step(self) -> None:
        """Drop an unfinished step (the run stopped in the middle of it)."""
        self._in_step = False

    def _gpu_timeline(self, p: _Pending, deadline: float | None) -> tuple[float | None, dict | None]:
        """(gpu_s, gpu_phases) of a pending step, waiting for its last event until `deadline`
        (None: it is complete); (None, None) and a reason in self.unresolved when its events
        cannot be read."""
        if self._events is None:
            return None, None
        if p.gpu is not None:
            return p.gpu
        if not p.events or any(ev is None for ev, _ in p.events):
            self.unresolved[p.index] = self._events.failed or "a CUDA event of this step was not recorded"
            return None, None
        try:
            last = p.events[-1][0]
            # Every earlier event is on the same stream: done once the last one is.
            if deadline is not None and not self._events.wait(last, deadline):
                self.gpu_unfinished = True
                self.unresolved[p.index] = NOT_FINISHED
                return None, None
            gpu_phases: dict[str, float] = {}
            spans: list = []  # [phase, start_s, seconds] on the GPU timeline, from the step's first event
            t = 0.0
            for (a, _), (b, label) in zip(p.events, p.events[1:]):
                d = self._events.elapsed_s(a, b)
                gpu_phases[label] = gpu_phases.get(label, 0.0) + d
                if d > 0:
                    if spans and spans[-1][0] == label:
                        spans[-1][2] += d
                    else:
                        spans.append([label, t, d])
                t += d
            if len(spans) <= MAX_SPANS:
                p.extra["gpu_spans"] = [[lbl, round(st, 7), round(d, 7)] for lbl, st, d in spans]
            return self._events.elapsed_s(p.events[0][0], last), gpu_phases
        except Exception as exc:  # noqa: BLE001 - e.g. an event on another device or stream
            self.unresolved[p.index] = f"{exc.__class__.__name__}: {exc}"
            return None, None

    def _resolve(self, stopped: bool) -> None:
        deadline = None
        if self._events is not None and self._pending:
            longest = max(p.wall_ns for p in self._pending) / 1e9
            grace = max(STOPPED_GRACE_S, 2 * longest) if stopped else max(FINISHED_GRACE_S, 10 * longest)
            deadline = self._events.now() + grace
        if self.keep_steps is not None:
            self._resolve_bounded(deadline)
            return
        for p in self._pending:
            p.extra["spans"] = step_spans(self.spans[p.spans[0]:p.spans[1]], p.start_ns - self._origin)
            gpu_s, gpu_phases = self._gpu_timeline(p, deadline)
            self._done.append(
                StepRecord(
                    index=p.index,
                    wall_s=p.wall_ns / 1e9,
                    phases={k: v / 1e9 for k, v in p.host.items()},
                    tokens=p.tokens,
                    micro_steps=p.micro_steps,
                    gpu_s=gpu_s,
                    gpu_phases=gpu_phases,
                    start_s=(p.start_ns - self._origin) / 1e9,
                    extra=p.extra,
                )
            )
        self._pending.clear()
        self._harvested = 0

    def _resolve_bounded(self, deadline: float | None) -> None:
        """Bounded mode, after the run: the steps still pending go through the reservoir too; the
        kept ones become the run's steps (by index) and `spans` holds their spans only (what the
        samplers' phase lookup sees)."""
        base = self._spans_base
        for p in self._pending:
            self._offer(p, self.spans[p.spans[0] - base:p.spans[1] - base])
        self._pending.clear()
        self._harvested = 0
        kept = sorted(self._first + self._kept, key=lambda pr: pr[0].index)
        done = []
        for p, raw in kept:
            p.extra["spans"] = step_spans(raw, p.start_ns - self._origin)
            gpu_s, gpu_phases = self._gpu_timeline(p, deadline)
            done.append(StepRecord(index=p.index, wall_s=p.wall_ns / 1e9,
                                   phases={k: v / 1e9 for k, v in p.host.items()}, tokens=p.tokens,
                                   micro_steps=p.micro_steps, gpu_s=gpu_s, gpu_phases=gpu_phases,
                                   start_s=(p.start_ns - self._origin) / 1e9, extra=p.extra))
        self._done = done
        self.spans = [sp for _, raw in kept for sp in raw]
        self._spans_base = 0

    def steps(self, stopped: bool = False) -> list[StepRecord]:
        """All closed steps. Called after the run: waits for the GPU to finish them, with a bound,
        and reads the CUDA events; a step whose events cannot be read keeps its host times (see
        `gpu_report`). stopped: the run was stopped, failed or interrupted, so a peer may be gone
        and a collective never complete: the GPU gets max(STOPPED_GRACE_S, 2 × the longest step)
        to finish, else max(FINISHED_GRACE_S, 10 × the longest step); a pending stop ends the wait."""
        self._resolve(stopped)
        return list(self._done)

    def host_walls(self) -> list[float]:
        """Host wall seconds of the steps closed and not yet read by steps() (all of them in an
        unbounded run), oldest first: what the experiments plan on while the run goes on."""
        return [p.wall_ns / 1e9 for p in self._pending]

    def last_host_phases(self) -> dict[str, float] | None:
        """Host seconds per phase of the step closed last and not yet read by steps() (None before
        any): what the experiments decide on while the run goes on."""
        return {k: v / 1e9 for k, v in self._pending[-1].host.items()} if self._pending else None

    def last_counts(self) -> dict:
        """The step closed last's page faults and kernel time ({} before any, or where not read)."""
        ex = self._pending[-1].extra if self._pending else {}
        return {k: ex[k] for k in ("minor_faults", "kernel_s") if k in ex}

    def last_index(self) -> int | None:
        """The index of the step closed last (None before any)."""
        return self._index - 1 if self._index else None

    def gpu_report(self) -> dict | None:
        """How the GPU timeline was measured (None on CPU): events, pool, steps not measured."""
        if self._events is None and self.gpu_unavailable is None:
            return None
        out = {"gpu_timeline": self._events is not None and not self.unresolved,
               "method": "CUDA events on the training stream, read after the run",
               "steps_unresolved": sorted(self.unresolved),
               "gpu_unfinished": self.gpu_unfinished,
               "reasons": sorted(set(self.unresolved.values()))}
        if self.gpu_unavailable:
            out.update(gpu_timeline=False, reasons=[self.gpu_unavailable])
        if self._events is not None:
            out.update(self._events.report())
        return out

    def now_s(self) -> float:
        """Seconds since the timer was created, on the timer's clock (for aligning samplers)."""
        return (self._clock() - self._origin) / 1e9


STOPPED_GRACE_S = 5.0
FINISHED_GRACE_S = 60.0
NOT_FINISHED = ("the GPU had not finished this step when the run's steps were read (after a stop or "
                "failure: an NCCL collective whose peer stopped never completes)")
GPU_UNFINISHED = ("the GPU had not finished the run's work when its steps were read: nothing after "
                  "the run touches the GPU (its queue waits behind a collective that may never complete)")
MAX_SPANS = 600  # per step: a step with more phase changes keeps its first ones and says so


def step_spans(spans: list[tuple[int, int, str]], step_start_ns: int) -> list:
    """A step's host phase spans as [phase, start_s, seconds] from the step's start, in the
    order they ran (adjacent spans of one phase joined): what the timeline and the trace draw,
    measured rather than laid out. At most MAX_SPANS, then ["…", start_s, rest_s]."""
    out: list = []
    for a, b, label in spans:
        start, dur = (a - step_start_ns) / 1e9, (b - a) / 1e9
        if dur <= 0:
            continue
        if out and out[-1][0] == label and abs(out[-1][1] + out[-1][2] - start) < 1e-9:
            out[-1][2] += dur
            continue
        out.append([label, start, dur])
    if len(out) > MAX_SPANS:
        rest_start = out[MAX_SPANS - 1][1]
        end = out[-1][1] + out[-1][2]
        out = out[: MAX_SPANS - 1] + [["…", rest_start, end - rest_start]]
    return [[lbl, round(st, 7), round(d, 7)] for lbl, st, d in out]


class NullTimer(PhaseTimer):
    """A timer that measures nothing: the loop's `timing off` baseline for the overhead benchmark."""

    def __init__(self):
        super().__init__()
        self.enabled = False

    def start_step(self) -> None:  # noqa: D102
        pass

    def switch(self, name: str) -> str:  # noqa: D102
        return name

    def end_step(self, tokens: int = 0, micro_steps: int = 0, extra: dict | None = None) -> None:  # noqa: D102
        pass
