"""DTensor's functional collectives as the `comm` phase (gpuprof.measure.funcol_hooks), on a
one-rank gloo group in this process: each issue counted once with its bytes, its wait matched to
it through a view of the result (as DTensor reshapes results before first use), a wait whose issue
was not seen counted apart, nothing counted while suspended, torch's functions restored after."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

funcol = pytest.importorskip("torch.distributed._functional_collectives")

from gpuprof.measure.funcol_hooks import FUNCOL_KINDS  # noqa: E402
from gpuprof.measure.hooks import TrainingHooks  # noqa: E402
from gpuprof.measure.timer import PhaseTimer  # noqa: E402


@pytest.fixture(scope="module")
def group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.fixture
def hooks(group):
    timer = PhaseTimer()
    h = TrainingHooks(lambda m, a, k: timer)
    originals = {name: getattr(funcol, name) for name in (*FUNCOL_KINDS, "wait_tensor") if hasattr(funcol, name)}
    h.install()
    model = nn.Linear(4, 4)
    model(torch.zeros(1, 4))  # the first forward starts the run and wraps the collectives
    try:
        yield h
    finally:
        h.remove()
        assert {name: getattr(funcol, name) for name in originals} == originals  # torch's own again


def _counts(h):
    return h._step.collectives


def test_an_all_reduce_waited_through_a_view_is_one_call_in_comm(hooks, group):
    t = torch.arange(12, dtype=torch.float32)
    before = dict(hooks.timer._host)
    out = funcol.all_reduce(t, "sum", group)
    waited = out.view(3, 4) + 1  # the first use waits, on a view of the result
    assert torch.equal(waited.flatten(), t + 1)
    c = _counts(hooks)
    assert set(c) == {"funcol_all_reduce"}
    ar = c["funcol_all_reduce"]
    assert (ar["calls"], ar["bytes"], ar["backward_calls"], ar["other_thread"]) == (1, 48, 0, 0)
    assert ar["wait_seconds"] > 0 and ar["seconds"] >= ar["wait_seconds"]
    assert ar["in_flight_seconds"] >= ar["seconds"] - 1e-6
    assert hooks.timer._host.get("comm", 0) > before.get("comm", 0)
    assert hooks.timer.current == "other"  # switched back after the issue and after the wait
    assert hooks._funcol_pending == {}


def test_an_all_gather_counts_its_output_and_nested_calls_count_once(hooks, group):
    t = torch.ones(2, 3)
    out = funcol.all_gather_single_autograd(t, 0, group)  # it calls all_gather_single inside: one call
    assert out.shape == (2, 3) and float(out.sum()) == 6.0
    ag = _counts(hooks)["funcol_all_gather"]
    assert (ag["calls"], ag["bytes"]) == (1, 24)


def test_a_wait_whose_issue_was_not_seen_is_counted_apart(hooks, group):
    raw = torch.ops._c10d_functional.all_reduce(torch.ones(3), "sum", group.group_name)
    funcol.wait_tensor(raw)
    c = _counts(hooks)
    assert "funcol_all_reduce" not in c and c["funcol_wait"]["calls"] == 1 and c["funcol_wait"]["seconds"] > 0


def test_nothing_is_counted_while_an_instrument_runs(hooks, group):
    hooks.suspended = True
    try:
        funcol.all_reduce(torch.ones(3), "sum", group).wait()
    finally:
        hooks.suspended = False
    assert _counts(hooks) == {}
