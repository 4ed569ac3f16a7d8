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


def _step_with_gpu_work(timer, clock, fake, side=None):
    """forward enqueues 50 ms of GPU work; data keeps the host busy 60 ms with no GPU work (the
    GPU finishes the forward at 50 ms and idles 10 ms); backward enqueues 100 ms."""
    timer.start_step()
    timer.switch("forward")
    fake.enqueue(0.050)
    clock.advance(0.005); fake.advance(0.005)
    timer.switch("data")
    clock.advance(0.060); fake.advance(0.060)
    if side is not None:  # a side-stream prefetcher: x.cuda(non_blocking=True) under stream(s)
        with fake.stream(side):
            timer.switch("h2d")
            fake.enqueue(1.0)  # the side stream lags far behind
            timer.switch("data")
    timer.switch("backward")
    fake.enqueue(0.100)
    clock.advance(0.004); fake.advance(0.004)
    timer.end_step()


def test_gpu_phases_come_from_events_read_after_the_run(fake_cuda):
    clock = FakeClock()
    timer = PhaseTimer.for_device("cuda", clock=clock, pool=16)
    _step_with_gpu_work(timer, clock, fake_cuda)
    assert fake_cuda.event_waits == 0  # nothing waited inside or at the end of the step
    (step,) = timer.steps()  # now it polls the last event until the GPU has passed it
    assert fake_cuda.event_waits == 0  # never a blocking wait: cudaEventSynchronize has no timeout
    assert abs(step.gpu_s - 0.165) < 1e-9
    assert abs(step.gpu_phases["forward"] - 0.050) < 1e-9
    assert abs(step.gpu_phases["data"] - 0.015) < 1e-9  # idle: forward done at 50 ms, host at 65
    assert abs(step.gpu_phases["backward"] - 0.100) < 1e-9
    assert step.idle_exposed["data"] == step.gpu_phases["data"]
    # ... and in the order the GPU ran them: the GPU timeline's spans, from the same events
    spans = step.measured_spans(gpu=True)
    assert [sp[0] for sp in spans] == ["forward", "data", "backward"]
    assert [round(sp[1], 6) for sp in spans] == [0.0, 0.05, 0.065]
    assert [round(sp[2], 6) for sp in spans] == [0.05, 0.015, 0.1]
    report = timer.gpu_report()
    assert report["gpu_timeline"] and report["events_created_in_steps"] == 0


def test_timer_on_cuda1_never_touches_gpu0(monkeypatch):
    # nanoGPT --device=cuda:1 never calls set_device: the current device stays 0.
    from fakes.cuda import FakeCuda

    fake = FakeCuda(n_devices=2).install(monkeypatch)
    clock = FakeClock()
    timer = PhaseTimer.for_device("cuda:1", clock=clock, pool=16)
    timer.start_step()
    timer.switch("forward")
    fake.enqueue(0.050, stream=fake._streams[1])
    clock.advance(0.001)
    timer.end_step()
    (step,) = timer.steps()
    assert fake.contexts == {1}
    assert {c[1] for c in fake.calls if c[0] == "Event.record"} == {1}
    assert abs(step.gpu_phases["forward"] - 0.050) < 1e-9


def test_side_stream_copy_neither_raises_nor_leaves_the_training_stream(fake_cuda):
    clock = FakeClock()
    side = fake_cuda.Stream()
    timer = PhaseTimer.for_device("cuda", clock=clock, pool=16)
    for _ in range(2):
        _step_with_gpu_work(timer, clock, fake_cuda, side=side)
    # every event went to the training stream (id 0), never to the lagging side stream
    assert {c[2] for c in fake_cuda.calls if c[0] == "Event.record"} == {0}
    steps = timer.steps()
    assert all(s.gpu_phases is not None for s in steps)
    assert timer.gpu_report()["steps_unresolved"] == []


def test_an_event_that_cannot_be_recorded_never_raises_into_the_step(fake_cuda):
    clock = FakeClock()
    timer = PhaseTimer.for_device("cuda", clock=clock, pool=16)
    _step_with_gpu_work(timer, clock, fake_cuda)
    # the pooled events were created on device 0; pointing the source at another device's
    # stream makes the real CUDAEvent refuse the record (RuntimeError) -- inside a step
    from fakes.cuda import FakeStream

    timer._events.stream = FakeStream(fake_cuda, 0, 0)
    timer._events.stream.device_index = 1
    _step_with_gpu_work(timer, clock, fake_cuda)  # must not raise
    first, second = timer.steps()
    assert first.gpu_phases is not None
    assert second.gpu_phases is None and second.wall_s > 0  # host times kept
    report = timer.gpu_report()
    assert report["steps_unresolved"] == [1] and not report["gpu_timeline"]
    assert "does not match recording stream's device" in report["reasons"][0]


def test_unreadable_events_are_not_measured_with_the_reason(fake_cuda):
    clock = FakeClock()
    timer = PhaseTimer.for_device("cuda", clock=clock, pool=16)
    _step_with_gpu_work(timer, clock, fake_cuda)

    def refuse(a, b):
        raise RuntimeError("CUDA error: invalid resource handle")

    timer._events.elapsed_s = refuse
    (step,) = timer.steps()
    assert step.gpu_s is None and step.gpu_phases is None
    assert timer.gpu_report()["reasons"] == ["RuntimeError: CUDA error: invalid resource handle"]


def test_event_pool_is_refilled_between_steps(fake_cuda):
    clock = FakeClock()
    timer = PhaseTimer.for_device("cuda", clock=clock, pool=2)  # smaller than one step needs
    _step_with_gpu_work(timer, clock, fake_cuda)
    created_in_first = timer._events.created_in_steps
    assert created_in_first > 0
    _step_with_gpu_work(timer, clock, fake_cuda)
    assert timer._events.created_in_steps == created_in_first  # the second step created none
    assert len(timer.steps()) == 2


def test_null_timer_records_nothing():
    timer = NullTimer()
    timer.start_step()
    with timer.phase("forward"):
        pass
    timer.end_step()
    assert timer.steps() == []


def test_no_event_is_recorded_while_the_script_captures_a_cuda_graph(fake_cuda):
    clock = FakeClock()
    timer = PhaseTimer.for_device("cuda", clock=clock, pool=16)
    _step_with_gpu_work(timer, clock, fake_cuda)
    records = sum(1 for c in fake_cuda.calls if c[0] == "Event.record")
    fake_cuda.capturing = True  # recording on another stream would invalidate the user's capture
    _step_with_gpu_work(timer, clock, fake_cuda)
    assert sum(1 for c in fake_cuda.calls if c[0] == "Event.record") == records
    fake_cuda.capturing = False
    first, second = timer.steps()
    assert first.gpu_phases is not None and second.gpu_phases is None
    assert "CUDA graph" in timer.gpu_report()["reasons"][0]


# -- after a stop: a collective that never completes must not hang the rank (NCCL) -------------

def _nccl_step(timer, clock, fake, block=False):
    """A step whose backward ends in an all-reduce; `block`: the peer is gone, so that
    collective (and everything queued after it on the stream) never completes."""
    timer.start_step()
    timer.switch("forward")
    fake.enqueue(0.020)
    clock.advance(0.001)
    timer.switch("backward")
    fake.enqueue(0.040)
    if block:
        fake.block()
    clock.advance(0.001)  # NCCL blocks nothing on the host: the step ends at once
    timer.end_step()


def test_a_collective_that_never_completes_ends_the_wait_and_keeps_the_steps(fake_cuda):
    from gpuprof.measure.timer import NOT_FINISHED, STOPPED_GRACE_S

    clock = FakeClock()
    timer = PhaseTimer.for_device("cuda", clock=clock, pool=16)
    _nccl_step(timer, clock, fake_cuda)
    _nccl_step(timer, clock, fake_cuda, block=True)  # the peer stopped during this step
    _nccl_step(timer, clock, fake_cuda)  # queued behind the stuck collective
    host_before = fake_cuda.host_now
    steps = timer.steps(stopped=True)  # a fake CUDA raises WouldHang where CUDA would hang
    assert len(steps) == 3 and all(s.wall_s > 0 for s in steps)  # host times of every step kept
    assert steps[0].gpu_phases is not None
    assert steps[1].gpu_phases is None and steps[2].gpu_phases is None
    report = timer.gpu_report()
    assert report["gpu_unfinished"] and report["steps_unresolved"] == [1, 2]
    assert report["reasons"] == [NOT_FINISHED]
    waited = fake_cuda.host_now - host_before
    assert STOPPED_GRACE_S <= waited < STOPPED_GRACE_S + 0.01  # once, not once per step
    assert fake_cuda.event_waits == 0


def test_a_pending_stop_ends_the_wait_at_once(fake_cuda):
    from gpuprof import interrupts

    clock = FakeClock()
    timer = PhaseTimer.for_device("cuda", clock=clock, pool=16)
    _nccl_step(timer, clock, fake_cuda, block=True)
    with interrupts.held():
        interrupts.note("SIGTERM")  # torchrun stopping this rank while it waits
        try:
            (step,) = timer.steps(stopped=True)
        finally:
            interrupts.take()
    assert step.gpu_phases is None and fake_cuda.host_now < 0.01


def test_a_long_run_reuses_its_events(fake_cuda):
    """Events of steps the GPU has finished go back to the pool at the next step's end: the
    events a run holds do not grow with its length (script mode once kept ~8 per micro-step)."""
    clock = FakeClock()
    timer = PhaseTimer.for_device("cuda", clock=clock, pool=16)
    for _ in range(200):
        _step_with_gpu_work(timer, clock, fake_cuda)
        fake_cuda.advance(0.2)  # the GPU keeps up with the host
    assert fake_cuda.events_constructed <= 24  # the pool and one top-up, not 200 steps' worth
    report = timer.gpu_report()
    assert report["events_reused"] >= 199 * 5
    steps = timer.steps()
    assert len(steps) == 200 and all(s.gpu_phases is not None for s in steps)
    assert all(abs(s.gpu_phases["backward"] - 0.100) < 1e-9 for s in steps)
    assert fake_cuda.event_waits == 0 and not any(c[0] == "synchronize" for c in fake_cuda.calls)
