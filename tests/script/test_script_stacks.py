"""The stack sampler: attribution to the innermost user function, labels, markers, misses, and the
period that adapts to the step time. (Which frame is chosen: test_script_attribution.py.)

The sampling loop runs on a fake clock (mfu/fake_time.py): its periods, misses and adaptation are
exact whatever the machine's speed. The real thread is checked by counting its samples."""

import threading
import time

import pytest
from mfu.fake_time import FakeTime, wait_until

from gpuprof.measure.stacks import StackSampler, is_user_file


def get_batch(stop: threading.Event, inside: threading.Event):  # a user function, in a user file (this test)
    inside.set()  # from here on, the thread's innermost user frame is this one
    while not stop.is_set():
        time.sleep(0.001)


def _worker_in_get_batch():
    stop, inside = threading.Event(), threading.Event()
    t = threading.Thread(target=get_batch, args=(stop, inside), daemon=True)
    t.start()
    assert inside.wait(timeout=60)
    return t, stop


def test_samples_land_in_the_innermost_user_function_with_its_label():
    t, stop = _worker_in_get_batch()
    label = {"v": "data"}
    s = StackSampler(t.ident, lambda: label["v"], marker=lambda name: "batch" in name)
    try:
        for _ in range(5):
            s.sample_once()
        label["v"] = None  # outside a step: skipped
        s.sample_once()
    finally:
        stop.set()
        t.join()
    assert s.samples == 5 and s.skipped == 1
    (top,) = s.top("data")
    assert top["function"] == "get_batch" and top["samples"] == 5 and top["share"] == 1.0
    assert top["line"] == get_batch.__code__.co_firstlineno
    assert s.marked == {"data": 5}


def test_the_loop_samples_at_its_jittered_period_and_reports_its_quality():
    t, stop = _worker_in_get_batch()
    label = {"v": "other"}
    clock = FakeTime(until_s=0.2)
    s = StackSampler(t.ident, lambda: label["v"], interval_s=0.002, clock=clock.s, wait=clock.wait)
    try:
        s.run()  # on this thread, on the fake clock: 0.2 s of sampling
        on_time, clock_waits = s.stats(), clock.waits
        assert max(clock_waits) <= 0.003 + 1e-9 and min(clock_waits) >= 0.001 - 1e-9
        # Wait 10 of a second run returns 11 ms late (a starved thread): 5 periods of 2 ms are lost
        # inside a labelled moment (misses); wait 20 is as late outside one (no label): not a miss.
        late_clock = FakeTime(until_s=0.2, late_s={10: 0.011, 20: 0.011})
        late_clock.on_wait = lambda: label.update(v=None if len(late_clock.waits) == 21 else "other")
        late = StackSampler(t.ident, lambda: label["v"], interval_s=0.002, clock=late_clock.s,
                            wait=late_clock.wait)
        late.run()
        late_stats = late.stats()
    finally:
        stop.set()
        t.join()
    # Each period is 1-3 ms (2 ms jittered x 0.5-1.5): 67-200 wake-ups in 0.2 s, every one a sample.
    assert 0.2 / 0.003 - 1 <= on_time["samples"] <= 0.2 / 0.001
    assert on_time["samples"] == len(clock_waits) - 1  # every wait but the last (the stop) ended in a sample
    assert on_time["expected_slots"] == on_time["samples"] == s.top("other")[0]["samples"]
    assert on_time["misses"] == 0 and on_time["errors"] == 0 and on_time["outside_steps"] == 0
    assert s.top("other")[0]["function"] == "get_batch" and s.top("other")[0]["share"] == 1.0
    assert late_stats["misses"] == 5 and late_stats["outside_steps"] == 1
    assert late_stats["expected_slots"] == late_stats["samples"] + late_stats["outside_steps"] + 5 + 5


def test_thread_samples_until_stopped_and_reports_its_quality():
    """The production path: the sampler's own thread on the real clock. Counted, not timed: the test
    waits until it has taken 10 samples, then stops it."""
    t, stop = _worker_in_get_batch()
    s = StackSampler(t.ident, lambda: "other", interval_s=0.002)
    s.start()
    try:
        assert wait_until(lambda: s.samples >= 10), "the sampler took fewer than 10 samples in 60 s"
    finally:
        s.stop()
        stop.set()
        t.join()
    stats = s.stats()
    # Every wake-up is a slot, and so is every period lost to a late one.
    assert stats["samples"] >= 10 and stats["expected_slots"] >= stats["samples"] + stats["misses"]
    assert stats["errors"] == 0 and stats["thread_cpu_s"] > 0
    assert s.top("other")[0]["function"] == "get_batch"


def test_library_files_are_not_user_code():
    import json

    import torch

    assert not is_user_file(json.__file__)
    assert not is_user_file(torch.__file__)
    assert not is_user_file("<frozen runpy>")
    assert is_user_file(__file__)


def test_stop_is_prompt_even_with_a_long_period():
    s = StackSampler(threading.get_ident(), lambda: None, interval_s=60.0)
    s.start()
    t = time.perf_counter()
    s.stop()
    # Not waiting out the 60 s period: well under half of it on any machine (it takes milliseconds).
    assert time.perf_counter() - t < 30.0
    assert s.stats()["expected_slots"] == 0


def test_period_is_half_the_step_within_10_to_50_ms():
    def sampler(**kw):
        return StackSampler(0, lambda: None, interval_s=0.01, steps=lambda: 0, **kw)

    assert sampler()._adapt(0.015) == 0.01  # a short step: never faster than 10 ms
    assert sampler()._adapt(0.05) == pytest.approx(0.025)
    assert sampler()._adapt(0.4) == 0.05  # a long step: never slower than 50 ms
    s = sampler()
    for step_s in (0.06, 0.06, 3.0):  # an eval/checkpoint step does not swing it (median of 5)
        period = s._adapt(step_s)
    assert period == pytest.approx(0.03) and s.interval_s == period
    assert sampler(per_step=10)._adapt(0.06) == 0.01
    # a floor above the ceiling (benchmarks turn sampling off with an hour): the floor wins
    assert StackSampler(0, lambda: None, interval_s=3600.0, steps=lambda: 0)._adapt(0.05) == 3600.0


def test_thread_adapts_its_period_to_the_steps_it_sees_complete():
    t, stop = _worker_in_get_batch()
    # Steps of 300 ms on the fake clock, four of them, then 250 ms more: 150 ms / sample, capped
    # at 50 ms from the first step the loop sees complete.
    clock = FakeTime(until_s=1.45)
    steps = lambda: min(4, int(clock.s() / 0.3))  # noqa: E731
    s = StackSampler(t.ident, lambda: "data", interval_s=0.01, steps=steps, clock=clock.s, wait=clock.wait)
    try:
        s.run()
    finally:
        stop.set()
        t.join()
    stats = s.stats()
    assert s.interval_s == 0.05 and stats["interval_range_s"] == [0.01, 0.05] and s.intervals_used == {0.01, 0.05}
    assert stats["interval_rule"] == "step time / 2, within 10-50 ms"
    # 10 ms periods (x 0.5-1.5) for the first 0.3 s, then 50 ms ones: at least 20 + 15 samples.
    assert stats["samples"] >= 35 and s.top("data")[0]["function"] == "get_batch"
    assert max(clock.waits) <= 0.05 * 1.5 + 1e-9  # never longer than the capped period, jittered
    fixed = StackSampler(t.ident, lambda: None).stats()
    assert fixed["interval_rule"] == "fixed" and fixed["interval_s"] == 0.01
