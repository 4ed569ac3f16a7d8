"""The micro-step cost model: fitted from a profile, from measured points, or estimated from
FLOPs; and the --measure sweep's stop rules, driven by a fake clock."""

import os

import pytest

from gpuprof.errors import GpuprofError
from gpuprof.hardware import find_gpu
from gpuprof.profile import load
from gpuprof.recommend.sweep import OutOfMemory, sweep
from gpuprof.recommend.throughput import ThroughputModel
from gpuprof.dims import preset_config
from gpuprof.stats import PhaseTime, StepStats


FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


class FakeProfile:
    """What ThroughputModel.from_profile reads of a Profile: its step statistics (gpuprof.stats)."""

    def __init__(self, stats):
        self.stats = stats


def _stats(step_s: float, micro_steps: int, tokens_per_step: int, timeline: str, phases: dict) -> StepStats:
    total = sum(phases.values())
    return StepStats(timeline=timeline, n_steps=4, step_s=step_s,
                     phases={k: PhaseTime(seconds=v, share=v / total, host_seconds=v) for k, v in phases.items()},
                     median_s=step_s, p10_s=step_s, p90_s=step_s, min_s=step_s, max_s=step_s, mean_s=step_s,
                     host_step_s=step_s, tokens_per_step=tokens_per_step, micro_steps=micro_steps,
                     typical=(0, 1, 2, 3))


def test_from_profile_splits_fixed_and_per_token():
    # 64 micro-steps of 16 × 1024 tokens; data 0.1 s per micro-step, compute 0.05 s.
    prof = FakeProfile(_stats(64 * 0.15 + 0.2, 64, 16 * 1024 * 64, "gpu",
                              {"data": 6.4, "h2d": 0.0, "forward": 1.0, "backward": 2.2,
                               "optimizer": 0.15, "other": 0.05}))
    tp = ThroughputModel.from_profile(prof)
    assert tp.fixed_s == pytest.approx(0.1)
    assert tp.per_token_s == pytest.approx(3.2 / (16 * 1024 * 64))
    assert tp.optimizer_s == pytest.approx(0.2)
    assert tp.step_s(16, 1024, 64) == pytest.approx(prof.stats.step_s)  # reproduces it
    fast, slow = tp.step_range(128, 1024, 8)
    assert fast == pytest.approx(8 * 0.1 + 3.2 + 0.2)
    assert slow == pytest.approx(prof.stats.step_s)  # "nothing is fixed": no gain


def test_from_real_profile_fixture():
    prof = load(os.path.join(FIXTURES, "tiny_cpu_b4x4.gpuprof.json"))  # a schema-1 file: stats derived again
    tp = ThroughputModel.from_profile(prof)
    s = prof.stats
    assert tp.step_s(4, 64, 4) == pytest.approx(s.step_s)  # the typical step, reproduced
    assert tp.source == "profile" and "measured step" in tp.note


def test_from_profile_without_steps():
    with pytest.raises(GpuprofError):
        ThroughputModel.from_profile(FakeProfile(None))
    with pytest.raises(GpuprofError):  # no micro-steps or tokens recorded
        ThroughputModel.from_profile(FakeProfile(_stats(1.0, 0, 0, "host", {"forward": 1.0})))


def test_from_points_recovers_a_line():
    pts = [(t, 0.004 + 2e-7 * t) for t in (1024, 2048, 4096, 8192)]
    tp = ThroughputModel.from_points(pts, optimizer_s=0.01)
    assert tp.fixed_s == pytest.approx(0.004)
    assert tp.per_token_s == pytest.approx(2e-7)
    assert tp.step_s(8, 1024, 2) == pytest.approx(2 * (0.004 + 2e-7 * 8192) + 0.01)


def test_from_points_clamps_negative_intercept():
    tp = ThroughputModel.from_points([(100, 0.9), (200, 2.1)])
    assert tp.fixed_s == 0.0 and tp.per_token_s > 0


def test_from_flops_is_labelled_an_estimate():
    cfg = preset_config("gpt2", 1024)
    tp = ThroughputModel.from_flops(cfg, find_gpu("h200"), "bf16")
    assert tp.source == "flops" and "not measured" in tp.note
    # FACTS.md: 0.855 GFLOP/token; 2^20 tokens at 100% of 989.5 TFLOP/s = 0.91 s; 40% MFU → 2.27 s
    assert tp.per_token_s * 2**20 == pytest.approx(0.906 / 0.40, rel=0.01)
    fast, slow = tp.step_range(64, 1024, 16)
    assert fast < tp.step_s(64, 1024, 16) < slow


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_sweep_stops_at_out_of_memory():
    clock = FakeClock()

    def run(b):
        if b >= 16:
            raise OutOfMemory("CUDA out of memory")
        clock.t += 0.01 * b
        return 0.01 * b, 1000 * b

    res = sweep(run, block_size=128, max_batch=1024, budget_s=100, clock=clock)
    assert [p.batch_size for p in res.points] == [1, 2, 4, 8, 16]
    assert res.points[-1].error == "out of memory" and res.largest_ok == 8
    assert "out of memory" in res.stopped


def test_sweep_respects_time_budget_and_max_batch():
    clock = FakeClock()

    def run(b):
        clock.t += 1.0 * b
        return 1.0 * b, None

    res = sweep(run, block_size=128, max_batch=1024, budget_s=10, clock=clock)
    # 1 + 2 + 4 = 7 s spent; batch 8 would take ≥ 8 s more: over the 10 s budget
    assert [p.batch_size for p in res.points] == [1, 2, 4]
    assert "time budget" in res.stopped
    clock.t = 0
    res = sweep(run, block_size=128, max_batch=3, budget_s=1000, clock=clock)
    assert [p.batch_size for p in res.points] == [1, 2]
    assert res.timed() == [(128, 1.0), (256, 2.0)]


def test_real_micro_step_on_cpu():
    from gpuprof.recommend.sweep import GptMicroStep

    cfg = preset_config("tiny", block_size=32)
    step = GptMicroStep(cfg, "cpu", "fp32", reps=1)
    seconds, peak = step(2)
    assert seconds > 0 and peak is None
    assert step.optimizer_s() > 0
