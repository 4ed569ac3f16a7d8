"""FSDP2's collectives on CUDA, timed with events on FSDP's own streams (gpuprof.measure.
collective_events), against the strict fake of torch.cuda (tests/fakes/cuda.py: an event is bound
to its first stream's device, elapsed_time refuses incomplete events and two devices). Stand-ins
for `foreach_all_gather` / `foreach_reduce` enqueue GPU work on the streams FSDP passes them, as
FSDP does; the wrapper under test is gpuprof's own (CollectiveHooks._wrap_collective)."""

from __future__ import annotations

import types

import pytest
import torch

from gpuprof.measure.collective_events import CollectiveEvents
from gpuprof.measure.hooks import TrainingHooks
from gpuprof.measure.timer import PhaseTimer


@pytest.fixture
def fake(monkeypatch):
    from fakes.cuda import FakeCuda

    return FakeCuda(n_devices=2).install(monkeypatch)


def _hooks(fake, device="cuda:0"):
    timer = PhaseTimer.for_device(device)
    h = TrainingHooks(lambda m, a, k: timer)
    h.timer, h._off = timer, False
    h.collective_group = {"size": 2, "backend": "nccl"}  # read from the group in a real run
    h.collective_events = CollectiveEvents(torch.device(device))
    timer.start_step()
    return h, timer


def _all_gather(fake, copy_in_s=0.002, gather_s=0.010):
    def foreach_all_gather(fsdp_params, group, async_op, copy_in_stream, all_gather_stream, device, comm):
        fake.enqueue(copy_in_s, copy_in_stream)
        ready = torch.cuda.Event()
        ready.record(copy_in_stream)
        ready.wait(all_gather_stream)  # all_gather_stream.wait_stream(copy_in_stream)
        fake.enqueue(gather_s, all_gather_stream)
        return types.SimpleNamespace(all_gather_output=torch.zeros(256))
    return foreach_all_gather


def _close(h, timer, fake):
    timer.end_step(micro_steps=1, extra=h._step.extra())
    fake.advance(1.0)  # the GPU finishes what was queued
    records = timer.steps()
    return records, h.collective_events.into_steps(records)


def test_an_all_gather_is_timed_on_fsdps_streams_from_copy_in_to_the_collectives_end(fake):
    h, timer = _hooks(fake)
    copy_in, gather = torch.cuda.Stream(0), torch.cuda.Stream(0)
    wrapped = h._wrap_collective(_all_gather(fake), "all_gather")
    wrapped([], None, False, copy_in, gather, torch.device("cuda", 0), None)
    (rec,), how = _close(h, timer, fake)
    ag = rec.extra["collectives"]["all_gather"]
    assert ag["calls"] == 1 and ag["bytes"] == 256 * 4
    assert ag["gpu_seconds"] == pytest.approx(0.012)  # copy-in 2 ms, then the all-gather 10 ms
    assert ag["gpu_backward_seconds"] == 0.0
    assert (how["gpu_calls_read"], how["gpu_calls_unread"], how["gpu_streams_elsewhere"]) == (1, 0, 0)


def test_a_reduce_scatter_ends_on_the_post_reduce_stream_it_returns(fake):
    h, timer = _hooks(fake)
    rs_stream, all_reduce_stream = torch.cuda.Stream(0), torch.cuda.Stream(0)

    def foreach_reduce(fsdp_params, unsharded_grads, group, reduce_scatter_stream, *rest):
        fake.enqueue(0.004, reduce_scatter_stream)
        done = torch.cuda.Event()
        done.record(reduce_scatter_stream)
        done.wait(all_reduce_stream)
        fake.enqueue(0.003, all_reduce_stream)  # HSDP's all-reduce after the reduce-scatter
        return (None, done, all_reduce_stream, None, None, None, None)

    h.timer.switch("backward")
    h._wrap_collective(foreach_reduce, "reduce_scatter")([], [torch.zeros(100)], None, rs_stream, None)
    (rec,), _ = _close(h, timer, fake)
    rs = rec.extra["collectives"]["reduce_scatter"]
    assert rs["gpu_seconds"] == pytest.approx(0.007) and rs["gpu_backward_seconds"] == pytest.approx(0.007)


def test_an_event_where_the_post_reduce_stream_was_is_never_recorded_on(fake):
    """A torch whose foreach_reduce returns an event third (it has a `device`, as a stream has):
    Event.record refuses it ("expected stream to be a torch.Stream", as on an H200 with torch
    2.11, where no FSDP collective got its end event). The reduce-scatter then ends on its own
    stream, and what stood there is named."""
    h, timer = _hooks(fake)
    rs_stream = torch.cuda.Stream(0)

    def foreach_reduce(fsdp_params, unsharded_grads, group, reduce_scatter_stream, *rest):
        fake.enqueue(0.004, reduce_scatter_stream)
        done = torch.cuda.Event()
        done.record(reduce_scatter_stream)
        return (None, done, done, None, None, None)

    with pytest.raises(RuntimeError, match="expected stream to be a torch.Stream"):  # the fake is as strict
        torch.cuda.Event().record(torch.cuda.Event())
    h.timer.switch("backward")
    h._wrap_collective(foreach_reduce, "reduce_scatter")([], [torch.zeros(100)], None, rs_stream, None)
    (rec,), how = _close(h, timer, fake)
    assert rec.extra["collectives"]["reduce_scatter"]["gpu_seconds"] == pytest.approx(0.004)
    assert how["gpu_events"]["record_error"] is None
    assert how["gpu_not_streams"] == {"FakeEvent": 1} and how["gpu_calls_read"] == 1


def test_streams_of_another_device_are_not_timed_and_unfinished_work_is_never_waited_for(fake):
    h, timer = _hooks(fake)
    wrapped = h._wrap_collective(_all_gather(fake), "all_gather")
    wrapped([], None, False, torch.cuda.Stream(1), torch.cuda.Stream(1), torch.device("cuda", 1), None)

    def hung_all_gather(fsdp_params, group, async_op, copy_in_stream, all_gather_stream, device, comm):
        fake.block(all_gather_stream)  # NCCL waits for a peer that died: never completes
        return types.SimpleNamespace(all_gather_output=torch.zeros(8))

    h._wrap_collective(hung_all_gather, "all_gather")([], None, False, torch.cuda.Stream(0), torch.cuda.Stream(0),
                                                      torch.device("cuda", 0), None)
    timer.end_step(micro_steps=1, extra=h._step.extra())
    fake.advance(3600.0)
    how = h.collective_events.into_steps([])  # queries only: a wait here would raise WouldHang
    assert (how["gpu_calls_read"], how["gpu_calls_unread"], how["gpu_streams_elsewhere"]) == (0, 1, 1)
