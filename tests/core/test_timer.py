"""PhaseTimer: spans partition the step; nesting is exclusive; CUDA events resolve after the step."""

from gpuprof.measure.timer import NullTimer, PhaseTimer


class FakeClock:
    def __init__(self):
        self.t = 0

    def __call__(self):
        return self.t

    def advance(self, seconds):
        self.t += int(seconds * 1e9)


def test_phases_partition_the_step_exactly():
    clock = FakeClock()
    timer = PhaseTimer(clock=clock)
    timer.start_step()
    clock.advance(0.001)  # other
    with timer.phase("forward"):
        clock.advance(0.030)
    with timer.phase("data"):
        clock.advance(0.010)
        with timer.phase("h2d"):  # nested: exclusive of data
            clock.advance(0.002)
        clock.advance(0.003)
    with timer.phase("backward"):
        clock.advance(0.060)
    timer.end_step(tokens=100, micro_steps=1)
    (step,) = timer.steps()
    assert step.wall_s == 0.106
    nonzero = {k: v for k, v in step.phases.items() if v}
    assert nonzero == {"other": 0.001, "forward": 0.030, "data": 0.013, "h2d": 0.002, "backward": 0.060}
    assert abs(sum(step.phases.values()) - step.wall_s) < 1e-12
    assert step.tokens == 100 and step.gpu_s is None
    labels = [s[2] for s in timer.spans if s[1] > s[0]]
    assert labels == ["other", "forward", "data", "h2d", "data", "backward"]


def test_time_outside_steps_is_not_counted():
    clock = FakeClock()
    timer = PhaseTimer(clock=clock)
    with timer.phase("data"):
        clock.advance(5)  # before any step: ignored
    timer.start_step()
    with timer.phase("forward"):
        clock.advance(1)
    timer.end_step()
    clock.advance(3)
    (step,) = timer.steps()
    assert step.wall_s == 1.0 and step.phases["forward"] == 1.0
    assert sum(step.phases.values()) == 1.0


class FakeEvents:
    """GPU timeline stand-in: each event completes at a GPU time we script."""

    def __init__(self, gpu_times):
        self.gpu_times = list(gpu_times)
        self.recorded = []
        self.waited = False

    def record(self):
        ev = {"t": self.gpu_times[len(self.recorded)], "done": False}
        self.recorded.append(ev)
        return ev

    def elapsed_s(self, a, b):
        return b["t"] - a["t"]

    def ready(self, ev):
        return ev["done"]

    def wait(self, ev):
        self.waited = True
        ev["done"] = True


def test_gpu_phases_come_from_events_resolved_after_the_step():
    clock = FakeClock()
    # transitions: start, ->forward, ->data (forward ends), ->backward (data ends), end
    events = FakeEvents([0.0, 0.0, 0.050, 0.062, 0.162])
    timer = PhaseTimer(clock=clock, events=events)
    timer.start_step()
    timer.switch("forward"); clock.advance(0.005)  # host launches quickly
    timer.switch("data"); clock.advance(0.060)  # GPU finishes forward at 50 ms, idles till 62
    timer.switch("backward"); clock.advance(0.004)
    timer.end_step()
    assert not events.waited  # nothing waited inside or at the end of the step
    (step,) = timer.steps()  # now it waits for the last event
    assert events.waited
    assert step.gpu_s == 0.162
    assert step.gpu_phases["forward"] == 0.050
    assert abs(step.gpu_phases["data"] - 0.012) < 1e-12
    assert abs(step.gpu_phases["backward"] - 0.100) < 1e-12
    assert step.idle_exposed["data"] == step.gpu_phases["data"]


def test_null_timer_records_nothing():
    timer = NullTimer()
    timer.start_step()
    with timer.phase("forward"):
        pass
    timer.end_step()
    assert timer.steps() == []
