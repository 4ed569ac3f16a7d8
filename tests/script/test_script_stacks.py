"""The stack sampler: attribution to the innermost user function, labels, markers, misses, and the
period that adapts to the step time. (Which frame is chosen: test_script_attribution.py.)"""

import threading
import time

import pytest

from gpuprof.measure.stacks import StackSampler, is_user_file


def get_batch(stop: threading.Event):  # a user function, in a user file (this test)
    while not stop.is_set():
        time.sleep(0.001)


def _worker_in_get_batch():
    stop, ready = threading.Event(), threading.Event()

    def body():
        ready.set()
        get_batch(stop)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    ready.wait()
    time.sleep(0.01)
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


def test_thread_samples_at_its_period_and_reports_its_quality():
    t, stop = _worker_in_get_batch()
    s = StackSampler(t.ident, lambda: "other", interval_s=0.002)
    s.start()
    time.sleep(0.2)
    s.stop()
    stop.set()
    t.join()
    stats = s.stats()
    # ~100 slots in 0.2 s; a loaded 2-core machine loses some to late wake-ups, which are counted
    assert stats["samples"] + stats["misses"] >= 50
    assert stats["samples"] >= 10
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
    assert time.perf_counter() - t < 1.0


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
    steps = {"n": 0}
    s = StackSampler(t.ident, lambda: "data", interval_s=0.01, steps=lambda: steps["n"])
    s.start()
    try:
        for _ in range(4):
            time.sleep(0.12)  # a 120 ms step: 60 ms / sample, capped at 50 ms
            steps["n"] += 1
        time.sleep(0.1)
    finally:
        s.stop()
        stop.set()
        t.join()
    stats = s.stats()
    assert s.interval_s == 0.05 and stats["interval_range_s"] == [0.01, 0.05]
    assert stats["interval_rule"] == "step time / 2, within 10-50 ms"
    assert stats["samples"] >= 5 and s.top("data")[0]["function"] == "get_batch"
    fixed = StackSampler(t.ident, lambda: None).stats()
    assert fixed["interval_rule"] == "fixed" and fixed["interval_s"] == 0.01
