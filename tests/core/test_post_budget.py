"""The post-run budget: one time budget shared by the ceiling/precision probe, the FLOP count and
the micro-batch curve, each shrinking its work to fit and saying what it skipped.

Nothing here depends on how fast the machine runs: the budget's rules are checked on a clock the
test moves (fake parts spend exactly the seconds they are told to), the real parts are checked
with nothing left (they skip without computing), and the one real run is checked only against
what its own recorded figures imply, never against wall time."""

import types

import pytest
import torch

from gpuprof.measure.budget import SHARES, PostRunBudget, per_micro_s
from gpuprof.measure.flops import FlopsInstrument
from gpuprof.measure.instruments import stop_instruments
from gpuprof.measure.microbatch import CURVE_SHARE, MicroBatchProbe, plan_sizes
from gpuprof.measure.probe import CeilingProbe


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _measured(forward_s: float, backward_s: float = 0.0, micro_steps: int = 1, tokens_per_step: int = 1024):
    """The run's measured figures the post-run parts size their work with (phase seconds per
    step, micro-steps per step), as a profile gives them: its step statistics (`stats`)."""
    seconds = {"forward": forward_s, "backward": backward_s}
    stats = types.SimpleNamespace(seconds=lambda phase: seconds.get(phase, 0.0), micro_steps=micro_steps,
                                  tokens_per_step=tokens_per_step)
    return types.SimpleNamespace(stats=stats)


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
    ctx = types.SimpleNamespace(config={"grad_accum": 4}, gpt_config=None, model=object(), example_args=(),
                                example_kwargs={}, autocast_dtype=None, budget=budget,
                                profile=_measured(forward_s=40.0, micro_steps=4))  # 10 s per micro-step
    out = FlopsInstrument().stop(ctx)
    assert out["counted_per_step"] is None
    assert "one forward takes ~10.0 s, over the 2.0 s left" in out["errors"][0]
    assert budget.parts["flops"]["skipped"]


# ------------------------------------------------------------- the budget's rules, on a fake clock
class Part:
    """A post-run part on the test's clock, as the real ones behave: it asks for its allotment,
    skips when none is left, else spends `cost` seconds (its whole allotment when cost is None;
    more than it when a repeat in flight runs over). `fail`: it raises after spending."""

    def __init__(self, name: str, clock: Clock, cost: float | None = None, fail: bool = False):
        self.name, self.clock, self.cost, self.fail = name, clock, cost, fail
        self.allotted = None

    def start(self, ctx):
        pass

    def stop(self, ctx):
        self.allotted = ctx.budget.allot(self.name)
        if self.allotted <= 0:
            ctx.budget.done(self.name, ["all of it: no time left"])
            return {"not_measured": "no time left"}
        self.clock.t += self.allotted if self.cost is None else self.cost
        if self.fail:
            raise RuntimeError("the part broke")
        ctx.budget.done(self.name)
        return {"measured": True}


class Pause:
    """An instrument outside the budget that takes time to stop (a sampler joining its thread):
    the post-run parts after it have that much less."""

    name = "pause"

    def __init__(self, clock: Clock, seconds: float):
        self.clock, self.seconds = clock, seconds

    def start(self, ctx):
        pass

    def stop(self, ctx):
        self.clock.t += self.seconds
        return None


def _run_parts(total_s: float, clock: Clock, *parts) -> dict:
    budget = PostRunBudget(total_s, clock=clock, source="test")
    return stop_instruments(list(parts), types.SimpleNamespace(), budget)


def _allotted(sections: dict) -> dict:
    return {n: pytest.approx(p["allotted_s"]) for n, p in sections["post_run"]["parts"].items()}


def test_each_part_gets_its_share_capped_by_what_is_left():
    clock = Clock()
    # Parts that use their whole share: 45% and 20%, then the curve gets the 35% left.
    out = _run_parts(10.0, clock, Part("probe", clock), Part("flops", clock), Part("microbatch", clock))
    assert {n: p["allotted_s"] for n, p in out["post_run"]["parts"].items()} == pytest.approx(
        {"probe": 4.5, "flops": 2.0, "microbatch": 3.5})
    assert out["post_run"]["spent_s"] == pytest.approx(10.0)
    # Cheap parts leave their unused share to the curve (its share is the whole budget).
    clock = Clock()
    out = _run_parts(10.0, clock, Part("probe", clock, cost=1.0), Part("flops", clock, cost=0.5),
                     Part("microbatch", clock))
    assert {n: p["allotted_s"] for n, p in out["post_run"]["parts"].items()} == pytest.approx(
        {"probe": 4.5, "flops": 2.0, "microbatch": 8.5})
    assert all(p["skipped"] == [] for p in out["post_run"]["parts"].values())


def test_a_part_that_overruns_is_charged_to_the_parts_after_it():
    clock = Clock()
    probe, flops, curve = Part("probe", clock, cost=7.0), Part("flops", clock), Part("microbatch", clock)
    out = _run_parts(10.0, clock, probe, flops, curve)  # the probe runs 2.5 s over its 4.5 s
    parts = out["post_run"]["parts"]
    assert parts["probe"] == {"allotted_s": 4.5, "spent_s": 7.0, "skipped": []}
    assert (flops.allotted, curve.allotted) == pytest.approx((2.0, 1.0))  # 3 s left: flops' share, then 1 s
    clock = Clock()
    probe, flops, curve = Part("probe", clock, cost=9.5), Part("flops", clock), Part("microbatch", clock)
    out = _run_parts(10.0, clock, probe, flops, curve)
    assert (flops.allotted, curve.allotted) == pytest.approx((0.5, 0.0))  # capped by what is left, then none
    assert out["post_run"]["parts"]["microbatch"]["skipped"] == ["all of it: no time left"]
    assert out["microbatch"] == {"not_measured": "no time left"}
    assert out["post_run"]["spent_s"] == pytest.approx(10.0)  # the overrun is not repeated by later parts


def test_time_outside_the_parts_counts_and_parts_skip_when_nothing_is_left():
    clock = Clock()
    out = _run_parts(10.0, clock, Pause(clock, 7.0), Part("probe", clock), Part("flops", clock),
                     Part("microbatch", clock))
    assert _allotted(out) == {"probe": 3.0, "flops": 0.0, "microbatch": 0.0}
    assert [out["post_run"]["parts"][n]["skipped"] for n in ("flops", "microbatch")] == [
        ["all of it: no time left"]] * 2
    clock = Clock()
    out = _run_parts(10.0, clock, Pause(clock, 12.0), Part("probe", clock), Part("microbatch", clock))
    assert _allotted(out) == {"probe": 0.0, "microbatch": 0.0}
    assert out["post_run"]["spent_s"] == 12.0 and "pause" not in out["post_run"]["parts"]


def test_a_part_that_fails_is_closed_with_why_and_its_time_charged():
    clock = Clock()
    curve = Part("microbatch", clock)
    out = _run_parts(10.0, clock, Part("probe", clock, cost=2.0, fail=True), curve)
    assert out["probe"]["not_measured"] == "probe failed: RuntimeError: the part broke"
    probe = out["post_run"]["parts"]["probe"]
    assert probe["spent_s"] == 2.0 and probe["skipped"] == ["probe stopped early: probe failed: RuntimeError: the part broke"]
    assert curve.allotted == pytest.approx(8.0)


def test_the_real_parts_skip_their_work_when_nothing_is_left():
    """The probe, the FLOP count and the micro-batch curve with the budget spent: each reports
    what it skipped and computes nothing (the clock does not move, so nothing could be timed)."""
    clock = Clock()
    budget = PostRunBudget(3.0, clock=clock)
    clock.t = 3.0  # the samplers' and the storage facts' stop took it all
    ctx = types.SimpleNamespace(device="cpu", precision={"compute_dtype": "fp32"}, config={"grad_accum": 2},
                                gpt_config=None, model=torch.nn.Linear(4, 4), example_args=(torch.zeros(8, 4),),
                                example_kwargs={}, autocast_dtype=None,
                                profile=_measured(forward_s=0.02, backward_s=0.04, micro_steps=2))
    out = stop_instruments([CeilingProbe(), FlopsInstrument(), MicroBatchProbe()], ctx, budget)
    parts = out["post_run"]["parts"]
    assert list(parts) == ["probe", "flops", "microbatch"]
    assert all(p["allotted_s"] == 0.0 and p["spent_s"] == 0.0 and p["skipped"] for p in parts.values())
    assert out["probe"]["tflops"] is None and "no time left" in out["probe"]["not_measured"]
    assert "no time left" in out["probe"]["precisions"]["not_measured"]
    assert out["flops"]["counted_per_step"] is None and "count skipped" in out["flops"]["errors"][0]
    assert out["microbatch"]["points"] == [] and "do not fit the 0.0 s left" in out["microbatch"]["not_measured"]
    assert out["post_run"]["spent_s"] == 3.0


def test_the_budget_holds_on_a_slow_step():
    """A real run (bf16 on a CPU: emulated matmuls on most) with 3 s for everything after it.
    How much each part could do depends on the machine; what is checked does not: every part
    reports, none was allotted more than its share or than what the parts before it left, and
    the FLOP count and the curve did what their allotments and the run's own figures allow."""
    from gpuprof.measure.instruments import default_instruments
    from gpuprof.runners.builtin import LoopConfig, run_builtin

    cfg = LoopConfig(model="tiny", n_layer=1, n_embd=64, n_head=2, batch_size=8, block_size=64,
                     grad_accum=2, steps=2, warmup=1, dtype="bf16", device="cpu")
    prof = run_builtin(cfg, instruments=default_instruments("cpu", None, samplers=False), post_budget_s=3.0)
    post = prof.measurements["post_run"]
    assert post["budget_s"] == 3.0 and post["source"] == "--post-budget"
    parts = post["parts"]
    # every part reported, in order; `settle` after them where the precision switch and the larger
    # micro-batch both supported a saving and tied (measure/settle.py): it did on 2026-12-08's VM
    # (native bf16) beside a busy loop, and the list read [..., "microbatch", "settle"]
    assert list(parts)[:4] == ["probe", "flops", "kernels", "microbatch"] and list(parts)[4:] in ([], ["settle"])
    assert all(n in prof.measurements for n in parts)
    spent_before = 0.0
    for name, p in parts.items():
        assert 0.0 <= p["allotted_s"] <= SHARES[name] * 3.0 + 1e-9, (name, post)
        assert p["allotted_s"] <= 3.0 - spent_before + 1e-9, (name, post)  # what the parts before it left
        assert p["spent_s"] >= 0.0 and isinstance(p["skipped"], list)
        spent_before += p["spent_s"]
    assert post["spent_s"] >= spent_before - 1e-9
    # Each part sized its work from its allotment and the run's own seconds (not from the clock):
    run = types.SimpleNamespace(profile=prof)
    count_fits = 2 * per_micro_s(run, ("forward",)) <= parts["flops"]["allotted_s"]
    assert bool(parts["flops"]["skipped"]) == (not count_fits), (prof.measurements["flops"], post)
    if not count_fits:
        assert prof.measurements["flops"]["counted_per_step"] is None
    sizes, left_out = plan_sizes(cfg.batch_size, per_micro_s(run), parts["microbatch"]["allotted_s"] * CURVE_SHARE, 2)
    curve = prof.measurements["microbatch"]
    if len(sizes) < 2:
        assert curve["points"] == [] and parts["microbatch"]["skipped"] == ["the whole curve"]
    else:
        assert curve["skipped_sizes"] == left_out
        assert {pt["batch_size"] for pt in curve["points"]} <= set(sizes), curve
