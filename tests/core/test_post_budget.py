"""The post-run budget: one time budget shared by the ceiling/precision probe, the FLOP count and
the micro-batch curve, each shrinking its work to fit and saying what it skipped."""

import time
import types

import pytest

from gpuprof.measure.budget import PostRunBudget
from gpuprof.measure.flops import FlopsInstrument
from gpuprof.measure.microbatch import plan_sizes


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_budget_default_shares_and_report():
    clock = Clock()
    lines = []
    b = PostRunBudget.for_run(200.0, clock=clock, on_progress=lines.append)
    assert b.total_s == 50.0  # 25% of a 200 s run beats the 15 s floor
    assert PostRunBudget.for_run(8.0).total_s == 15.0 and PostRunBudget.for_run(8.0, 2.0).total_s == 2.0
    assert b.allot("probe") == pytest.approx(22.5)  # its 45% share
    clock.t = 20.0
    b.done("probe")
    assert b.allot("flops") == pytest.approx(10.0)  # 20% share
    clock.t = 21.0
    b.done("flops", ["FlopCounterMode count"])
    assert b.allot("microbatch") == pytest.approx(29.0)  # everything left
    clock.t = 49.0
    b.done("microbatch")
    r = b.report()
    assert r["spent_s"] == 49.0 and r["parts"]["flops"]["skipped"] == ["FlopCounterMode count"]
    assert lines[0].startswith("matmul ceiling and precisions (up to 22.5 s")
    assert any("skipped to stay in budget: FlopCounterMode count" in x for x in lines)


def test_micro_batch_sizes_are_planned_to_fit():
    # t(B=8) = 1 s; each size costs (1 + 4) x t(b): B alone is 5 s, 1 is 1.25 s, B/2 2.5 s, 2B 10 s
    assert plan_sizes(8, 1.0, 100.0, 2) == ([1, 4, 8, 16], [])
    assert plan_sizes(8, 1.0, 9.0, 2) == ([1, 4, 8], [16])
    assert plan_sizes(8, 1.0, 6.5, 2) == ([1, 8], [4, 16])
    assert plan_sizes(8, 1.0, 4.0, 2) == ([], [1, 4, 8, 16])  # the run's own size does not fit


def test_flop_count_skipped_when_one_forward_would_not_fit():
    clock = Clock()
    budget = PostRunBudget(10.0, clock=clock)
    summary = {"phases": {"forward": {"seconds": 40.0}}, "micro_steps": 4, "tokens_per_step": 1024}
    ctx = types.SimpleNamespace(config={"grad_accum": 4}, gpt_config=None, model=object(), example_args=(),
                                example_kwargs={}, autocast_dtype=None, budget=budget,
                                profile=types.SimpleNamespace(summary=summary))
    out = FlopsInstrument().stop(ctx)
    assert out["counted_per_step"] is None
    assert "one forward takes ~10.0 s, over the 2.0 s left" in out["errors"][0]
    assert budget.parts["flops"]["skipped"]


def test_the_budget_holds_on_a_slow_step():
    # bf16 on this CPU: a slow step (emulated matmuls); everything after it gets 3 s in all.
    from gpuprof.measure.instruments import default_instruments
    from gpuprof.runners.builtin import LoopConfig, run_builtin

    cfg = LoopConfig(model="tiny", n_layer=1, n_embd=64, n_head=2, batch_size=8, block_size=64,
                     grad_accum=2, steps=2, warmup=1, dtype="bf16", device="cpu")
    t0 = time.perf_counter()
    prof = run_builtin(cfg, instruments=default_instruments("cpu", None, samplers=False), post_budget_s=3.0)
    post = prof.measurements["post_run"]
    assert post["budget_s"] == 3.0
    # each part stops at its share; one repeat in flight may run over, never a whole extra sweep
    assert post["spent_s"] < 3.0 + 1.5, post
    assert set(post["parts"]) == {"probe", "flops", "microbatch"}
    assert time.perf_counter() - t0 < prof.run["run_wall_s"] + 3.0 + 10.0
