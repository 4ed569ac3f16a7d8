"""The micro-batch curve (fit and measurement) and the CUDA sync counter (with a fake torch)."""

import types
import warnings

import pytest
import torch

from gpuprof.measure.microbatch import _settled, _sizes, fit_line, measure_curve
from gpuprof.measure.syncs import SYNC_MESSAGE, SyncCounter
from gpuprof.measure.timer import PhaseTimer
from gpuprof.runners.gpt import GPT, GPTConfig


def test_fit_line_recovers_fixed_and_per_sample_cost_despite_one_outlier():
    xs = [1, 2, 4, 8]
    ys = [0.010 + 0.002 * x for x in xs]
    ys[1] *= 5  # one disturbed timing
    fixed, slope = fit_line(xs, ys)
    assert fixed == pytest.approx(0.010, rel=0.05) and slope == pytest.approx(0.002, rel=0.05)


def test_sizes_and_settling():
    assert _sizes(8, None) == [1, 4, 8, 16]
    assert _sizes(1, None) == [1, 2, 4]
    assert _settled([0.100, 0.105, 0.300]) and not _settled([0.100, 0.150])


def test_measure_curve_on_a_small_gpt_leaves_no_gradients():
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=64, vocab_size=64, block_size=128))
    x = torch.randint(0, 64, (4, 128))
    out = measure_curve(model, x, x, "cpu", reps=2, budget_s=10)
    assert [p["batch_size"] for p in out["points"]] == [1, 2, 4, 8]
    t = {p["batch_size"]: p["seconds"] for p in out["points"]}
    assert t[8] > t[1]  # 8 sequences cost more than one, whatever the machine's load
    assert out["fixed_s"] >= 0
    assert all(p.grad is None for p in model.parameters())


class FakeCuda:
    def __init__(self):
        self.mode = 0

    def get_sync_debug_mode(self):
        return self.mode

    def set_sync_debug_mode(self, mode):
        self.mode = mode


def test_sync_counter_counts_by_phase_and_restores():
    fake_torch = types.SimpleNamespace(cuda=FakeCuda())
    timer = PhaseTimer()
    ctx = types.SimpleNamespace(device="cuda", timer=timer, profile=None)
    counter = SyncCounter(torch_module=fake_torch)
    counter.start(ctx)
    assert fake_torch.cuda.mode == "warn"
    timer.start_step()
    for _ in range(3):
        with timer.phase("forward"):
            warnings.warn(f"{SYNC_MESSAGE} (item)", UserWarning)
    timer.end_step()
    ctx.profile = types.SimpleNamespace(steps=timer.steps(), warmup_steps=[])
    out = counter.stop(ctx)
    assert out["per_phase"] == {"forward": 3} and out["per_step"] == 3
    assert fake_torch.cuda.mode == 0


def test_sync_counter_does_nothing_on_cpu():
    counter = SyncCounter(torch_module=types.SimpleNamespace(cuda=FakeCuda()))
    counter.start(types.SimpleNamespace(device="cpu", timer=PhaseTimer(), profile=None))
    assert counter.stop(None) is None
