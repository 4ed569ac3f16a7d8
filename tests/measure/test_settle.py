"""More paired rounds where two fixes are tied (issue #29, measure/settle.py): the precision switch
and the larger micro-batch, both supported savings whose intervals overlap, get the rounds that
would order them, pooled with the first ones; a budget too small says the ranking was not settled.
The seconds are injected (FakeClock); the model really runs each way."""

import random
import types

import torch

from gpuprof.measure.budget import PostRunBudget
from gpuprof.measure.paired import Interval, paired_ratio_interval, seconds_saved, tied
from gpuprof.measure.settle import settle
from gpuprof.report.words import not_measured_lines
from measure.test_paired_timings import Tiny, fake_clock  # noqa: F401 - the fixture


def _rounds(ratio, n=8, spread=0.25, seed=0):
    rng = random.Random(seed)
    a = [0.010 * rng.uniform(0.9, 1.1) for _ in range(n)]
    b = [x * ratio * rng.uniform(1 - spread, 1 + spread) for x in a]
    return a, b


def _sections(r_prec=0.75, r_pair=0.80):
    a, b = _rounds(r_prec, seed=1)
    iv = paired_ratio_interval(a, b)
    switch = {"from": "fp32", "to": "bf16", "interval": iv.as_dict(), "rounds": iv.n, "ratio": iv.estimate,
              "round_seconds": {"fp32": a, "bf16": b}}
    a2, b2 = _rounds(r_pair, seed=2)
    iv2 = paired_ratio_interval(a2, b2)
    pair = {"batch_size": 2, "new_batch_size": 8, "interval": iv2.as_dict(), "rounds": iv2.n, "ratio": iv2.estimate,
            "round_seconds": {"run": a2, "larger": b2}}
    return {"probe": {"precisions": {"switch": switch}}, "microbatch": {"pair": pair}}


def _ctx():
    return types.SimpleNamespace(model=Tiny(), example_args=(torch.randn(2, 8),), example_kwargs={}, device="cpu",
                                 autocast_dtype=None)


def _saved(d):
    return seconds_saved(Interval.from_dict(d["interval"]), 1.0)


def test_tied_fixes_get_more_rounds_and_are_ordered(fake_clock):
    sec = _sections()
    sw, pr = sec["probe"]["precisions"]["switch"], sec["microbatch"]["pair"]
    assert tied(_saved(sw), _saved(pr))
    fake_clock({"fwd_bwd_fp32": 0.010, "fwd_bwd_bf16": 0.006, "run_way": 4 * 0.0025, "one_micro_step": 0.0025, "larger": 0.009})
    budget = PostRunBudget(100.0)
    out = settle(sec, _ctx(), budget)
    assert out["settled"] is True and out["between"] == ["precision-slow", "micro-batch-too-small"]
    assert out["rounds_added"][0] >= 2 and out["rounds_added"][1] >= 2
    assert sw["rounds"] == 8 + out["rounds_added"][0] == len(sw["round_seconds"]["bf16"])
    assert pr["rounds"] == 8 + out["rounds_added"][1] == len(pr["round_seconds"]["larger"])
    assert not tied(_saved(sw), _saved(pr)) and _saved(sw).estimate > _saved(pr).estimate
    assert sw["ratio"] == Interval.from_dict(sw["interval"]).estimate
    assert "settle" in budget.parts and budget.parts["settle"]["skipped"] == []


def test_nothing_tied_nothing_timed(fake_clock):
    sec = _sections(r_prec=0.5, r_pair=0.95)
    made = fake_clock({})
    budget = PostRunBudget(100.0)
    assert settle(sec, _ctx(), budget) is None and not made and "settle" not in budget.parts
    assert settle({"probe": {}}, _ctx(), budget) is None  # nothing timed in pairs


def test_no_time_left_says_the_ranking_is_not_settled(fake_clock):
    sec = _sections()
    made = fake_clock({})
    budget = PostRunBudget(0.01)
    out = settle(sec, _ctx(), budget)
    assert out["settled"] is False and "s left in the post-run budget" in out["why"] and not made
    assert budget.parts["settle"]["skipped"][0].startswith("the ranking of precision-slow and micro-batch-too-small")
    from gpuprof.profile import Profile

    p = Profile(run={"mode": "builtin", "config": {}}, steps=[], environment={}, measurements={"settle": out})
    (line,) = [x for x in not_measured_lines(p, None) if x.startswith("ranking not settled")]
    assert "precision-slow and micro-batch-too-small stay tied within noise" in line and "--post-budget" in line


def test_the_post_run_parts_end_with_the_settling_rounds(fake_clock):
    from gpuprof.measure.instruments import stop_instruments

    sec = _sections()
    fake_clock({"fwd_bwd_fp32": 0.010, "fwd_bwd_bf16": 0.006, "run_way": 4 * 0.0025, "one_micro_step": 0.0025, "larger": 0.009})

    class Part:
        def __init__(self, name):
            self.name = name

        def stop(self, ctx):
            return sec[self.name]

    out = stop_instruments([Part("probe"), Part("microbatch")], _ctx(), PostRunBudget(100.0))
    assert out["settle"]["settled"] is True and "settle" in out["post_run"]["parts"]


def _noisy_sections(r_prec=0.9, spread=0.3):
    """The precision switch's interval holds no change while its estimate is a saving (0.886,
    0.757-1.082: 14 more rounds planned)."""
    a, b = _rounds(r_prec, spread=spread, seed=3)
    iv = paired_ratio_interval(a, b)
    assert iv.enough and iv.low <= 1 <= iv.high and iv.estimate < 1
    switch = {"from": "fp32", "to": "bf16", "interval": iv.as_dict(), "rounds": iv.n, "ratio": iv.estimate,
              "round_seconds": {"fp32": a, "bf16": b}}
    return {"probe": {"precisions": {"switch": switch}}, "microbatch": {"pair": {"not_measured": "no time"}}}


def test_a_saving_within_noise_gets_the_rounds_planned_to_decide_it(fake_clock):
    # issue #29: the budget left goes where an interval is undecided, not only to a tie. The truth
    # (injected) is a 40% faster way: the planned rounds, pooled, exclude no change.
    sec = _noisy_sections()
    sw = sec["probe"]["precisions"]["switch"]
    made = fake_clock({"fwd_bwd_fp32": 0.010, "fwd_bwd_bf16": 0.006})
    budget = PostRunBudget(100.0)
    out = settle(sec, _ctx(), budget)
    (d,) = out["noise"]
    assert d["fix"] == "precision-slow" and d["rounds_before"] == 8 and d["planned"] > 0 and made
    assert d["rounds_added"] >= 2 and sw["rounds"] == 8 + d["rounds_added"] == len(sw["round_seconds"]["bf16"])
    assert d["within_noise"] is False and Interval.from_dict(sw["interval"]).high < 1
    assert "between" not in out and budget.parts["settle"]["skipped"] == []


def test_a_saving_within_noise_with_no_time_left_says_it_was_not_decided(fake_clock):
    sec = _noisy_sections()
    made = fake_clock({})
    budget = PostRunBudget(0.01)
    out = settle(sec, _ctx(), budget)
    (d,) = out["noise"]
    assert d["rounds_added"] == 0 and d["within_noise"] is True and "s left in the post-run budget" in d["why"]
    assert not made and budget.parts["settle"]["skipped"][0].startswith("precision-slow: 0 of the")
    from gpuprof.profile import Profile

    p = Profile(run={"mode": "builtin", "config": {}}, steps=[], environment={}, measurements={"settle": out})
    (line,) = [x for x in not_measured_lines(p, None) if x.startswith("precision-slow not decided")]
    assert f"0 of the {d['planned']} more paired rounds" in line and "--post-budget" in line


def test_a_loss_or_a_hopeless_interval_gets_no_more_rounds(fake_clock):
    made = fake_clock({})
    budget = PostRunBudget(100.0)
    # the estimate is a loss (the changed way slower): nothing to decide for a saving
    a = [0.010] * 8
    b = [0.010 * (1 + e) for e in (-0.05, 0.12, -0.04, 0.1, 0.02, 0.08, -0.06, 0.09)]
    iv = paired_ratio_interval(a, b)
    sec = {"probe": {"precisions": {"switch": {"from": "fp32", "to": "bf16", "interval": iv.as_dict(),
                                                "round_seconds": {"fp32": a, "bf16": b}}}}}
    assert iv.estimate > 1 and iv.low < 1 and settle(sec, _ctx(), budget) is None and not made
    # an estimate so near no change that more than 64 rounds would be needed
    a = [0.010] * 8
    b = [0.010 * (1 + e) for e in (-0.2, 0.19, -0.18, 0.2, -0.01, 0.005, -0.21, 0.18)]
    iv = paired_ratio_interval(a, b)
    sec["probe"]["precisions"]["switch"].update(interval=iv.as_dict(), round_seconds={"fp32": a, "bf16": b})
    assert iv.estimate < 1 and settle(sec, _ctx(), budget) is None and not made and "settle" not in budget.parts
