"""Bounded memory: the timer's bounded mode keeps the warmup steps and a uniform sample of the
rest, with their spans only; the samplers keep at most their cap; the recorder's history is
fixed. Counted steps on a fake clock: nothing waits."""

import pytest

from gpuprof.measure.timer import PhaseTimer
from gpuprof.watch.counters import BoundedHost, _thin


class Clock:
    def __init__(self):
        self.t = 0

    def __call__(self):
        return self.t

    def advance(self, ns):
        self.t += ns


def _steps(timer, clock, n):
    for _ in range(n):
        timer.start_step()
        for phase, ns in (("data", 4_000_000), ("forward", 3_000_000), ("backward", 2_000_000), ("optimizer", 1_000_000)):
            timer.switch(phase)
            clock.advance(ns)
        timer.switch("other")
        timer.end_step(tokens=32, micro_steps=1)


def test_bounded_timer_keeps_the_warmup_and_a_uniform_sample_with_their_spans_only():
    clock = Clock()
    timer = PhaseTimer(clock=clock, keep_steps=50, keep_first=2)
    seen = []
    timer.listener = seen.append
    _steps(timer, clock, 5000)
    assert len(timer.spans) == 0  # between steps: every closed step's spans left `spans`
    assert len(timer._kept) == 50 and len(timer._first) == 2 and timer.steps_closed == 5000
    steps = timer.steps()
    assert len(steps) == 52 and [s.index for s in steps[:2]] == [0, 1]
    idx = [s.index for s in steps[2:]]
    assert idx == sorted(idx) and len(set(idx)) == 50
    # uniform over the run: a sample of 50 from 2..4999 has its mean near the middle
    assert 1500 < sum(idx) / 50 < 3500 and max(idx) > 4000
    s = steps[10]
    assert s.wall_s == pytest.approx(0.010) and sum(s.phases.values()) == pytest.approx(s.wall_s)
    assert [sp[0] for sp in s.extra["spans"]] == ["data", "forward", "backward", "optimizer"]
    assert len(timer.spans) == 52 * 6  # the kept steps' spans, for the samplers' phase lookup
    assert len(seen) == 5000  # the listener saw every step


def test_unbounded_timer_is_unchanged():
    clock = Clock()
    timer = PhaseTimer(clock=clock)
    _steps(timer, clock, 30)
    assert len(timer.spans) == 30 * 6 and [s.index for s in timer.steps()] == list(range(30))


def test_thinning_keeps_aligned_lists_aligned():
    a, b = list(range(10)), [x * 10 for x in range(10)]
    _thin(a, b)
    assert a == [0, 2, 4, 6, 8] and b == [0, 20, 40, 60, 80]


def test_bounded_host_sampler_never_holds_more_than_its_cap():
    class Host(BoundedHost):
        cap = 8

    h = Host(0.1)
    h._samples, h._disk_pairs, h._per_core = [], [], []
    base = BoundedHost.__mro__[1]._tick  # HostSampler._tick: replaced by an appender here

    def fake_tick(self, t_ns):
        self._samples.append((t_ns, {}))
        self._disk_pairs.append(({}, {}, 0.1))
        self._per_core.append([1.0])

    try:
        BoundedHost.__mro__[1]._tick = fake_tick
        for t in range(1000):
            h._tick(t)
    finally:
        BoundedHost.__mro__[1]._tick = base
    assert len(h._samples) <= 8 and len(h._samples) == len(h._disk_pairs) and len(h._per_core) <= 8
    ts = [t for t, _ in h._samples]
    assert ts == sorted(ts) and ts[-1] > 900 and ts[0] < 200  # spread over the whole run
