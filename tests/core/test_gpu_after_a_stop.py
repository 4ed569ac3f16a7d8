"""After a stop, nothing waits on a GPU that may never finish, and nothing raises into a step:
the copy probe with no budget, the capture check on the measured device, the stricter fake."""

from __future__ import annotations

import types

import pytest
import torch

from gpuprof.measure.budget import PostRunBudget
from gpuprof.measure.copies import CopyBandwidthProbe
from gpuprof.measure.timer import PhaseTimer


def test_the_fake_hangs_where_cuda_would(fake_cuda):
    from fakes.cuda import WouldHang

    ev = fake_cuda.Event(enable_timing=True)
    fake_cuda.block()
    ev.record()
    assert not ev.query()
    for wait in (ev.synchronize, fake_cuda.synchronize, fake_cuda.current_stream().synchronize, fake_cuda.item):
        with pytest.raises(WouldHang):
            wait()


def test_the_fakes_streams_wait_for_events_on_others(fake_cuda):
    side = fake_cuda.Stream()
    fake_cuda.enqueue(0.5, stream=side)
    ev = fake_cuda.Event(enable_timing=True)
    ev.record(side)
    ev.wait(fake_cuda.current_stream())  # the training stream's later work waits for the side stream
    fake_cuda.enqueue(0.1)
    end = fake_cuda.Event(enable_timing=True)
    end.record()
    fake_cuda.advance(0.55)
    assert ev.query() and not end.query()  # 0.5 + 0.1: it ran after the side stream's work
    fake_cuda.advance(0.05)
    assert end.query()


def test_the_copy_probe_touches_nothing_with_no_budget(fake_cuda):
    """A stopped run's budget is zero: no warm-up copy, no synchronize (one would wait behind a
    collective that never completes)."""
    budget = PostRunBudget.none("the run was stopped")
    ctx = types.SimpleNamespace(device="cuda:0", example_args=(torch.zeros(4),), budget=budget)
    fake_cuda.block()
    section = CopyBandwidthProbe().stop(ctx)
    assert "not_measured" in section and "none: the run was stopped" in section["not_measured"]
    assert not any(c[0] == "synchronize" for c in fake_cuda.calls)
    assert budget.report()["parts"]["copies"]["skipped"] == ["the copy bandwidths"]


def test_a_capture_on_the_measured_device_is_seen_when_another_is_current(monkeypatch):
    """nanoGPT on cuda:1 never calls set_device: device 0 stays current. A capture on cuda:1's
    current stream must stop the timer recording there (torch's is_current_stream_capturing
    looks at device 0 only)."""
    from fakes.cuda import FakeCuda

    fake = FakeCuda(n_devices=2).install(monkeypatch)
    timer = PhaseTimer.for_device("cuda:1", pool=16)
    records = sum(1 for c in fake.calls if c[0] == "Event.record")
    fake._current_stream[1].capturing = True
    assert not torch.cuda.is_current_stream_capturing()  # what torch's check alone would say
    timer.start_step()
    timer.switch("forward")
    timer.end_step()
    assert sum(1 for c in fake.calls if c[0] == "Event.record") == records
    assert fake.current == 0  # the check looked at device 1 and restored the current device
    fake._current_stream[1].capturing = False
    (step,) = timer.steps()
    assert step.gpu_phases is None and "CUDA graph" in timer.gpu_report()["reasons"][0]
