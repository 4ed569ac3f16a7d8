"""compute_mfu on hand-computed cases: the right peak, both MFUs, the floor, misreports explained."""

import pytest

from gpuprof.analysis.mfu import compute_mfu
from gpuprof.profile import Profile, StepRecord

F_XL = 1.0751832e16  # FLOPs per step: GPT-2 1558M-ish × 1,048,576 tokens (FACTS.md)


def _profile(device_name="NVIDIA H200", device="cuda", step_s=21.0, flops=F_XL, config=None,
             probe=None, script=None, flops_section=True):
    cfg = {"dtype": "bf16", "autocast_dtype": "bfloat16", "tf32_matmul": True, "tokens_per_step": 1048576}
    cfg.update(config or {})
    meas = {}
    if flops_section:
        meas["flops"] = {"analytic_per_step": flops, "counted_per_step": flops * 0.99, "agreement": 0.99,
                         "used": "analytic"}
    if probe is not None:
        meas["probe"] = probe
    if script is not None:
        meas["script"] = {"reported": script}
    # Measured steps of step_s seconds (three alike, or the list given): on CUDA on the GPU timeline
    # (each step's CUDA span), else host wall time.
    gpu = str(device).startswith("cuda")
    steps = []
    for i, t in enumerate(step_s if isinstance(step_s, list) else [step_s] * 3):
        phases = {"forward": 0.25 * t, "backward": 0.75 * t}
        steps.append(StepRecord(i, t, dict(phases), tokens=cfg.get("tokens_per_step") or 0, micro_steps=1,
                                gpu_s=t if gpu else None, gpu_phases=dict(phases) if gpu else None))
    return Profile(run={"config": cfg}, steps=steps, environment={"device": device, "device_name": device_name},
                   measurements=meas)


def _causes(m):
    return [e.cause for e in m.misreport]


def test_nanogpt_line_on_h200_true_is_reported_times_312_over_989_5():
    reported = 164.1
    m = compute_mfu(_profile(), reported_mfu_pct=reported)
    assert m.gpu_key == "h200" and m.dtype == "bf16" and m.peak_tflops == 989.5
    assert m.flops_method == "analytic"
    assert m.achieved_tflops == pytest.approx(F_XL / 21 / 1e12)
    assert m.mfu == pytest.approx(reported * 312 / 989.5 / 100, rel=1e-3)  # 51.74%
    assert m.mfu == pytest.approx(0.5174, abs=1e-4)
    assert _causes(m)[0] == "a100_constant"
    assert "impossible" in _causes(m) and m.reported_impossible
    imp = [e for e in m.misreport if e.cause == "impossible"][0]
    assert "A100" in imp.text


def test_floor_and_expected_step_times():
    m = compute_mfu(_profile())
    assert m.floor_s == pytest.approx(F_XL / 989.5e12)  # 10.87 s
    assert m.floor_s == pytest.approx(10.866, abs=0.001)
    assert m.expected_step_s["40%"] == pytest.approx(m.floor_s / 0.4)
    assert m.expected_step_s["60%"] == pytest.approx(m.floor_s / 0.6)
    assert m.step_over_floor == pytest.approx(21 / m.floor_s)


def test_mfu_is_over_the_typical_step_on_the_gpu_timeline():
    m = compute_mfu(_profile())
    assert m.step_s == pytest.approx(21.0) and m.timeline == "gpu"
    # Steps that vary: the typical step is their mean (22 s), not the median (21 s).
    m = compute_mfu(_profile(step_s=[20.0, 21.0, 25.0]))
    assert m.step_s == pytest.approx(22.0) and m.achieved_tflops == pytest.approx(F_XL / 22 / 1e12)
    # An irregular step (a 60 s pause among 21 s steps) is left out: MFU is the typical step's.
    m = compute_mfu(_profile(step_s=[21.0, 21.0, 60.0, 21.0, 21.0]))
    assert m.step_s == pytest.approx(21.0) and m.mfu == pytest.approx(F_XL / 21 / 989.5e12)
    m = compute_mfu(_profile(device="cpu", device_name="CPU (x86)", step_s=1.0))
    assert m.step_s == pytest.approx(1.0) and m.timeline == "host"


def test_ceiling_gives_second_denominator():
    m = compute_mfu(_profile(probe={"tflops": 790.0, "method": "cuda-events", "dtype": "bf16"}))
    assert m.mfu_vs_ceiling == pytest.approx(F_XL / 21 / 1e12 / 790.0)
    assert m.ceiling_share_of_peak == pytest.approx(790 / 989.5)
    assert m.floor_s_ceiling == pytest.approx(F_XL / 790e12)


def test_unknown_gpu_has_no_datasheet_mfu_but_ceiling_mfu():
    m = compute_mfu(_profile(device_name="NVIDIA Foo 9000", probe={"tflops": 100.0, "method": "cuda-events"}))
    assert m.peak_tflops is None and m.mfu is None and m.floor_s is None
    assert m.mfu_vs_ceiling == pytest.approx(F_XL / 21 / 1e12 / 100)
    assert any("not in the GPU table" in w for w in m.warnings)


def test_gpu_and_peak_overrides():
    m = compute_mfu(_profile(device_name="NVIDIA Foo 9000"), gpu="h100")
    assert m.gpu_key == "h100" and m.peak_tflops == pytest.approx(989.4)
    m = compute_mfu(_profile(), peak_tflops=500.0)
    assert m.peak_source == "--peak-tflops" and m.mfu == pytest.approx(F_XL / 21 / 500e12)


def test_fp32_with_tf32_allowed_uses_tf32_peak():
    cfg = {"dtype": "fp32", "autocast_dtype": None, "tf32_matmul": True}
    m = compute_mfu(_profile(device_name="NVIDIA A100-SXM4-80GB", config=cfg))
    assert (m.dtype, m.peak_tflops) == ("tf32", 156)
    cfg["tf32_matmul"] = False
    m = compute_mfu(_profile(device_name="NVIDIA A100-SXM4-80GB", config=cfg))
    assert (m.dtype, m.peak_tflops) == ("fp32", 19.5)


def test_unsynchronized_timing_explained_from_script_lines():
    # A100: the 312 constant is right there. The script timed 10 s, the GPU took 21 s.
    flops = 0.5 * 312e12 * 21  # true MFU 50%
    script = {"mfu_pct_median": 105.0, "step_ms_median": 10000.0}
    m = compute_mfu(_profile(device_name="NVIDIA A100-SXM4-80GB", flops=flops, script=script))
    assert m.reported_source == "script output" and m.reported_mfu_pct == 105.0
    assert m.mfu == pytest.approx(0.5)
    assert _causes(m)[0] == "unsynchronized_timing"
    imp = [e for e in m.misreport if e.cause == "impossible"][0]
    assert "shorter than the GPU" in imp.text


def test_sparse_peak_and_agreement():
    flops = 0.5 * 989.5e12 * 21
    m = compute_mfu(_profile(flops=flops), reported_mfu_pct=25.0)
    assert "sparse_peak" in _causes(m)
    m = compute_mfu(_profile(flops=flops), reported_mfu_pct=50.5)
    assert _causes(m) == ["agrees"]


def test_unexplained_ratio_still_mentions_a100_constant():
    flops = 0.2 * 989.5e12 * 21
    m = compute_mfu(_profile(flops=flops), reported_mfu_pct=90.0)
    assert _causes(m)[0] == "unexplained" and "a100_constant_possible" in _causes(m)


def test_a_script_dividing_by_its_own_peak_table_is_never_blamed_on_the_a100_constant():
    # nanochat prints bf16_mfu against its own table's H200 peak: a printed figure 3.17x the true one
    # (what 312 TFLOP/s would give) is unexplained for it, not nanoGPT's A100 constant.
    flops = 0.2 * 989.5e12 * 21
    script = {"mfu_pct_median": 0.2 * 100 * 989.5 / 312, "format": "nanochat"}
    m = compute_mfu(_profile(flops=flops, script=script))
    assert m.reported_source == "script output" and "a100_constant" not in " ".join(_causes(m))
    assert _causes(m)[0] == "unexplained"
    script["format"] = "nanogpt"
    assert _causes(compute_mfu(_profile(flops=flops, script=script)))[0] == "a100_constant"


def test_cpu_run_uses_ceiling_only():
    m = compute_mfu(_profile(device="cpu", device_name="CPU (x86)", probe={"tflops": 0.1, "method": "wall"},
                             step_s=1.0, flops=2e10))
    assert m.peak_tflops is None and m.mfu is None
    assert m.mfu_vs_ceiling == pytest.approx(0.2)
    assert any("CPU run" in w for w in m.warnings)


def test_flops_from_config_when_not_counted():
    dims = dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50304, block_size=1024, bias=True)
    p = _profile(flops_section=False, config={"model_dims": dims, "tokens_per_step": 1048576})
    m = compute_mfu(p)
    assert m.flops_method == "analytic"
    assert m.flops_per_step / 1048576 / 1e9 == pytest.approx(0.855, abs=0.001)


def test_missing_everything_is_reported_not_raised():
    p = Profile(run={}, steps=[], environment={}, measurements={})
    m = compute_mfu(p)
    assert m.mfu is None and m.flops_per_step is None and m.warnings
