"""The physical-bounds checker: impossible figures are found and repaired (MFU, ceilings, savings)
without touching the Profile, CPU figures are kept in bounds by their producer (the host
sampler), and every rule and renderer, run over randomized and adversarial profiles, leaves none."""

import io
import random
import re

import pytest
from rich.console import Console

from gpuprof.analysis.bounds import enforce, violations
from gpuprof.analysis.pipeline import analyze
from gpuprof.measure.cpu_bounds import within_cores
from gpuprof.profile import Profile, StepRecord


# These profiles are adversarial on purpose: the repair is what is tested, not a producer bug.
pytestmark = pytest.mark.adversarial


def _profile(phases, *, gpu_phases=None, device="cpu", name="CPU", config=None, measurements=None, n=3):
    steps = [StepRecord(i, sum(phases.values()), dict(phases), tokens=8192, micro_steps=4,
                        gpu_s=sum(gpu_phases.values()) if gpu_phases else None,
                        gpu_phases=dict(gpu_phases) if gpu_phases else None) for i in range(n)]
    cfg = {"device": device, "tokens_per_step": 8192, "grad_accum": 4, "batch_size": 8, "block_size": 256,
           "model_dims": {"n_layer": 2, "n_head": 4, "n_embd": 128, "vocab_size": 4096, "block_size": 256}}
    cfg.update(config or {})
    return Profile(run={"mode": "builtin", "config": cfg}, steps=steps,
                   environment={"device": device, "device_name": name}, measurements=measurements or {})


def test_an_mfu_vs_ceiling_above_100_percent_becomes_not_measured():
    # issue 11: "MFU vs ceiling 224.2%" -- a bf16 probe at 1.3 GFLOP/s while the model reached 3.0
    p = _profile({"forward": 0.3, "backward": 2.4, "optimizer": 0.05},
                 config={"precision": {"compute_dtype": "bf16"}},
                 measurements={"probe": {"tflops": 0.0013, "dtype": "bf16", "method": "wall"}})
    before = p.to_dict()
    a = analyze(p)
    m = a.mfu
    assert m.mfu_vs_ceiling is None and violations(p, a) == []
    assert any("mfu vs ceiling not measured" in w for w in m.warnings)
    assert a.repairs and all(r.startswith("mfu.mfu_vs_ceiling") for r in a.repairs)
    assert p.to_dict() == before  # the repair is the analysis's: the profile is unchanged


def test_the_model_shape_rate_is_the_ceiling_when_it_is_higher():
    p = _profile({"forward": 0.3, "backward": 0.6}, config={"precision": {"compute_dtype": "fp32"}},
                 measurements={"probe": {"tflops": 0.010, "dtype": "fp32",
                                         "precisions": {"tflops": {"fp32": 0.050, "bf16": 0.004}}}})
    m = analyze(p).mfu
    assert m.ceiling_tflops == 0.050 and "model's own matmul shapes" in m.ceiling_method


def test_process_cpu_above_the_cores_is_dropped_by_the_sampler():
    host = {"available": True, "cpu_count": 2,
            "summary": {"proc_cpu_pct": {"mean": 180.0, "max": 741.0, "p50": 170.0, "p90": 190.0, "n": 9}},
            "phases": {"outside": {"samples": 1, "proc_cpu_pct": 627.0}, "forward": {"samples": 8, "proc_cpu_pct": 170.0}}}
    p = _profile({"forward": 1.0}, measurements={"host": dict(host)})
    assert len(violations(p)) == 2
    report = within_cores(host)  # what the host sampler does to its own report before storing it
    assert host["summary"]["proc_cpu_pct"]["max"] is None and host["phases"]["outside"]["proc_cpu_pct"] is None
    assert host["phases"]["forward"]["proc_cpu_pct"] == 170.0 and len(report["dropped_above_bound"]) == 2
    assert violations(_profile({"forward": 1.0}, measurements={"host": report})) == []


def test_the_analysis_never_edits_a_measured_figure_and_reports_it_unrepaired():
    host = {"cpu_count": 2, "summary": {"proc_cpu_pct": {"max": 741.0}}}
    p = _profile({"forward": 1.0}, measurements={"host": host})
    _, _, repairs = enforce(p, p.stats, None, [])
    assert repairs == ["unrepaired: measurements.host.summary.proc_cpu_pct.max = 741% is above 200%"]
    assert host["summary"]["proc_cpu_pct"]["max"] == 741.0
    a = analyze(p)  # the suite fails a test that makes this analysis (tests/analysis/test_strict_bounds.py)
    assert a.repairs == tuple(repairs) and violations(p, a) == [repairs[0][len("unrepaired: "):]]


def test_savings_never_add_up_to_more_than_the_step():
    from gpuprof.analysis.bounds import analysis_violations
    from gpuprof.analysis.findings import Finding

    p = _profile({"forward": 0.5, "data": 0.5})
    fs = [Finding("a", "a", 0.8, 0.8, {}), Finding("b", "b", 0.7, 0.7, {}), Finding("c", "c", None, None, {})]
    assert any("add up to" in v for v in analysis_violations(p.stats, None, fs))
    _, fixed, _ = enforce(p, p.stats, None, fs)
    assert [f.saving_s for f in fixed] == [0.8, pytest.approx(0.2), None]
    assert analysis_violations(p.stats, None, fixed) == []
    assert "capped" in fixed[1].note and fs[1].saving_s == 0.7  # new findings; the given ones are kept


# ------------------------------------------------------------------ randomized and adversarial
def _random_profile(rng: random.Random) -> Profile:
    cuda = rng.random() < 0.5
    names = ["data", "h2d", "forward", "backward", "optimizer", "other"] + (["eval"] if rng.random() < 0.3 else [])
    def t():
        return rng.choice([0.0, 1e-9, rng.random() * 1e-3, rng.random(), rng.random() * 100])
    phases = {p: t() for p in names}
    if not any(phases.values()):
        phases["forward"] = 0.01
    gpu = {p: t() for p in names} if cuda and rng.random() < 0.8 else None
    if gpu is not None and not any(gpu.values()):
        gpu["forward"] = 0.01
    dtype = rng.choice(["fp32", "tf32", "bf16", "fp16"])
    probe_dtype = rng.choice([dtype, "fp32"])
    meas = {
        "probe": {"tflops": rng.choice([None, 1e-6, rng.random() * 1000]), "dtype": probe_dtype,
                  "precisions": {"tflops": {d: rng.random() * rng.choice([1e-3, 1, 1000])
                                            for d in rng.sample(["fp32", "tf32", "bf16", "fp16"], 3)},
                                 "m": 2048, "shapes": [{"k": 64, "n": 256, "count": 1, "flops_share": 1.0}],
                                 **({"switch": {"to": "fp32", "ratio": rng.random() * 2,
                                                "fwd_bwd_per_micro_s": rng.random(),
                                                "run_fwd_bwd_per_micro_s": rng.random()}}
                                    if rng.random() < 0.3 else {})}},
        "host": {"available": True, "cpu_count": rng.choice([1, 2, 16]),
                 "summary": {"proc_cpu_pct": {"mean": rng.random() * 900, "max": rng.random() * 900},
                             "cpu_pct": {"mean": rng.random() * 150}},
                 "phases": {"outside": {"samples": 1, "proc_cpu_pct": rng.random() * 900}}},
        "syncs": {"per_step": rng.choice([0, 3, 100]), "per_phase": {"forward": 3}},
        "microbatch": {"batch_size": 8, "points": [{"batch_size": 1, "seconds": rng.random()},
                                                   {"batch_size": 8, "seconds": rng.random()}],
                       "fixed_s": rng.random(), "per_sample_s": rng.random() * 0.01,
                       "fixed_share_at_batch": rng.random()},
        "copies": {"pageable_bytes_s": rng.random() * 1e10 + 1, "pinned_bytes_s": rng.random() * 1e10 + 1},
        "script": {"reported": {"mfu_pct_median": rng.choice([None, 164.3, 13.7]),
                                "step_ms_median": rng.choice([None, 21000.0, 1.0])}},
    }
    config = {"precision": {"compute_dtype": dtype, "tf32_matmul": dtype == "tf32"}, "dtype": dtype,
              "pin_memory": rng.random() < 0.5, "compile": rng.random() < 0.5,
              "device": "cuda:0" if cuda else "cpu", "param_count": rng.choice([None, 124_000_000, 1_000])}
    name = rng.choice(["NVIDIA H200", "Tesla V100-SXM2-16GB", "Mystery GPU"]) if cuda else "CPU"
    p = _profile(phases, gpu_phases=gpu, device=config["device"], name=name, config=config, measurements=meas,
                 n=rng.choice([1, 3]))
    for s in p.steps:
        s.extra = {"h2d_pageable": rng.choice([0, 8]), "h2d_pageable_bytes": rng.random() * 1e9}
    within_cores(p.measurements["host"])  # the sampler keeps its own figures in bounds
    return p


PCT = re.compile(r"(\d+(?:\.\d+)?)%")
ALLOWED_OVER_100 = ("report", "print", "impossib", "claim", "script", "x its", "was ")


@pytest.mark.parametrize("seed", range(60))
def test_no_rule_or_renderer_leaves_an_impossible_figure(seed):
    from gpuprof.render.terminal import render_diagnosis

    rng = random.Random(seed)
    p = _random_profile(rng)
    a = analyze(p, reported_mfu_pct=rng.choice([None, 164.3]))
    assert violations(p, a) == []
    assert all(f.saving_s is None or f.saving_s >= 0 for f in a.findings)
    for width in (80, 120):  # the report renders at terminal widths without raising
        render_diagnosis(p, a, Console(file=io.StringIO(), width=width, color_system=None), details=True)
    out = io.StringIO()  # one line per sentence: a percentage is judged with its own words
    render_diagnosis(p, a, Console(file=out, width=2000, color_system=None), details=True)
    text = out.getvalue()
    assert "None" not in text and "nan" not in text.lower().replace("nanogpt", "")
    for line in text.splitlines():
        for sentence in re.split(r"[;│]", line):
            if any(a in sentence.lower() for a in ALLOWED_OVER_100):
                continue
            for v in PCT.findall(sentence):
                assert float(v) <= 100.0, f"seed {seed}: {sentence.strip()}"
