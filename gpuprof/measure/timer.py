"""Phase timing for a training step: host wall time per phase, and on CUDA the GPU timeline.

The step is a sequence of contiguous phase spans: at any moment exactly one phase label is
current (``other`` by default), and `switch` closes the current span and opens the next. So the
host spans of a step add up to its wall time by construction, and nested phases (a copy inside
a forward) are exclusive: the parent is paused while the child runs.

On CUDA each transition also records a CUDA event on the current stream. Recording an event does
not synchronize; the events are resolved only after the run (or when `event.query()` says they
are done), so timing adds no sync inside the step. The GPU reaches a transition's event when it
has finished all work enqueued before it, so the elapsed time between two consecutive events is
the phase's span on the GPU timeline. For a phase that enqueues no GPU work (data loading on the
host) that span is exactly the time the GPU sat idle waiting for the host: the exposed idle.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

PHASES = ("data", "h2d", "forward", "backward", "optimizer", "other", "eval")
# Phases that enqueue no GPU work of their own: their GPU span is idle time the host exposed.
HOST_ONLY_PHASES = ("data", "other")


@dataclass
class StepRecord:
    """One measured optimizer step."""

    index: int
    wall_s: float  # host wall time of the step
    phases: dict[str, float]  # host seconds per phase; sums to wall_s
    tokens: int = 0
    micro_steps: int = 0
    gpu_s: float | None = None  # span of the step on the GPU timeline (CUDA only)
    gpu_phases: dict[str, float] | None = None  # GPU-timeline seconds per phase; sums to gpu_s
    start_s: float = 0.0  # host time of the step start, seconds since the timer was created
    extra: dict = field(default_factory=dict)

    @property
    def idle_exposed(self) -> dict[str, float] | None:
        if self.gpu_phases is None:
            return None
        return {p: self.gpu_phases.get(p, 0.0) for p in HOST_ONLY_PHASES if p in self.gpu_phases}

    def to_dict(self) -> dict:
        d = {
            "index": self.index,
            "start_s": round(self.start_s, 9),
            "wall_s": self.wall_s,
            "tokens": self.tokens,
            "micro_steps": self.micro_steps,
            "phases": self.phases,
            "gpu_s": self.gpu_s,
            "gpu_phases": self.gpu_phases,
            "idle_exposed": self.idle_exposed,
        }
        if self.extra:
            d["extra"] = self.extra
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "StepRecord":
        return cls(
            index=int(d["index"]),
            wall_s=float(d["wall_s"]),
            phases={k: float(v) for k, v in d["phases"].items()},
            tokens=int(d.get("tokens", 0)),
            micro_steps=int(d.get("micro_steps", 0)),
            gpu_s=None if d.get("gpu_s") is None else float(d["gpu_s"]),
            gpu_phases=None if d.get("gpu_phases") is None
            else {k: float(v) for k, v in d["gpu_phases"].items()},
            start_s=float(d.get("start_s", 0.0)),
            extra=d.get("extra") or {},
        )


class _EventSource:
    """CUDA events on the current stream; a separate object so tests can pass a fake."""

    def __init__(self):
        import torch

        self._torch = torch

    def record(self):
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    @staticmethod
    def elapsed_s(a, b) -> float:
        return a.elapsed_time(b) / 1000.0  # ms -> s

    @staticmethod
    def ready(ev) -> bool:
        return ev.query()

    @staticmethod
    def wait(ev) -> None:
        ev.synchronize()


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


class PhaseTimer:
    """Times the phases of training steps.

    clock: a nanosecond clock (perf_counter_ns); tests inject a fake one.
    events: None on CPU; on CUDA `PhaseTimer.for_device(dev)` supplies real CUDA events.
    """

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns, events=None):
        self._clock = clock
        self._events = events
        self._origin = clock()
        self._label = "other"
        self._in_step = False
        self._pending: list[_Pending] = []
        self._done: list[StepRecord] = []
        self._index = 0
        self.enabled = True
        # Host-time spans (start_ns, end_ns, label) relative to the origin, for aligning
        # sampler data to phases. Appending a tuple per transition is ~0.1 µs.
        self.spans: list[tuple[int, int, str]] = []

    @classmethod
    def for_device(cls, device, clock: Callable[[], int] = time.perf_counter_ns) -> "PhaseTimer":
        events = _EventSource() if str(device).startswith("cuda") else None
        return cls(clock=clock, events=events)

    @property
    def current(self) -> str:
        return self._label

    @property
    def in_step(self) -> bool:
        return self._in_step

    def start_step(self) -> None:
        """Open a step; the current label continues (a step starts in `other` unless switched)."""
        now = self._clock()
        self._in_step = True
        self._step_start = now
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
        """Close the step. On CUDA its events are resolved later, without waiting here."""
        if not self._in_step:
            return
        now = self._clock()
        self._host[self._label] = self._host.get(self._label, 0) + (now - self._mark)
        self.spans.append((self._mark - self._origin, now - self._origin, self._label))
        self._mark = now
        if self._events is not None:
            self._ev.append((self._events.record(), self._label))
        self._pending.append(
            _Pending(self._index, self._step_start, now - self._step_start, self._host, tokens,
                     micro_steps, self._ev, extra or {})
        )
        self._index += 1
        self._in_step = False
        self._resolve(wait=False)

    def abandon_step(self) -> None:
        """Drop an unfinished step (the run stopped in the middle of it)."""
        self._in_step = False

    def _resolve(self, wait: bool) -> None:
        while self._pending:
            p = self._pending[0]
            gpu_s = gpu_phases = None
            if self._events is not None and p.events:
                last = p.events[-1][0]
                if not wait and not self._events.ready(last):
                    return  # GPU still busy with this step; try again later
                if wait:
                    self._events.wait(last)
                gpu_phases = {}
                for (a, _), (b, label) in zip(p.events, p.events[1:]):
                    gpu_phases[label] = gpu_phases.get(label, 0.0) + self._events.elapsed_s(a, b)
                gpu_s = self._events.elapsed_s(p.events[0][0], last)
            self._pending.pop(0)
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

    def steps(self) -> list[StepRecord]:
        """All closed steps, waiting for the GPU to finish the ones still in flight."""
        self._resolve(wait=True)
        return list(self._done)

    def now_s(self) -> float:
        """Seconds since the timer was created, on the timer's clock (for aligning samplers)."""
        return (self._clock() - self._origin) / 1e9


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
