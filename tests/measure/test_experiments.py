"""Experiment steps in the script's own loop (gpuprof/measure/experiments.py, switches.py): the
schedule (warm-up with the fix, pairs in ABBA order, each timed step after a step of its own way), the budget (planned one fix
at a time on what is left, an open pair completed when the time runs out), every switch restored,
and on real scripts: the fix is on exactly in the steps recorded as `b`, the measured steps and the
run's counts are not the experiments', the script's own objects are left as they were."""

import io
import textwrap

import pytest
import torch

from gpuprof.measure import experiment_plan as plan
from gpuprof.measure import experiments as ex
from gpuprof.measure.budget import PostRunBudget
from gpuprof.measure.switches import AutocastSwitch, FusedAdamSwitch
from gpuprof.runners.script import run_script


def test_the_schedule_warms_the_fix_up_then_pairs_in_abba_order_each_timed_step_after_its_own_way():
    F, T = False, True
    assert plan.schedule(4, 1) == [("b", F),
                                 ("a", F), ("a", T), ("b", F), ("b", T),  # (a, b): each after a lead
                                 ("b", T), ("a", F), ("a", T),  # (b, a): b follows a b step already
                                 ("a", T), ("b", F), ("b", T),
                                 ("b", T), ("a", F), ("a", T)]
    assert plan.schedule(4, 2)[:4] == [("b", F), ("b", F), ("a", F), ("a", T)]
    assert plan.schedule(2, 0)[:2] == [("a", F), ("a", T)]  # before it: another fix's step, or the run's
    for pairs, warmup in ((1, 0), (5, 1), (9, 2), (64, 1)):
        steps = plan.schedule(pairs, warmup)
        assert len(steps) == plan.steps_needed(pairs, warmup) and sum(t for _, t in steps) == 2 * pairs
        assert all(steps[i - 1][0] == w for i, (w, t) in enumerate(steps) if t)  # never timed after a switch


def test_a_fix_gets_the_pairs_that_fit_and_is_skipped_with_why_when_four_do_not():
    sw = _FakeSwitch("x")
    planned, why = plan.plan_one(sw, step_s=0.1, seconds=100.0)
    assert planned.pairs == plan.MAX_PAIRS and why == ""
    planned, _ = plan.plan_one(sw, step_s=0.1, seconds=3.0)  # 24 steps of 0.125 s: 1 warm-up + 1 + 3 per pair
    assert planned.pairs == 7 and planned.steps == plan.schedule(7, 1)
    planned, why = plan.plan_one(sw, step_s=0.1, seconds=1.6)  # (1 + 1 + 3·4)·0.125 s = 1.75 s needed
    assert planned is None and why == ("x: 4 pairs of ~0.10 s steps (each way once, each after a step of its "
                                       "own way) do not fit the 1.6 s left")


class _FakeSwitch:
    per_forward = False
    warmup_steps = 1
    phases = None  # the whole step (gpuprof.measure.switches.Switch)

    def __init__(self, id, why=None, log=None):
        self.id, self._why, self.log = id, why, log if log is not None else []
        self.fix, self.settings = f"fix {id}", {}

    def why_not(self):
        return self._why

    def on(self):
        self.log.append(f"{self.id} on")

    def off(self):
        self.log.append(f"{self.id} off")

    def restore(self):
        self.log.append(f"{self.id} restore")

    def enter(self):  # a per-forward switch's part (gpuprof.measure.switches.Switch has both)
        pass

    def leave(self):
        pass

    def describe(self):
        return {"id": self.id, "fix": self.fix, "settings": {}}


class _FakeTimer:
    def __init__(self):
        self.walls, self.listener = [0.1] * 5, object()

    def host_walls(self):
        return self.walls

    def last_index(self):
        return len(self.walls) - 1


class _FakeHooks:
    def __init__(self):
        self.timer, self.counts, self.forward_watchers = _FakeTimer(), {"forward": 7}, []

    def close(self, seconds=0.1):
        """A step closed: what the hooks do at each experiment step's end."""
        self.timer.walls.append(seconds)
        self.counts["forward"] += 1


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _experiments(switches, seconds=20.0, clock=None):
    from gpuprof.measure.budget import SHARES

    budget = PostRunBudget(seconds / SHARES["experiments"])  # the experiments' share: `seconds`
    return ex.Experiments(lambda: switches, lambda: budget, clock=clock or _Clock(), host_phases=True), budget


def test_each_step_runs_its_way_and_everything_is_restored_at_the_end():
    log = []
    a, b, no = _FakeSwitch("a", log=log), _FakeSwitch("b", log=log), _FakeSwitch("n", why="not here")
    exps, budget = _experiments([a, no, b])
    hooks = _FakeHooks()
    ways = []
    timed = 0
    while exps.next_step(hooks):
        _, way, is_timed = exps._open
        ways.append(way)
        # pairs whose ratio is 3, then 1/3, ...: never decided, every pair planned runs
        big = (timed // 2) % 2 == (way == "a")
        timed += is_timed
        hooks.close(0.15 if big else 0.05)
    pa, pb = (p.pairs for p in exps.planned)
    assert pa == 26  # its part: half of the 20 s share (one fix after it): 80 steps of 0.125 s, (80 - 2) / 3
    assert ways == [w for w, _ in plan.schedule(pa, 1)] + [w for w, _ in plan.schedule(pb, 1)]
    # on for each run of b steps, off before each a step (never twice on)
    assert log[:4] == ["a on", "a off", "a on", "a off"] and log[-2:] == ["a restore", "b restore"]
    assert exps.not_applicable == {"n": "not here"} and hooks.counts == {"forward": 7}  # the run's counts
    assert hooks.timer.listener is None and "experiments" in budget.parts
    steps = {r["index"]: 0.2 if r["way"] == "b" else 0.1 for r in exps.records}
    sec = exps.section(steps)
    res = {r["id"]: r for r in sec["results"]}
    assert res["a"]["pairs"] == pa and res["a"]["ratio"] == pytest.approx(2.0)
    assert res["a"]["interval"]["low"] == pytest.approx(2.0) and len(sec["steps"]) == len(ways)


def test_a_fix_is_decided_early_once_its_pairs_give_a_narrow_interval():
    exps, _ = _experiments([_FakeSwitch("a")])
    hooks = _FakeHooks()
    while exps.next_step(hooks):
        hooks.close(0.2 if exps._open[1] == "b" else 0.1)  # the fix doubles the step, every time
    assert len([r for r in exps.records if r["timed"]]) == 2 * plan.DECIDED_AFTER


def _noisy_pairs(b_s: float, seed: int) -> tuple[list, list]:
    """One fix's experiment on steps of 0.1 s (a) and `b_s` (b), each ±15% at random: the timed
    steps' seconds of each way, in pair order, until the experiments stop it."""
    import random

    rng = random.Random(seed)
    exps, _ = _experiments([_FakeSwitch("a")], seconds=40.0)
    hooks = _FakeHooks()
    while exps.next_step(hooks):
        hooks.close((b_s if exps._open[1] == "b" else 0.1) * rng.uniform(0.85, 1.15))
    timed = [r for r in exps.records if r["timed"]]
    return [r["host_s"] for r in timed if r["way"] == "a"], [r["host_s"] for r in timed if r["way"] == "b"]


def test_a_noisy_fix_runs_on_until_its_interval_is_within_the_promise_width():
    """A 10% saving on steps that vary ±15%: excluding no change is not enough to stop (the
    promise must be within ±5 points of the step); it stops once ±DECIDED_HALF, or at its pairs."""
    a, b = _noisy_pairs(0.09, seed=3)
    pairs = len(a)
    iv = ex.paired_ratio_interval(a, b)
    assert plan.DECIDED_AFTER < pairs < plan.MAX_PAIRS and (iv.high - iv.low) / 2 <= plan.DECIDED_HALF
    early = ex.paired_ratio_interval(a[:plan.DECIDED_AFTER], b[:plan.DECIDED_AFTER])
    assert (early.high - early.low) / 2 > plan.DECIDED_HALF  # the old rule's stop: too wide to promise


def test_a_large_saving_is_decided_once_its_interval_is_within_a_third_of_it():
    """A 20% saving on steps that vary ±15%: the claim's bar is half of it, so ±4 points is more
    than it needs; the fix stops at the first pair count whose interval is within a third of the
    saving it shows (wider than ±4 points), not later."""
    a, b = _noisy_pairs(0.08, seed=5)
    pairs = len(a)
    iv = ex.paired_ratio_interval(a, b)
    assert plan.decided_width(iv) and (iv.high - iv.low) / 2 > plan.DECIDED_HALF  # decided by the third
    assert (iv.high - iv.low) / 2 <= plan.DECIDED_REL * (1 - iv.estimate)
    assert all(not plan.decided_width(ex.paired_ratio_interval(a[:n], b[:n])) for n in range(plan.DECIDED_AFTER, pairs))
    assert 0.75 < iv.estimate < 0.85


def test_decided_width_holds_a_small_effect_to_four_points_and_a_slowdown_to_a_third():
    """An interval holding no change is decided only where it rules out 5% either way: a real 5%
    saving must not stop unclaimed."""
    from types import SimpleNamespace as NS

    assert plan.decided_width(NS(estimate=0.98, low=0.96, high=1.01))  # ±2.5 points, nothing of 5% left
    assert not plan.decided_width(NS(estimate=0.98, low=0.941, high=1.014))  # ±3.6, but a 5.9% saving possible
    assert plan.decided_width(NS(estimate=0.96, low=0.94, high=0.98))  # ±2 points, no change excluded
    assert not plan.decided_width(NS(estimate=0.95, low=0.90, high=1.00))  # ±5 points of a 5% saving
    assert plan.decided_width(NS(estimate=1.30, low=1.22, high=1.36))  # ±7 points of a 30% slowdown
    assert not plan.decided_width(NS(estimate=1.12, low=1.05, high=1.20))  # ±7.5 points of 12%


def test_when_the_time_runs_out_the_open_pair_completes_and_the_rest_is_said():
    clock = _Clock()
    log = []
    exps, _ = _experiments([_FakeSwitch("a", log=log), _FakeSwitch("b", log=log)], seconds=10.0, clock=clock)
    hooks = _FakeHooks()
    n = 0
    while exps.next_step(hooks):
        n += 1
        if n == 3:  # warm-up b, a's lead, then the first pair's timed a: the time is up in mid-pair
            clock.t = 100.0
        hooks.close()
    # the pair (a, b) completed, b's lead first
    assert [(r["way"], r["timed"]) for r in exps.records] == [("b", False), ("a", False), ("a", True),
                                                              ("b", False), ("b", True)]
    assert exps.stopped_early and exps.skipped == ["b: not started, the experiments' share of the budget was spent"]
    assert log[-1] == "a restore"


# ------------------------------------------------------------------------------ real scripts
SCRIPT = '''
import torch, torch.nn as nn
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 64))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
seen = []
for i in range(5000):  # more steps than the run and its experiments take: it is stopped
    x = torch.randint(0, 64, (8, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x)
    seen.append(str(logits.dtype))
    nn.functional.cross_entropy(logits.float().view(-1, 64), x.view(-1)).backward()
    fused = opt.param_groups[0]["fused"]  # as this step's opt.step() reads it (after it, the next step's way is set)
    opt.step()
    opt.zero_grad()
    print(f"STEP {i} {seen[-1]} fused={fused}")
'''


@pytest.fixture(scope="module")
def looped(tmp_path_factory):
    path = tmp_path_factory.mktemp("exp") / "train.py"
    path.write_text(textwrap.dedent(SCRIPT))
    out = io.StringIO()
    run = run_script(str(path), [], steps=4, warmup=1, stdout=out, post_budget_s=30.0,
                     experiments={"compile": False})
    return run, out.getvalue()


def test_the_fix_is_on_exactly_in_the_steps_recorded_b(looped):
    run, out = looped
    p = run.profile
    sec = p.measurements["experiments"]
    ways = {r["index"]: (r["experiment"], r["way"]) for r in sec["steps"]}
    lines = {int(w[1]): (w[2], w[3]) for w in (ln.split() for ln in out.splitlines() if ln.startswith("STEP "))}
    assert {e for e, _ in ways.values()} == {"precision:fp32", "optimizer:fused"}
    for index, (exp, way) in ways.items():
        if index not in lines:
            continue  # the last experiment step's line: the script was stopped at its optimizer step
        dtype, fused = lines[index]
        assert dtype == ("torch.float32" if (exp, way) == ("precision:fp32", "b") else "torch.bfloat16"), index
        assert fused == ("fused=True" if (exp, way) == ("optimizer:fused", "b") else "fused=None"), index


def test_the_measured_steps_and_the_counts_are_the_runs_alone(looped):
    run, _ = looped
    p = run.profile
    assert run.ended == "stopped" and len(p.steps) == 4 and len(p.warmup_steps) == 1
    assert not {s.index for s in p.steps} & {r["index"] for r in p.measurements["experiments"]["steps"]}
    assert run.counts["optimizer_step"] == 5  # the measured run's 5 steps, not the experiments'
    res = {r["id"]: r for r in p.measurements["experiments"]["results"]}
    assert res["precision:fp32"]["pairs"] >= plan.MIN_PAIRS and res["precision:fp32"]["ratio"] > 0
    assert p.measurements["post_run"]["parts"]["experiments"]["spent_s"] <= 15.5


def test_autocast_and_fused_switches_leave_nothing_behind():
    lin = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-3)
    lin(torch.randn(2, 8)).sum().backward()
    opt.step()
    sw = FusedAdamSwitch(opt)
    assert sw.why_not() is None
    sw.on()
    assert opt.param_groups[0]["fused"] is True and opt.param_groups[0]["foreach"] is False
    lin(torch.randn(2, 8)).sum().backward()
    opt.step()  # fused, on the state the for-loop step made
    sw.off()
    assert opt.param_groups[0]["fused"] is None and opt.param_groups[0]["foreach"] is None
    ac = AutocastSwitch("cpu", "fp32", "bf16")
    ac.enter()
    assert lin(torch.randn(2, 8)).dtype == torch.bfloat16
    ac.leave()
    ac.restore()
    assert lin(torch.randn(2, 8)).dtype == torch.float32 and not torch.is_autocast_enabled("cpu")


def test_a_both_ways_switch_is_entered_around_the_forwards_of_both_ways_of_its_experiment_only():
    class BothWays(_FakeSwitch):
        per_forward = both_ways = True

    first, second = BothWays("first"), _FakeSwitch("second")
    exps, _ = _experiments([first, second])
    hooks = _FakeHooks()
    seen = []
    while exps.next_step(hooks):
        exp = exps.planned[exps._open[0]].switch.id
        seen.append((exp, exps._open[1], [w.switch.id for w in hooks.forward_watchers]))
        hooks.close()
    assert {(e, w, tuple(ws)) for e, w, ws in seen} == {("first", "a", ("first",)), ("first", "b", ("first",)),
                                                        ("second", "a", ()), ("second", "b", ())}
    assert hooks.forward_watchers == []


class _PhasedHooks(_FakeHooks):
    """Steps closed with their host phases (PhaseTimer.last_host_phases)."""

    def __init__(self):
        super().__init__()
        self.phases = [{"other": 0.1}] * 5
        self.timer.last_host_phases = lambda: self.phases[-1]

    def close_phases(self, phases: dict):
        self.phases = self.phases + [phases]
        self.close(sum(phases.values()))


def test_a_fix_that_changes_one_phase_is_decided_on_that_phase_not_on_the_others_noise():
    """fused AdamW changes the optimizer's step alone: 5 ms of a ~100-ms step whose data phase
    varies ±23%. The optimizer phase compared in each pair, the rest of the step taken as its `a`
    step's, decides at 8 pairs, within ±1 point; the whole steps' interval is over 5× as wide."""
    import random

    rng = random.Random(5)
    sw = _FakeSwitch("opt")
    sw.phases = ("optimizer",)
    exps, _ = _experiments([sw], seconds=40.0)
    hooks = _PhasedHooks()
    steps = {}
    while exps.next_step(hooks):
        way = exps._open[1]
        ph = {"data": 0.065 * rng.uniform(0.77, 1.23), "optimizer": (0.015 if way == "b" else 0.020) * rng.uniform(0.98, 1.02),
              "other": 0.015}
        hooks.close_phases(ph)
        steps[hooks.timer.last_index()] = ph
    timed = [r for r in exps.records if r["timed"]]
    assert len(timed) == 2 * plan.DECIDED_AFTER and all(r["host_phases"] == steps[r["index"]] for r in timed)
    seconds = {i: sum(ph.values()) for i, ph in steps.items()}
    res = exps.section(seconds, steps)["results"][0]
    assert res["phases"] == ["optimizer"] and res["b_s"] == [seconds[r["index"]] for r in timed if r["way"] == "b"]
    truth = [(seconds[ia] - 0.005) / seconds[ia] for ia in (r["index"] for r in timed if r["way"] == "a")]
    iv, whole = res["interval"], res["step_interval"]
    from statistics import median
    assert iv["low"] <= median(truth) <= iv["high"] and (iv["high"] - iv["low"]) / 2 <= 0.01
    assert (whole["high"] - whole["low"]) > 5 * (iv["high"] - iv["low"])  # the data phase's noise, kept out
    # without the phases (CUDA with no GPU timeline): the whole steps, said by the absent fields
    plain = exps.section(seconds)["results"][0]
    assert "phases" not in plain and "b_local_s" not in plain and plain["interval"] == whole


def test_a_pair_without_its_phases_makes_every_pair_compare_whole_steps():
    timed = [{"index": 1, "way": "a"}, {"index": 2, "way": "b"}, {"index": 3, "way": "b"}, {"index": 4, "way": "a"}]
    seconds = {1: 0.10, 2: 0.12, 3: 0.11, 4: 0.09}
    phases = {1: {"optimizer": 0.02, "data": 0.08}, 2: {"optimizer": 0.01, "data": 0.11}}
    assert ex.paired_steps(timed, seconds, phases, ("optimizer",)) == ([0.10, 0.09], [0.12, 0.11], None)
    phases.update({3: {"optimizer": 0.01, "data": 0.10}, 4: {"optimizer": 0.02, "data": 0.07}})
    a, b, whole = ex.paired_steps(timed, seconds, phases, ("optimizer",))
    assert a == [0.10, 0.09] and b == pytest.approx([0.09, 0.08]) and whole == [0.12, 0.11]
    assert ex.paired_steps(timed, seconds, phases, None) == ([0.10, 0.09], [0.12, 0.11], None)
