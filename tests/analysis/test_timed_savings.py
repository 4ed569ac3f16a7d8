"""precision-slow and micro-batch-too-small claim what their paired rounds support (issue #29): a
real effect gives a saving with an interval that holds the injected truth and a confidence from
that interval; no effect is within noise, with no saving claimed; a profile without rounds falls
back to the point figure at confidence "low". The rounds are injected (seeded), never timed here."""

import random

import pytest

from gpuprof.analysis.findings import Context
from gpuprof.analysis.rules import batching, precision
from gpuprof.measure.paired import confidence, paired_ratio_interval


def _rounds(ratio: float, n: int = 12, noise: float = 0.05, seed: int = 3):
    """n paired rounds of a 100 ms way and the changed way at `ratio` of it, each round with a
    shared drift and its own ±noise."""
    rng = random.Random(seed)
    a, b = [], []
    for _ in range(n):
        drift = rng.uniform(0.9, 1.3)
        a.append(0.1 * drift * (1 + rng.uniform(-noise, noise)))
        b.append(0.1 * ratio * drift * (1 + rng.uniform(-noise, noise)))
    return a, b, paired_ratio_interval(a, b)


# ------------------------------------------------------------------ precision-slow
def _precision_ctx(profile_factory, switch):
    probe = {"precisions": {"m": 512, "shapes": [{"k": 256, "n": 256, "count": 4, "flops_share": 1.0}],
                            "tflops": {"fp32": 0.1, "bf16": 0.3}, "switch": switch}}
    p = profile_factory({"forward": 0.1, "backward": 0.2, "optimizer": 0.02}, measurements={"probe": probe},
                        config={"precision": {"compute_dtype": "fp32", "param_dtype": "float32"}})
    return Context(profile=p, stats=p.stats)


def _switch(iv=None, ratio=None, a=None, b=None):
    out = {"from": "fp32", "to": "bf16", "ratio": iv.estimate if iv else ratio, "run_fwd_bwd_per_micro_s": 0.075,
           "fwd_bwd_per_micro_s": 0.05, "eager_fwd_bwd_per_micro_s": 0.08}
    if iv is not None:
        out.update(interval=iv.as_dict(), rounds=iv.n, round_seconds={"fp32": a, "bf16": b})
    return out


def test_precision_real_effect_claims_the_saving_with_its_interval(profile_factory):
    a, b, iv = _rounds(0.6)
    (f,) = precision.precision_slow(_precision_ctx(profile_factory, _switch(iv, a=a, b=b)))
    compute = 0.3
    assert f.kind == "fix" and f.saving_s == pytest.approx(compute * (1 - iv.estimate))
    ev = f.evidence
    assert ev["saving_low_s"] <= compute * 0.4 <= ev["saving_high_s"]  # holds the injected truth
    assert ev["saving_low_s"] > 0 and ev["rounds"] == 12 and ev["interval_level"] == iv.level
    assert f.confidence == confidence(iv) and "autocast" in f.fix
    assert "12 paired rounds" in f.note and f.claims["forward"] + f.claims["backward"] == pytest.approx(f.saving_s)


def test_precision_no_effect_is_within_noise_and_claims_nothing(profile_factory):
    a, b, iv = _rounds(1.0)
    (f,) = precision.precision_slow(_precision_ctx(profile_factory, _switch(iv, a=a, b=b)))
    assert f.kind == "info" and f.saving_s is None and f.confidence == "low"
    assert f.evidence["within_noise"] and f.evidence["saving_low_s"] < 0 < f.evidence["saving_high_s"]
    assert "within this machine's noise" in f.note and f.config_overrides == {} and f.claims == {}


def test_precision_old_profile_falls_back_to_the_point_figure(profile_factory):
    (f,) = precision.precision_slow(_precision_ctx(profile_factory, _switch(ratio=0.7)))
    assert f.kind == "fix" and f.saving_s == pytest.approx(0.3 * 0.3) and f.confidence == "low"
    assert f.evidence["interval_measured"] is False and "saving_low_s" not in f.evidence
    assert "interval not measured" in f.note


def test_precision_too_few_rounds_give_the_point_figure_at_low_confidence(profile_factory):
    a, b, iv = _rounds(0.6, n=3)
    assert not iv.enough
    (f,) = precision.precision_slow(_precision_ctx(profile_factory, _switch(iv, a=a, b=b)))
    assert f.saving_s == pytest.approx(0.3 * (1 - iv.estimate)) and f.confidence == "low"
    assert "3 paired rounds, too few for a 90% interval" in f.note


# ------------------------------------------------------------------ the runner-up (a CPU with fast bf16 matmuls)
def _runner_up_ctx(profile_factory, iv, a, b):
    """A bf16 CPU run whose bf16 matmuls run 2x fp32's, the model timed in fp32 beside it."""
    switch = {"from": "bf16", "to": "fp32", "chosen_by": "runner-up", "ratio": iv.estimate,
              "run_fwd_bwd_per_micro_s": 0.075, "fwd_bwd_per_micro_s": 0.05, "eager_fwd_bwd_per_micro_s": 0.08,
              "interval": iv.as_dict(), "rounds": iv.n, "round_seconds": {"bf16": a, "fp32": b}}
    probe = {"precisions": {"m": 512, "shapes": [{"k": 256, "n": 256, "count": 4, "flops_share": 1.0}],
                            "tflops": {"fp32": 0.1, "bf16": 0.2}, "switch": switch}}
    p = profile_factory({"forward": 0.1, "backward": 0.2, "optimizer": 0.02}, measurements={"probe": probe},
                        config={"precision": {"compute_dtype": "bf16", "param_dtype": "float32"}})
    return Context(profile=p, stats=p.stats)


def test_a_faster_full_precision_step_is_found_though_its_matmuls_are_slower(profile_factory):
    a, b, iv = _rounds(0.7)
    (f,) = precision.precision_slow(_runner_up_ctx(profile_factory, iv, a, b))
    assert f.kind == "fix" and f.saving_s == pytest.approx(0.3 * (1 - iv.estimate))
    assert f.evidence["chosen_by"] == "runner-up" and f.evidence["faster_dtype"] == "fp32"
    assert f.evidence["saving_low_s"] <= 0.3 * 0.3 <= f.evidence["saving_high_s"]
    assert f"took {iv.estimate:.2f}x" in f.title and "matmuls run 2.0x faster" in f.title
    assert "the whole step does not" in f.because and f.config_overrides == {"dtype": "float32"}


def test_a_runner_up_within_noise_is_information_and_a_slower_one_nothing(profile_factory):
    a, b, iv = _rounds(1.0)
    (f,) = precision.precision_slow(_runner_up_ctx(profile_factory, iv, a, b))
    assert f.kind == "info" and f.saving_s is None and f.config_overrides == {}
    assert "whole step does not" not in f.because
    a, b, iv = _rounds(1.4)
    assert precision.precision_slow(_runner_up_ctx(profile_factory, iv, a, b)) == []


def test_the_runner_up_is_a_close_full_precision_beside_a_half_precision_run():
    from gpuprof.hardware import runner_up

    assert runner_up({"fp32": 1.0, "bf16": 2.0}, "bf16") == "fp32"
    assert runner_up({"fp32": 0.4, "bf16": 2.0}, "bf16") is None  # 5x slower matmuls: not timed
    assert runner_up({"fp32": 1.0, "bf16": 2.0}, "fp32") is None  # a full-precision run
    assert runner_up({"fp32": 0.5, "tf32": 1.0, "bf16": 2.0}, "bf16") == "tf32"


# ------------------------------------------------------------------ micro-batch-too-small
def _curve_ctx(profile_factory, pair=None, fixed=0.010):
    curve = {"fixed_s": fixed, "per_sample_s": 0.002,
             "points": [{"batch_size": b, "seconds": 0.010 + 0.002 * b} for b in (1, 2, 4)]}
    if pair is not None:
        curve["pair"] = pair
    p = profile_factory({"forward": 0.13, "backward": 0.26, "data": 0.01}, micro_steps=32,
                        config={"batch_size": 1, "block_size": 32}, measurements={"microbatch": curve})
    return Context(profile=p, stats=p.stats)


def _pair(iv, b2=8):
    return {"batch_size": 1, "new_batch_size": b2, "micro_steps_each": b2, "ratio": iv.estimate,
            "interval": iv.as_dict(), "rounds": iv.n}


def test_micro_batch_real_effect_recommends_the_timed_size(profile_factory):
    a, b, iv = _rounds(0.5)
    (f,) = batching.micro_batch_too_small(_curve_ctx(profile_factory, _pair(iv)))
    assert f.kind == "fix" and f.config_overrides == {"batch_size": 8, "gradient_accumulation_steps": 4}
    fwd_bwd = 0.39
    assert f.saving_s == pytest.approx(fwd_bwd * (1 - iv.estimate)) and f.confidence == confidence(iv)
    assert f.evidence["saving_low_s"] <= fwd_bwd * 0.5 <= f.evidence["saving_high_s"]
    assert "larger ones may save more, not timed" in f.note  # the curve would go to 32


def test_micro_batch_no_effect_is_within_noise(profile_factory):
    a, b, iv = _rounds(1.0)
    (f,) = batching.micro_batch_too_small(_curve_ctx(profile_factory, _pair(iv)))
    assert f.kind == "info" and f.saving_s is None and f.config_overrides == {} and f.confidence == "low"
    assert "within this machine's noise" in f.note and f.evidence["within_noise"]


def test_micro_batch_old_profile_keeps_the_curve_figure_at_low_confidence(profile_factory):
    (f,) = batching.micro_batch_too_small(_curve_ctx(profile_factory))
    assert f.saving_s == pytest.approx(0.39 * (1 - (0.010 + 0.002 * 32) / (32 * 0.012)))
    assert f.confidence == "low" and f.evidence["interval_measured"] is False
    assert "interval not measured: the profile has no paired rounds" in f.note
    (g,) = batching.micro_batch_too_small(_curve_ctx(profile_factory, {"not_measured": "no time left"}))
    assert g.saving_s == f.saving_s and "interval not measured: no time left" in g.note


def test_micro_batch_the_paired_rounds_decide_not_the_curves_threshold(profile_factory):
    # The unpaired curve alone is a threshold on one noisy figure: the same run's fix came and went
    # between reruns. With paired rounds their interval decides: a small fixed cost on the curve
    # (0.5 ms of a 12 ms micro-step: 4% of it, ~3% of the step, under FIXED_SHARE_MIN) no longer
    # silences a saving the rounds support, nor a within-noise result the user should see.
    a, b, iv = _rounds(0.5)
    # no rounds: the curve's small share is said, with no saving (it used to be left out)
    (quiet,) = batching.micro_batch_too_small(_curve_ctx(profile_factory, fixed=0.0005))
    assert (quiet.kind, quiet.saving_s, quiet.config_overrides) == ("info", None, {})
    (f,) = batching.micro_batch_too_small(_curve_ctx(profile_factory, _pair(iv), fixed=0.0005))
    assert f.kind == "fix" and f.saving_s == pytest.approx(0.39 * (1 - iv.estimate))
    assert f.evidence["share"] < batching.FIXED_SHARE_MIN
    _, _, flat = _rounds(1.0)
    (g,) = batching.micro_batch_too_small(_curve_ctx(profile_factory, _pair(flat), fixed=0.0005))
    assert g.kind == "info" and g.saving_s is None and "within this machine's noise" in g.note


def test_micro_batch_a_noisy_curve_does_not_hide_the_paired_rounds(profile_factory):
    # a fixed cost above a whole micro-step (12 ms) is not a reading of the run: the curve is not quoted
    a, b, iv = _rounds(0.5)
    assert batching.micro_batch_too_small(_curve_ctx(profile_factory, fixed=0.020)) == []
    (f,) = batching.micro_batch_too_small(_curve_ctx(profile_factory, _pair(iv), fixed=0.020))
    assert f.title == "micro-batch too small: 32 micro-steps of batch_size 1 per step"
    assert "too noisy to read a fixed cost" in f.because and f.evidence["share"] is None
    assert f.evidence["fixed_per_micro_s"] is None and f.saving_s == pytest.approx(0.39 * (1 - iv.estimate))


def test_micro_batch_high_end_holds_the_loop_code_that_runs_once_per_micro_step(profile_factory):
    """32 micro-steps become 4: the data phase (10 ms per step here) runs 4 times in place of 32,
    untimed, so up to 7/8 of it is added to the interval's high end only; the estimate, the low end
    and the claims stay the timed forward+backward."""
    a, b, iv = _rounds(0.5)
    (f,) = batching.micro_batch_too_small(_curve_ctx(profile_factory, _pair(iv)))
    fwd_bwd, extra = 0.39, 0.01 * (1 - 4 / 32)
    ev = f.evidence
    assert ev["untimed_loop_s"] == pytest.approx(extra)
    assert ev["saving_high_s"] == pytest.approx(fwd_bwd * (1 - iv.low) + extra)
    assert ev["saving_low_s"] == pytest.approx(fwd_bwd * (1 - iv.high))
    assert f.saving_s == pytest.approx(fwd_bwd * (1 - iv.estimate))
    assert sum(f.claims.values()) == pytest.approx(f.saving_s) and "not timed" in f.note


# ------------------------------------------------------------------ the transfer from the rounds to the run
def test_the_promise_allows_the_ratio_the_transfer_the_run_way_showed():
    """The rounds' run way took 0.4 s where the run's part is 0.3 s (τ = 4/3): nothing measured how
    the changed way moved, so the promised ratio runs from low ÷ τ to high × τ, on the run's part;
    the estimate and the claim stay the rounds' own."""
    from gpuprof.analysis.rules.intervals import timed_saving

    a, b, iv = _rounds(0.6)
    plain = timed_saving(iv.as_dict(), 0.3, iv.estimate)
    spanned = timed_saving(iv.as_dict(), 0.3, iv.estimate, timed_s=0.4)
    assert plain.evidence["saving_low_s"] == pytest.approx(0.3 * (1 - iv.high))
    assert spanned.estimate == pytest.approx(plain.estimate) and spanned.saving_s == pytest.approx(plain.saving_s)
    tau = 0.4 / 0.3
    assert spanned.evidence["transfer_factor"] == pytest.approx(tau)
    assert spanned.evidence["saving_low_s"] == pytest.approx(0.3 * (1 - iv.high * tau))
    assert spanned.evidence["saving_high_s"] == pytest.approx(0.3 * (1 - iv.low / tau))
    assert spanned.evidence["ratio_saving_high_s"] == pytest.approx(0.3 * (1 - iv.low))
    assert spanned.evidence["timed_part_s"] == 0.4 and "moved by the 1.33x" in spanned.note
    # an eager way 0.8x the run's: the same factor, the same interval
    below = timed_saving(iv.as_dict(), 0.3, iv.estimate, timed_s=0.24)
    assert below.evidence["saving_low_s"] == pytest.approx(0.3 * (1 - iv.high * 1.25))
    # the same seconds: the rounds' own interval, nothing added
    same = timed_saving(iv.as_dict(), 0.3, iv.estimate, timed_s=0.3)
    assert same.evidence == plain.evidence and "timed_part_s" not in same.evidence
    # the claim is the printed interval's: a transfer wide enough to hold no change leaves no
    # saving claimed (issue #29), though the rounds alone excluded it, and the note says why
    wide = timed_saving(iv.as_dict(), 0.3, iv.estimate, timed_s=0.9)
    assert wide.saving_s is None and wide.within_noise and wide.confidence == "low"
    assert wide.evidence["saving_low_s"] < 0 < wide.evidence["saving_high_s"]
    assert wide.evidence["rounds_within_noise"] is False and wide.evidence["within_noise"] is True
    assert "within this machine's noise" in wide.note and "the rounds alone excluded no change" in wide.note
    assert "3.00x faster than the run" not in wide.note and "3.00x slower than the run" in wide.note


def test_precision_promise_spans_the_eager_model_and_the_run(profile_factory):
    """precision-slow passes the rounds' run-dtype seconds at the step's scale (per micro-step ×
    micro-steps): a run whose eager model took 0.08 s per micro-step against its own 0.3 s of
    forward+backward per step widens the promised ratio by their factor."""
    a, b, iv = _rounds(0.6)
    ctx = _precision_ctx(profile_factory, _switch(iv, a=a, b=b))
    from gpuprof.analysis.rules.common import micro_steps

    (f,) = precision.precision_slow(ctx)
    timed = 0.08 * micro_steps(ctx)
    tau = max(timed / 0.3, 0.3 / timed)
    assert f.evidence["timed_part_s"] == pytest.approx(timed)
    assert f.evidence["saving_low_s"] == pytest.approx(0.3 * (1 - iv.high * tau))
    assert f.evidence["saving_high_s"] == pytest.approx(0.3 * (1 - iv.low / tau))


def test_untimed_loop_code_a_higher_fix_already_saves_is_not_counted_again(profile_factory):
    """The README's script: a data fix claims the 80 ms data phase; the micro-batch fix's high end
    would add 3/4 of that data phase (fewer get_batch calls) as untimed loop code. Ranked, the
    micro-batch keeps only what the data fix left of it: its high end drops back to its timed one."""
    from gpuprof.analysis.engine import rank
    from gpuprof.analysis.findings import Finding

    p = profile_factory({"data": 0.08, "forward": 0.01, "backward": 0.02, "other": 0.002}, micro_steps=4)
    data_fix = Finding(id="data-loading-exposed", title="data", saving_s=0.08, claims={"data": 0.08})
    timed_high, untimed = 0.012, {"data": 0.06, "other": 0.0015}
    mb = Finding(id="micro-batch-too-small", title="mb", saving_s=0.01, claims={"forward": 0.004, "backward": 0.006},
                 evidence={"saving_low_s": 0.008, "saving_high_s": timed_high + 0.0615, "untimed_loop_s": 0.0615,
                           "untimed_loop_phases": untimed})
    ranked = {f.id: f for f in rank([mb, data_fix], p.stats)}
    got = ranked["micro-batch-too-small"]
    assert got.evidence["saving_high_s"] == pytest.approx(timed_high + 0.0015)  # the data part is fix 1's
    assert got.evidence["untimed_loop_s"] == pytest.approx(0.0015)
    assert got.evidence["untimed_claimed_by"] == ["data-loading-exposed"]
    assert "already saved by data-loading-exposed" in got.note and got.saving_s == pytest.approx(0.01)
    # alone, nothing is taken out
    (alone,) = rank([mb], p.stats)
    assert alone.evidence["saving_high_s"] == pytest.approx(timed_high + 0.0615)


def test_the_spanned_high_end_never_exceeds_the_part_and_too_few_rounds_do_not_crash(profile_factory):
    """The rounds' seconds above the run's part: the promise is on the run's part, so its high end
    stays under the part however far the transfer widens the ratio. A micro-batch pair of 3 rounds (no
    interval) with loop phases gives the point figure, not a KeyError."""
    from gpuprof.analysis.rules.intervals import timed_saving
    from gpuprof.measure.paired import Interval

    iv = Interval(estimate=0.5, low=0.15, high=0.8, level=0.93, requested=0.9, n=8, statistic="sign")
    ts = timed_saving(iv.as_dict(), 0.10, 0.5, timed_s=0.125)
    assert ts.evidence["saving_high_s"] < 0.10 and ts.evidence["saving_low_s"] <= ts.estimate
    a, b, few = _rounds(0.5, n=3)
    (f,) = batching.micro_batch_too_small(_curve_ctx(profile_factory, _pair(few)))
    assert f.evidence["interval_measured"] is False and "untimed_loop_s" not in f.evidence


def test_a_phase_a_higher_fix_saves_in_part_leaves_its_share_of_the_untimed_code():
    """A data fix takes 20 of the 80 ms data phase; the micro-batch's 60 ms of untimed data (3/4 of
    the phase) keeps 3/4 of what is left: 45 ms, so 15 ms comes off its high end."""
    from gpuprof.analysis.engine import rank
    from gpuprof.analysis.findings import Finding
    from gpuprof.stats import step_stats
    from gpuprof.profile import StepRecord

    steps = [StepRecord(i, 0.112, {"data": 0.08, "forward": 0.01, "backward": 0.02, "other": 0.002},
                        tokens=64, micro_steps=4) for i in range(3)]
    stats = step_stats(steps)
    data_fix = Finding(id="data-loading-exposed", title="data", saving_s=0.02, claims={"data": 0.02})
    mb = Finding(id="micro-batch-too-small", title="mb", saving_s=0.01, claims={"forward": 0.004, "backward": 0.006},
                 evidence={"saving_low_s": 0.008, "saving_high_s": 0.012 + 0.06, "untimed_loop_s": 0.06,
                           "untimed_loop_phases": {"data": 0.06}})
    got = {f.id: f for f in rank([mb, data_fix], stats)}["micro-batch-too-small"]
    assert got.evidence["saving_high_s"] == pytest.approx(0.012 + 0.045)


def test_the_share_interval_is_the_promise_over_the_step():
    """The evening series of 2026-12-03 (docs/measurements/2026-12-03-advice-repeat.md): the run's
    bf16 forward+backward 0.518 s of a 0.525 s step, the rounds' own 0.707 s for the same work
    (τ = 1.365), the ratio 0.134-0.142. The old span's high end, the rounds' seconds × (1 − low)
    over the run's step, read 98.6%; the promise on the run's part with the ratio widened by τ
    reads 79.5-88.9%, and the plain reruns saved 84.4-86.7%."""
    from gpuprof.analysis.rules.intervals import timed_saving
    from gpuprof.measure.paired import Interval

    iv = Interval(0.1385, 0.1342, 0.1422, 0.9297, 0.9, 8, "sign")
    ev = timed_saving(iv.as_dict(), 0.5177, iv.estimate, timed_s=0.7067).evidence
    tau = 0.7067 / 0.5177
    assert ev["saving_low_s"] == pytest.approx(0.5177 * (1 - 0.1422 * tau))
    assert ev["saving_high_s"] == pytest.approx(0.5177 * (1 - 0.1342 / tau))
    low, high = ev["saving_low_s"] / 0.5248, ev["saving_high_s"] / 0.5248  # as shares of the step
    assert 0.794 <= low <= 0.796 and 0.888 <= high <= 0.890


def test_the_saves_line_gives_the_promise_as_shares_of_the_step(profile_factory):
    a, b, iv = _rounds(0.6)
    ctx = _precision_ctx(profile_factory, _switch(iv, a=a, b=b))
    from gpuprof.analysis.engine import with_share
    from gpuprof.report.model import finding_view
    from gpuprof.units import pct_range

    (f,) = precision.precision_slow(ctx)
    ev, step = f.evidence, ctx.stats.step_s
    assert ev["saving_low_s"] < ev["saving_high_s"] and "timed_part_s" in ev
    line = finding_view(with_share(f, step)).saves
    assert f"of the typical step, {pct_range(ev['saving_low_s'] / step, ev['saving_high_s'] / step)}" in line


def test_micro_batch_timed_slower_is_never_offered_as_a_change(profile_factory):
    # issue #40: the rounds timed the larger micro-batch at 1.30x the time, with an interval that
    # (on this noise) still holds no change: a slowdown, never shown as a fix's change
    a, b, iv = _rounds(1.30, n=6, noise=0.6, seed=17)
    assert iv.low < 1.0 < iv.high  # within noise, and 30% slower at its estimate
    (f,) = batching.micro_batch_too_small(_curve_ctx(profile_factory, _pair(iv)))
    assert f.kind == "info" and f.fix == "" and f.config_overrides == {} and f.settings == {}
    assert f.title.startswith("a larger micro-batch ran no faster: 4 micro-steps of batch_size 8 took 1.3")


def test_a_negative_figure_inside_the_noise_is_noise_a_material_one_is_slower():
    from gpuprof.analysis.rules.compute import outcome
    from gpuprof.analysis.rules.intervals import TimedSaving

    step = 0.1
    assert outcome(TimedSaving(-0.03, None, "low", within_noise=True), step) == "slower"  # 30% of the step slower
    assert outcome(TimedSaving(-0.0001, None, "low", within_noise=True), step) == "noise"
    assert outcome(TimedSaving(-0.0001, None, "high", within_noise=False), step) == "slower"  # a supported loss
    assert outcome(TimedSaving(0.02, 0.02, "high"), step) == "claim"
