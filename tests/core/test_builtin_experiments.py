"""Experiment steps in the built-in loop (gpuprof/runners/builtin_experiments.py; issue #41): the
fixes gpuprof can switch are timed on the loop's own next steps, kept out of the measured ones, a
per-forward switch nests inside the loop's autocast, a fix that fails ends them without losing the
run, and none run where they must not."""

import pytest
import torch

from gpuprof.analysis.pipeline import analyze
from gpuprof.measure.switches import Switch
from gpuprof.runners import builtin_experiments
from gpuprof.runners.builtin import LoopConfig, run_builtin

SMALL = dict(model="tiny", n_layer=1, n_embd=64, n_head=2, batch_size=4, block_size=64, grad_accum=2,
             steps=4, warmup=1, device="cpu")


def test_the_fused_optimizer_is_timed_on_the_loops_own_steps():
    # 8 s: the experiments' half holds 4 pairs (14 steps with the leads) of steps a loaded host slows 3x
    prof = run_builtin(LoopConfig(**SMALL), post_budget_s=8.0, experiments={})
    exp = prof.measurements["experiments"]
    (res,) = [r for r in exp["results"] if r["id"] == "optimizer:fused"]
    assert res["pairs"] >= 4 and res.get("interval") is not None
    assert len(res["a_s"]) == len(res["b_s"]) == res["pairs"]
    # on a CPU the host's phases are the step's: the pairs compare the optimizer phase the fix
    # changes, the whole steps' ratio kept beside it
    assert res["phases"] == ["optimizer"] and len(res["b_local_s"]) == res["pairs"] and res["step_interval"]
    # the measured steps are the run's own: warm-up 0, measured 1-4; every experiment step after them
    assert [s.index for s in prof.steps] == [1, 2, 3, 4]
    assert min(s["index"] for s in exp["steps"]) == 5
    assert {s["way"] for s in exp["steps"]} == {"a", "b"}
    assert prof.run["ended"] == "finished"
    (f,) = [x for x in analyze(prof).findings if x.id == "optimizer-not-fused"]
    assert f.evidence["measured_on"] == "your loop" and f.evidence["pairs"] == res["pairs"]


class Recording(Switch):
    """A per-forward switch that records the autocast state it was entered in."""

    id = "precision:probe"
    per_forward = True

    def __init__(self, fail: bool = False):
        self.entered, self.left, self.fail = [], 0, fail

    def enter(self):
        if self.fail:
            raise RuntimeError("this model refuses the fix")
        self.entered.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))

    def leave(self):
        self.left += 1


def test_a_per_forward_switch_is_entered_inside_the_loops_autocast(monkeypatch):
    sw = Recording()
    monkeypatch.setattr(builtin_experiments, "script_switches", lambda *a, **k: [sw])
    # 16 s (its experiments' share 8 s) and 32 tokens a row: 4 pairs with their leads are 14 steps, and
    # a loaded CI's emulated-bf16 steps at 64 tokens took ~0.48 s (8.4 s needed)
    prof = run_builtin(LoopConfig(**dict(SMALL, dtype="bf16", grad_accum=1, block_size=32)), post_budget_s=16.0,
                       experiments={})
    assert len(prof.measurements["experiments"]["results"]) == 1, prof.measurements["experiments"].get("skipped")
    (res,) = prof.measurements["experiments"]["results"]
    b_steps = sum(1 for s in prof.measurements["experiments"]["steps"] if s["way"] == "b")
    assert res["pairs"] >= 4 and b_steps >= 4
    # entered once per micro-step of every step with the fix on, each time inside the loop's bf16 autocast
    assert len(sw.entered) == b_steps and sw.left >= len(sw.entered)
    assert set(sw.entered) == {(True, torch.bfloat16)}


def test_a_fix_that_raises_ends_the_experiments_and_the_run_stands(monkeypatch):
    monkeypatch.setattr(builtin_experiments, "script_switches", lambda *a, **k: [Recording(fail=True)])
    # planned only where 4 pairs fit (14 steps with the leads): 4 s of experiments for a loaded host's steps
    prof = run_builtin(LoopConfig(**SMALL), post_budget_s=8.0, experiments={})
    (res,) = prof.measurements["experiments"]["results"]
    assert "RuntimeError: this model refuses the fix" in res["not_measured"]
    assert len(prof.steps) == 4 and prof.run["ended"] == "finished"


def test_none_without_the_option_nor_where_every_rank_would_have_to_switch():
    assert "experiments" not in run_builtin(LoopConfig(**SMALL), post_budget_s=0.0).measurements
    kw = dict(device="cpu", precision={}, autocast_dtype=None, optimizer=None, model=None, compiled=False,
              budget=lambda: None, cudagraphs=False, timing=True)
    assert builtin_experiments.plan({}, distributed=True, **kw) is None
    assert builtin_experiments.plan(None, distributed=False, **kw) is None
    assert builtin_experiments.plan({}, distributed=False, **dict(kw, cudagraphs=True)) is None
    assert builtin_experiments.plan({}, distributed=False, **kw) is not None


def test_on_a_gpu_computing_bf16_natively_fp32_is_not_tried(fake_cuda):
    from gpuprof.measure.switches import script_switches

    (sw,) = script_switches("cuda", {"compute_dtype": "bf16"}, torch.bfloat16, None, None, compiled=False,
                            measure_compile=False)
    assert sw.id == "precision:fp32" and "natively" in sw.why_not()
    # on a CPU the bf16 autocast is tried off (emulated bf16 can be many times slower)
    (cpu,) = script_switches("cpu", {"compute_dtype": "bf16"}, torch.bfloat16, None, None, compiled=False,
                             measure_compile=False)
    assert cpu.id == "precision:fp32" and cpu.why_not() is None
