"""analysis.compare on hand-built profiles: every figure of the difference, exactly."""

import pytest

from compare_profiles import BASE_PHASES, finding, hand, hand_analysis, hand_profile
from gpuprof.analysis.compare import compare, mfu_reason, verdict
from gpuprof.analysis.config_diff import config_changes
from gpuprof.analysis.mfu_results import MfuResult
from gpuprof.errors import GpuprofError
from gpuprof.report.compare import compare_view


def by_id(c):
    return {o.id: o for o in c.outcomes}


def test_step_tokens_and_mfu_use_the_typical_step(hand_pair):
    c = compare(*hand_pair)
    before = hand_pair[0]
    assert c.basis == "step" and c.unit == "s/step" and "compared per step" in c.basis_note
    # the step is the typical step (1.05 s: the irregular 2.0 s step left out), neither the median
    # (1.00 s) nor the mean of all steps (1.24 s): the step, the gate and tokens/s agree
    assert before.stats.median_s == pytest.approx(1.00) and before.stats.mean_s == pytest.approx(1.24)
    assert [s.index for s in before.stats.irregular] == [4]
    assert c.step_s.before == pytest.approx(1.05) and c.step_s.after == pytest.approx(0.75)
    assert c.step_s.change == pytest.approx(-0.30) and c.step_s.change_pct == pytest.approx(-0.30 / 1.05)
    assert c.slower_pct == pytest.approx(-30 / 1.05)
    assert c.tokens_per_s.before == pytest.approx(4096 / 1.05) and c.tokens_per_s.after == pytest.approx(4096 / 0.75)
    # MFU is each analysis's own figure
    assert c.mfu.before == pytest.approx(0.40 / 1.05) and c.mfu.after == pytest.approx(0.40 / 0.75)
    assert c.mfu.change == pytest.approx(0.40 / 0.75 - 0.40 / 1.05)
    assert c.mfu_vs_ceiling.after is None and c.mfu_vs_ceiling.change is None
    assert c.not_measured == {"mfu_vs_ceiling": "AFTER: no matmul ceiling measured in the step's dtype"}
    # the irregular step is said, with the mean step it would have made
    assert [n for n in c.notes if "irregular" in n] == [
        "BEFORE had 1 irregular step(s), left out of its typical step (the mean step with them: 1.24 s)"]


def test_mfu_reasons():
    assert mfu_reason(None, "mfu") == "not analysed"
    assert mfu_reason(MfuResult(flops_per_step=None), "mfu") == "FLOPs per step unknown"
    assert mfu_reason(MfuResult(flops_per_step=1e9, peak_tflops=None), "mfu") == "no datasheet peak for the device and dtype"
    repaired = MfuResult(flops_per_step=1e9, peak_tflops=1.0,
                         warnings=("mfu not measured: 120.0% would be impossible; the datasheet peak is not this step's",))
    assert mfu_reason(repaired, "mfu") == "120.0% would be impossible; the datasheet peak is not this step's"


def test_phases_seconds_and_shares(hand_pair):
    c = compare(*hand_pair)
    ph = {p.phase: p for p in c.phases}
    assert list(ph) == ["data", "h2d", "forward", "backward", "optimizer", "other"]
    assert ph["data"].time.before == pytest.approx(0.30) and ph["data"].time.after == pytest.approx(0.05)
    assert ph["data"].time.change == pytest.approx(-0.25) and ph["data"].time.change_pct == pytest.approx(-25 / 30)
    assert ph["forward"].time.before == pytest.approx(0.25)  # the mean of 0.1, 0.2, 0.2, 0.5 (not the irregular 1.2)
    assert ph["data"].share.before == pytest.approx(0.30 / 1.05) and ph["data"].share.after == pytest.approx(0.05 / 0.75)
    assert ph["h2d"].time.change == 0 and ph["h2d"].time.change_pct is None


def test_predicted_vs_achieved_from_claims_or_the_step(hand_pair):
    o = by_id(compare(*hand_pair))
    data = o["data-loading-exposed"]  # claims data: achieved = data drop 0.30 - 0.05
    assert data.measured_from == "phases" and data.phases == ["data"]
    assert data.predicted_s == 0.30 and data.achieved_s == pytest.approx(0.25)
    assert data.ratio == pytest.approx(0.25 / 0.30) and data.verdict == "partly"
    # the unclaimed phases: forward 0.25 -> 0.20, the rest unchanged
    assert data.other_phases_change_s == pytest.approx(-0.05)
    assert not data.in_after
    mb = o["micro-batch-too-small"]  # claims forward + backward: (0.25 + 0.40) - (0.20 + 0.40)
    assert mb.phases == ["forward", "backward"] and mb.achieved_s == pytest.approx(0.05)
    assert mb.ratio == pytest.approx(0.05 / 0.09) and mb.verdict == "partly"
    st = o["storage-too-slow"]  # no claims: the typical step's drop, 1.05 - 0.75
    assert st.measured_from == "step" and st.achieved_s == pytest.approx(0.30)
    assert st.ratio == pytest.approx(3.0) and st.verdict == "exceeded"
    dom = o["dominant-phase"]
    assert dom.predicted_s is None and dom.achieved_s is None and dom.verdict == "no prediction"
    assert dom.in_after


def test_new_findings_and_config_changes(hand_pair):
    c = compare(*hand_pair)
    assert [f["id"] for f in c.new_findings] == ["cpu-saturated"]
    assert c.config_changes == [{"key": "batch_size", "before": 8, "after": 16},
                                {"key": "grad_accum", "before": 4, "after": 2}]


def test_capped_claims_still_measure_from_phases():
    """A saving capped below its claims (it shares a phase with a higher-ranked finding) is still
    measured from the claimed phases, and says which finding it shares them with."""
    b = hand([BASE_PHASES] * 3, findings=[
        finding("data-loading-exposed", 0.30, {"data": 0.30}),
        finding("storage-too-slow", 0.0, {"data": 0.20}, overlaps=["data-loading-exposed"])])
    a = hand([dict(BASE_PHASES, data=0.10)] * 3)
    o = by_id(compare(*b, *a))
    assert o["data-loading-exposed"].achieved_s == pytest.approx(0.20)
    assert o["storage-too-slow"].measured_from == "phases"
    assert o["storage-too-slow"].overlaps == ["data-loading-exposed"]
    assert o["storage-too-slow"].ratio is None and o["storage-too-slow"].verdict == "none predicted"


def test_different_tokens_per_step_compare_per_token():
    """AFTER does twice the tokens in a 1.5x longer step: 50% slower per step, 25% faster per token."""
    b = hand([BASE_PHASES] * 3, tokens=4096, findings=[finding("data-loading-exposed", 0.30, {"data": 0.30})])
    doubled = {k: v * 2 for k, v in BASE_PHASES.items()}
    a = hand([dict(doubled, data=0.10)] * 3, tokens=8192, config={"batch_size": 16})  # 1.50 s
    c = compare(*b, *a)
    assert c.basis == "token" and c.unit == "s/1M tokens"
    assert "per token" in c.basis_note and "4,096 → 8,192" in c.basis_note
    assert c.step_s.change_pct == pytest.approx(0.5)  # per step it is slower ...
    assert c.time.before == pytest.approx(1.0 / 4096 * 1e6) and c.time.after == pytest.approx(1.5 / 8192 * 1e6)
    assert c.slower_pct == pytest.approx(-25.0)  # ... per token it is faster
    assert c.tokens_per_s.change_pct == pytest.approx(1 / 0.75 - 1)
    data = {p.phase: p for p in c.phases}["data"]
    assert data.time.after == pytest.approx(0.10 / 8192 * 1e6)
    # achieved is seconds per BEFORE step: data 0.30 - (0.10 per 8,192 tokens = 0.05 per 4,096)
    o = by_id(c)["data-loading-exposed"]
    assert o.achieved_s == pytest.approx(0.25) and o.ratio == pytest.approx(0.25 / 0.30)


def test_world_size_device_and_timeline_notes():
    b = hand([BASE_PHASES] * 3)
    a = hand([BASE_PHASES] * 3, device_name="CPU (other)")
    a[0].ranks = [{"rank": r} for r in range(4)]  # a merged distributed profile: read through getattr
    c = compare(*b, *a)
    assert c.world_size.before == 1 and c.world_size.after == 4
    assert any("world size changed 1 → 4" in n for n in c.notes)
    assert any("different devices" in n for n in c.notes)
    assert c.step_s.change == 0
    # 4 ranks each doing BEFORE's tokens in the same step: the job does 4× the tokens per step.
    assert c.basis == "token" and c.tokens_per_step.after == 4 * c.tokens_per_step.before
    assert c.tokens_per_s.after == pytest.approx(4 * c.tokens_per_s.before)
    assert c.slower_pct == pytest.approx(-75.0)


def test_data_parallel_job_twice_as_fast_is_seen():
    """1 process at 1024 tokens per 0.2 s, then 2 ranks at 512 tokens each per 0.1 s: the job is
    twice as fast per token (the review's case), not unchanged."""
    b = hand([BASE_PHASES] * 3)
    a = hand([{k: v / 2 for k, v in BASE_PHASES.items()}] * 3, tokens=4096 // 2, world_size=2)
    c = compare(*b, *a)
    assert c.tokens_per_step.before == c.tokens_per_step.after  # the job's tokens: same work
    assert c.basis == "step" and c.slower_pct == pytest.approx(-50.0)
    assert c.tokens_per_s.after == pytest.approx(2 * c.tokens_per_s.before)


def test_change_within_the_noise_is_called_noise():
    """+1% on steps spread over 30%: the change's interval (4 and 4 steps, 94%) holds no change, and
    says so in place of the spread note (which remains for runs too short for an interval)."""
    b = hand([dict(BASE_PHASES, forward=f) for f in (0.1, 0.2, 0.3, 0.4)])
    a = hand([dict(BASE_PHASES, forward=f + 0.01) for f in (0.1, 0.2, 0.3, 0.4)])
    c = compare(*b, *a)
    assert c.step_change.enough and c.step_change.within_noise
    assert c.step_change.low < 1.0 < c.step_change.high
    assert not any("within run-to-run noise" in n for n in c.notes)
    assert compare_view(c).step_change.endswith("per step (94%, Mann–Whitney, 4 and 4 steps): holds no change: "
                                                "within run-to-run noise")


def test_no_steps_is_an_error():
    b = hand([BASE_PHASES] * 2)
    empty = hand_profile([])
    with pytest.raises(GpuprofError, match="AFTER: no measured step"):
        compare(*b, empty, hand_analysis(empty))


def test_config_changes_flatten_and_skip_unset_defaults():
    b = {"dtype": "bf16", "faults": {"loader": {"batch_delay_s": 0.05, "read_latency_s": 0.0}},
         "model_dims": {"n_layer": 2}, "compile": False}
    a = {"dtype": "fp32", "faults": None, "model_dims": {"n_layer": 4}}
    assert config_changes(b, a) == [
        {"key": "dtype", "before": "bf16", "after": "fp32"},
        {"key": "faults.loader.batch_delay_s", "before": 0.05, "after": None, "missing": "after"},
        {"key": "model_dims.n_layer", "before": 2, "after": 4}]


@pytest.mark.parametrize("ratio,achieved,word", [
    (1.0, 1.0, "realised"), (0.86, 0.86, "realised"), (1.14, 1.14, "realised"), (1.2, 1.2, "exceeded"),
    (0.5, 0.5, "partly"), (0.1, 0.1, "not realised"), (-0.2, -0.2, "worse")])
def test_verdict_words(ratio, achieved, word):
    assert verdict(1.0, ratio, achieved) == word


def test_the_precision_is_compared_as_measured_not_as_the_configs_copies():
    """A profile holds what its first step computed in (measurements.precision); an older one also
    copied autocast_dtype and tf32_matmul into run.config. compare lists the measured change once,
    as precision.<key>, and never the config's copies (a newer file no longer writes them)."""
    from gpuprof.analysis.config_diff import precision_changes

    steps = [dict(BASE_PHASES)] * 3
    b = hand_profile(steps, config={"autocast_dtype": "bfloat16", "tf32_matmul": False})
    b.measurements["precision"] = {"compute_dtype": "bf16", "autocast_dtype": "bfloat16", "param_dtype": "float32",
                                   "tf32_matmul": False}
    a = hand_profile(steps)
    a.measurements["precision"] = {"compute_dtype": "fp32", "autocast_dtype": None, "param_dtype": "float32",
                                   "tf32_matmul": False}
    assert precision_changes(b, a) == [
        {"key": "precision.compute_dtype", "before": "bf16", "after": "fp32"},
        {"key": "precision.autocast_dtype", "before": "bfloat16", "after": None, "missing": "after"}]
    c = compare(b, hand_analysis(b), a, hand_analysis(a))
    assert [ch["key"] for ch in c.config_changes] == ["precision.compute_dtype", "precision.autocast_dtype"]
    assert compare_view(c).config_heading.startswith("Config changes (run.config; precision.* as measured")
    # no record on one side (an older file without it): nothing measured to compare, nothing
    # invented; the config's own copies are compared instead, as compare did for those files
    old_b, old_a = (hand_profile(steps, config={"autocast_dtype": "bfloat16"}),
                    hand_profile(steps, config={"autocast_dtype": None}))
    assert precision_changes(b, old_a) == []
    c = compare(old_b, hand_analysis(old_b), old_a, hand_analysis(old_a))
    assert c.config_changes == [{"key": "autocast_dtype", "before": "bfloat16", "after": None}]
