"""Every finding carries its evidence in words (`because`), written by its rule from the same
numbers it puts in `evidence`; a finding without one is worded generically by the renderer."""

import ast
import re
from pathlib import Path

import pytest
from rich.console import Console

from gpuprof.analysis.engine import Context
from gpuprof.analysis.findings import Finding
from gpuprof.analysis.mfu_results import MfuResult, MisreportCause
from gpuprof.analysis.pipeline import analyze
from gpuprof.analysis.rules import batching, gpu, logs, machine, phases, precision
from gpuprof.hardware import find_gpu
from gpuprof.units import evidence_words
from gpuprof.render.terminal import findings_table
from gpuprof.units import bytes_per_s, flops_rate, nbytes, pct, seconds
from render_report.profiles import cpu_profile, gpu_profile

RULES_DIR = Path(__file__).resolve().parents[2] / "gpuprof" / "analysis" / "rules"
RAW_FLOAT = re.compile(r"\d\.\d{4,}")  # 0.4361: an unformatted float
KEY_VALUE = re.compile(r"\b[a-z]+_[a-z_]+=")  # mfu_vs_ceiling=...


def _text(renderable, width=200) -> str:
    c = Console(width=width, record=True, color_system=None)
    c.print(renderable)
    return c.export_text()


def _plain(f: Finding):
    assert f.because, f.id
    assert not RAW_FLOAT.search(f.because) and not KEY_VALUE.search(f.because), f.because
    assert "None" not in f.because and "nan" not in f.because.replace("nanoGPT", "")


def test_every_rule_module_passes_a_because_sentence():
    """Statically: each Finding(...) in gpuprof/analysis/rules/ names `because=`, so a new rule
    (rules/distributed.py too) cannot add a finding without its evidence in words."""
    missing = []
    for path in sorted(RULES_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding":
                if "because" not in {k.arg for k in node.keywords}:
                    missing.append(f"{path.name}:{node.lineno}")
    assert not missing, missing


def test_finding_field_defaults_empty_and_travels_in_the_json():
    f = Finding("x", "t", None, None, {})
    assert f.because == "" and f.to_dict()["because"] == ""


# -- the sentences, number by number -------------------------------------------------------
def test_data_loading_on_a_cpu_names_the_seconds_the_share_and_that_the_loader_waits():
    host = {"available": True, "cpu_count": 2,
            "summary": {"cpu_pct": {"mean": 60.0}, "others_cpu_cores": {"mean": 0.2}, "proc_cpu_pct": {"mean": 90.0}},
            "phases": {"data": {"samples": 12, "cpu_pct": 30.0, "own_cpu_cores": 0.08}}}
    p = cpu_profile([{"data": 1.2, "forward": 1.1, "backward": 2.18}] * 3, {"host": host})
    (f,) = phases.data_loading_exposed(Context(profile=p, stats=p.stats))
    _plain(f)
    # 1.20 s of a 4.48 s step is 26.8%; the loop's CPU while loading was 0.08 cores = 8%
    assert f.because.startswith(f"data: {seconds(1.2)} per step, {pct(1.2 / 4.48)} of the step")
    assert "1.20 s" in f.because and "26.8%" in f.because
    assert "this run's CPU while it loaded was 8% of one core: it waits, it does not compute" in f.because
    assert "0.9 of 2 cores were free to this run" in f.because  # 2 - 0.2 others - 0.9 this process
    assert f.evidence["data_exposed_s"] == pytest.approx(1.2)  # the machine-readable dict is kept
    assert f.evidence["own_cpu_cores_during_data"] == pytest.approx(0.08)


def test_data_loading_on_the_gpu_timeline_names_the_idle_and_the_host_time():
    p = gpu_profile()
    (f,) = phases.data_loading_exposed(Context(profile=p, stats=p.stats))
    _plain(f)
    share = 0.050 / p.stats.step_s  # a share of the typical step (GPU timeline: 367 ms)
    assert f"the GPU sat idle {seconds(0.05)} per step ({pct(share)} of the step)" in f.because
    assert "50.0 ms" in f.because and "the loading itself took 150 ms per step on the host" in f.because


def test_compute_bound_states_compute_seconds_floor_and_mfu_with_the_printed_step():
    p = cpu_profile([{"data": 0.01, "forward": 0.3, "backward": 0.6, "optimizer": 0.09}] * 3)
    (f,) = phases.compute_bound(Context(profile=p, stats=p.stats, mfu=MfuResult(floor_s=0.25, mfu_vs_ceiling=0.4361)))
    _plain(f)
    assert f"forward, backward and optimizer: {seconds(0.99)} per step, 99.0% of the step" in f.because
    assert "the 1.00 s step is 4.00× its FLOP floor of 250 ms" in f.because
    assert "MFU 43.6% of the measured matmul ceiling" in f.because and "0.4361" not in f.because
    # the step in the evidence is the one the report prints: the typical step
    assert f.evidence["step_s"] == p.stats.step_s == pytest.approx(1.0) and "mean_step_s" not in f.evidence
    # steps that vary (0.9, 1.0, 1.4 s): the sentence and the evidence quote the typical step (their
    # mean, 1.10 s, what the phases add up to), not the median (1.00 s)
    ph = {"data": 0.01, "backward": 0.6, "optimizer": 0.09}
    p = cpu_profile([dict(ph, forward=0.3), dict(ph, forward=0.2), dict(ph, forward=0.7)])
    (f,) = phases.compute_bound(Context(profile=p, stats=p.stats, mfu=MfuResult(floor_s=0.25)))
    assert p.stats.median_s == pytest.approx(1.0) and p.stats.step_s == pytest.approx(1.1)
    assert f.evidence["step_s"] == p.stats.step_s and "the 1.10 s step is 4.40× its FLOP floor" in f.because


def test_micro_batch_sentence_carries_the_curve_times():
    curve = {"fixed_s": 0.02, "per_sample_s": 0.001,
             "points": [{"batch_size": b, "seconds": 0.02 + 0.001 * b} for b in (4, 8, 16)]}
    p = cpu_profile([{"data": 0.005, "forward": 0.1, "backward": 0.2, "optimizer": 0.01}] * 3,
                    {"microbatch": curve}, micro=4, batch_size=4, grad_accum=4)
    (f,) = batching.micro_batch_too_small(Context(profile=p, stats=p.stats))
    _plain(f)
    assert (f"each of the 4 micro-steps of batch_size 4 pays a fixed {seconds(0.02)} of its "
            f"{seconds(0.024)}") in f.because
    assert (f"1 micro-step of batch_size 16 takes {seconds(0.036)} where 4 of batch_size 4 take "
            f"{seconds(0.096)}") in f.because


def test_h2d_sentence_names_bytes_and_both_bandwidths():
    p = gpu_profile()
    for s in p.steps:
        s.extra = {"h2d_pageable": 8, "h2d_pageable_bytes": 200e6}
    p.measurements["copies"] = {"pageable_bytes_s": 6e9, "pinned_bytes_s": 24e9}
    (f,) = gpu.h2d_pageable(Context(profile=p, stats=p.stats))
    _plain(f)
    saving = 200e6 * (1 / 6e9 - 1 / 24e9)
    assert f"8 copies per step from pageable memory moved {nbytes(200e6)}" in f.because
    assert f"{bytes_per_s(6e9)} from pageable memory and {bytes_per_s(24e9)} from pinned memory" in f.because
    assert f"move {seconds(saving)} faster pinned" in f.because and "25.0 ms" in f.because


def test_cpu_saturated_and_mfu_misreported_sentences():
    host = {"available": True, "cpu_count": 2,
            "summary": {"cpu_pct": {"mean": 99.0}, "cpu_busy_cores": {"mean": 1.98},
                        "own_cpu_cores": {"mean": 1.9}, "others_cpu_cores": {"mean": 0.08}}}
    p = cpu_profile([{"forward": 0.3, "backward": 0.6}] * 3, {"host": host})
    (f,) = machine.cpu_saturated(Context(profile=p, stats=p.stats))
    _plain(f)
    assert f.because == ("the host's 2 cores were 99% busy on average over the measured steps; this run "
                         "(its process and child processes) used 1.9 cores, other processes 0.1")
    mfu = MfuResult(reported_mfu_pct=164.1, reported_source="script output", mfu=0.517, peak_tflops=989.5,
                    dtype="bf16", gpu_name="NVIDIA H200 SXM", flops_per_step=1.08e16, step_s=21.0,
                    misreport=(MisreportCause("a100_constant", "nanoGPT divides by the A100's 312 TFLOP/s"),))
    (f,) = machine.mfu_misreported(Context(profile=p, stats=p.stats, mfu=mfu))
    _plain(f)
    assert f.because == (f"the script printed 164.1%; this step's 1.08e+16 FLOPs in its measured {seconds(21.0)} "
                         f"against the bf16 peak of NVIDIA H200 SXM ({flops_rate(989.5)}) give 51.7%")


def test_precision_and_ratio_sentences():
    p = cpu_profile([{"forward": 0.3, "backward": 1.5, "optimizer": 0.01}] * 3)
    p.run["config"]["precision"] = {"compute_dtype": "bf16"}
    p.measurements["probe"] = {"precisions": {"tflops": {"fp32": 0.16, "bf16": 0.02}, "m": 2048, "shapes": []}}
    ctx = Context(profile=p, stats=p.stats, mfu=MfuResult(flops_per_step=1e10, dtype="bf16"))
    (f,) = precision.precision_slow(ctx)
    _plain(f)
    assert (f"this device ran bf16 at {flops_rate(0.02)} and fp32 at {flops_rate(0.16)} (8.00×); "
            f"forward+backward take {seconds(1.8)} per step") in f.because
    (r,) = precision.backward_forward_ratio(ctx)
    _plain(r)
    assert r.because == (f"backward {seconds(1.5)} and forward {seconds(0.3)} per step: the backward takes "
                         "5.0x the forward, where about 2x is usual")


def test_log_findings_have_sentences():
    log = Path(__file__).resolve().parents[1] / "mfu" / "fixtures" / "nanogpt_h200_21s_mfu164.log"
    from gpuprof.analysis.logs import analyze_log

    res = analyze_log(log, gpu="h200", config=dict(batch_size=16, block_size=1024, gradient_accumulation_steps=64))
    out = logs.log_findings(res)
    assert {f.id for f in out} == {"mfu-misreported", "compute-bound"}
    for f in out:
        _plain(f)
    verdict = next(f for f in out if f.id == "compute-bound")
    assert f"the log's median step is {seconds(res.step_s_median)}" in verdict.because
    assert f"is {seconds(res.floor_s)}: the step is {res.step_over_floor:.2f}× the floor" in verdict.because


def test_every_finding_of_a_full_analysis_has_a_plain_sentence():
    p = gpu_profile()
    for s in p.steps:
        s.extra = {"h2d_pageable": 8, "h2d_pageable_bytes": 200e6}
    p.measurements["syncs"] = {"per_step": 6, "per_phase": {"forward": 12, "h2d": 3}, "measured_steps": 3}
    findings = analyze(p, gpu="h200").findings
    assert len(findings) >= 5
    for f in findings:
        _plain(f)
    sync = next(f for f in findings if f.id == "sync-in-step")
    assert sync.because.startswith("6 host-device synchronizations per step over 2 micro-steps (forward 4)")


# -- the generic wording, for a finding that has none ---------------------------------------
def test_evidence_words_infers_units_from_the_keys():
    ev = {"data_exposed_s": 1.2, "share": 0.268, "mfu_vs_ceiling": 0.4361, "memory_needed_bytes": 11_009_536,
          "pinned_bytes_s": 2.4e10, "ratio": 1.934, "reported_pct": 164.1, "cores": 2, "fused": False,
          "timeline": "host", "step_s": 0.727, "mean_step_s": 0.73, "not_measured_here": None,
          "rates_gflop_s": {"fp32": 154.3}, "first_step_ms": 30200.0}
    assert evidence_words(ev) == ("data exposed 1.20 s; share of the step 26.8%; mfu vs ceiling 43.6%; "
                                  "memory needed 10.5 MiB; pinned 24.0 GB/s; ratio 1.93×; reported 164.1%; cores 2; "
                                  "fused no; timeline host; rates fp32 154.3 GFLOP/s; first step 30.20 s")


def test_a_finding_without_because_is_shown_in_words_never_as_key_value():
    old = {"id": "data-loading-exposed", "title": "the step waits 27% of the step for data loading", "kind": "fix",
           "saving_s": 1.2, "saving_share": 0.268, "confidence": "high", "fix": "prefetch",
           "evidence": {"data_exposed_s": 1.2, "share": 0.268, "step_s": 0.727, "mfu_vs_ceiling": 0.4361}}
    out = _text(findings_table([Finding.from_dict(old)]))  # as a saved file's finding reads back
    assert "because data exposed 1.20 s; share of the step 26.8%; mfu vs ceiling 43.6%" in out
    assert "=" not in out and "0.4361" not in out and "727" not in out  # the step is printed once, above
    assert f"saves   {seconds(1.2)} per step ({pct(0.268)} of the typical step); confidence high" in out


def test_gpu_spec_is_found_for_the_hand_built_profile():
    assert find_gpu("NVIDIA H200") is not None  # the GPU rules above read its datasheet row
