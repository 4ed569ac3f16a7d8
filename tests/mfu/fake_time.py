"""Time the samplers' tests move by hand, so that what they assert holds on any machine.

FakeTime is the injectable time source of the samplers (measure/sampling.py `_SamplerThread`,
HostSampler, NvmlSampler, measure/stacks.py `StackSampler`) and of the PhaseTimer: `ns` and `s`
read it, `wait` is a sampler's wait, which lets the time pass at once. A sampler's loop run with
it (`run()`, on the test's thread) takes exactly the samples its periods give, however fast the
machine runs the loop. `wait_until` is for the tests that keep a real thread: they wait for what
they need (a count of samples), with a generous timeout that is only a safety net.

Import as `from mfu.fake_time import FakeTime, wait_until` (tests/ is on sys.path).
"""

from __future__ import annotations

import time
from typing import Callable


class FakeTime:
    """A clock that moves only when told.

    until_s: once the time reaches it, `wait` answers True (the sampler is stopped).
    late_s: {index of a wait call: extra seconds}: that wait returns late, as a starved thread does.
    on_wait: called after each wait has moved the time (e.g. to complete a training step)."""

    def __init__(self, t_s: float = 0.0, until_s: float | None = None, late_s: dict[int, float] | None = None,
                 on_wait: Callable[[], None] | None = None):
        self.t_ns = round(t_s * 1e9)
        self.until_ns = None if until_s is None else round(until_s * 1e9)
        self.late_s = dict(late_s or {})
        self.on_wait = on_wait
        self.waits: list[float] = []  # the seconds each wait was asked for

    def ns(self) -> int:
        return self.t_ns

    def s(self) -> float:
        return self.t_ns / 1e9

    def advance(self, seconds: float) -> None:
        self.t_ns += round(seconds * 1e9)

    def wait(self, seconds: float) -> bool:
        """A sampler's wait(seconds): the time passes (plus any lateness scheduled for this call);
        True, the sampler is stopped, once `until_s` is reached."""
        i = len(self.waits)
        self.waits.append(seconds)
        self.advance(seconds + self.late_s.get(i, 0.0))
        if self.on_wait is not None:
            self.on_wait()
        return self.until_ns is not None and self.t_ns >= self.until_ns


def wait_until(condition: Callable[[], bool], timeout_s: float = 60.0, poll_s: float = 0.002) -> bool:
    """Poll `condition` until it holds; False after `timeout_s` (a safety net, never the measure)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True
