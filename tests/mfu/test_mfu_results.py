"""The typed MFU and log results (analysis/mfu_results.py): their JSON is the dicts' layout, key for
key, it round-trips, and an analysis saved by an older gpuprof still loads and renders."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from gpuprof import profile as P
from gpuprof.analysis.bounds import enforce
from gpuprof.analysis.logs import analyze_log
from gpuprof.analysis.mfu import compute_mfu
from gpuprof.analysis.mfu_results import LogAnalysis, LogVerdict, MfuResult, MisreportCause, SizeRow
from gpuprof.analysis.pipeline import Analysis, analyze
from gpuprof.cli import app
from gpuprof.render.terminal import render_diagnosis

from test_mfu_compute import _profile

ROOT = Path(__file__).resolve().parents[2]
SCHEMA1_CPU = ROOT / "tests" / "profile" / "fixtures" / "schema1_builtin_cpu_tiny.gpuprof.json"
LOG = Path(__file__).parent / "fixtures" / "nanogpt_h200_21s_mfu164.log"
FACTS_CFG = dict(batch_size=16, block_size=1024, gradient_accumulation_steps=64)

# The keys analysis.mfu has always had, in their order (bandwidth_tb_s only with a datasheet row).
MFU_KEYS = ["device", "device_name", "gpu_key", "gpu_name", "dtype", "peak_tflops", "peak_source", "bandwidth_tb_s",
            "flops_per_step", "flops_method", "flops_analytic_per_step", "flops_counted_per_step", "flops_agreement",
            "tokens_per_step", "step_s", "timeline", "achieved_tflops", "mfu", "ceiling_tflops", "ceiling_method",
            "ceiling_dtype", "ceiling_share_of_peak", "mfu_vs_ceiling", "floor_s", "floor_s_ceiling",
            "expected_step_s", "step_over_floor", "warnings", "reported_mfu_pct", "reported_source",
            "reported_step_s", "misreport", "reported_impossible"]
LOG_KEYS = ["path", "format", "iter_lines", "eval_lines", "skipped_lines", "steady_lines", "first_iter", "last_iter",
            "tokens_per_s_printed", "step_s_median", "step_s_p10", "step_s_p90", "reported_mfu_pct",
            "reported_mfu_lines", "last_loss", "tokens_per_step", "world_size", "gpu_key", "gpu_name", "dtype",
            "peak_tflops", "peak_source", "flops_per_step", "flops_source", "flops_per_token",
            "flops_per_token_config", "config_consistency", "implied_params", "implied_params_method", "nearest_gpt2",
            "true_mfu", "floor_s", "expected_step_s", "best_achievable_step_s", "step_over_floor", "verdict",
            "misreport", "size_table", "warnings"]


def test_the_mfu_result_saves_as_the_dict_it_replaces_and_reads_back():
    m = compute_mfu(_profile(probe={"tflops": 790.0, "method": "cuda-events", "dtype": "bf16"}), reported_mfu_pct=164.1)
    d = m.to_dict()
    assert list(d) == MFU_KEYS
    assert d["misreport"][0] == {"cause": "a100_constant", "text": m.misreport[0].text,
                                 "evidence": m.misreport[0].evidence}
    assert isinstance(d["warnings"], list) and d["expected_step_s"] == {"40%": m.expected_step_s["40%"],
                                                                        "60%": m.expected_step_s["60%"]}
    assert MfuResult.from_dict(d) == m
    assert MfuResult.from_dict(json.loads(json.dumps(d))) == m and MfuResult.from_dict(None) is None
    # no datasheet row (a CPU run): the key bandwidth_tb_s is not there, as before
    cpu = compute_mfu(_profile(device="cpu", device_name="CPU (x86)", step_s=1.0)).to_dict()
    assert list(cpu) == [k for k in MFU_KEYS if k != "bandwidth_tb_s"]


def test_the_bounds_repair_makes_a_new_result():
    p = _profile(probe={"tflops": 100.0, "method": "cuda-events", "dtype": "bf16"})  # the step beats the probe
    m = compute_mfu(p)
    assert m.mfu_vs_ceiling > 1
    fixed, _, repairs = enforce(p, p.stats, m, [])
    assert fixed is not m and fixed.mfu_vs_ceiling is None and m.mfu_vs_ceiling > 1
    assert fixed == replace(m, mfu_vs_ceiling=None, warnings=fixed.warnings)
    assert fixed.warnings[:-1] == m.warnings and "mfu vs ceiling not measured" in fixed.warnings[-1]
    assert repairs == [f"mfu.mfu_vs_ceiling {m.mfu_vs_ceiling:.4g} -> not measured"]
    same, _, _ = enforce(p, p.stats, fixed, [])
    assert same is fixed


def test_an_analysis_saved_by_an_older_gpuprof_loads_and_renders(tmp_path):
    prof = P.load(SCHEMA1_CPU)
    a = analyze(prof, gpu="h200", reported_mfu_pct=50.0)
    # as an older gpuprof wrote it: fewer MFU keys, the causes without evidence
    saved = json.loads(json.dumps(a.to_dict()))
    for key in ("ceiling_dtype", "flops_agreement", "reported_impossible", "bandwidth_tb_s", "timeline"):
        saved["mfu"].pop(key)
    saved["mfu"]["misreport"] = [{"cause": c["cause"], "text": c["text"]} for c in saved["mfu"]["misreport"]]
    path = tmp_path / "old.gpuprof.json"
    P.save(prof, path, saved)
    again, stored = P.read(path)
    back = Analysis.from_dict(stored, again)
    m = back.mfu
    assert m.ceiling_dtype is None and m.flops_agreement is None and m.reported_impossible is None
    assert m.bandwidth_tb_s is None and m.timeline is None
    assert m.mfu == a.mfu.mfu and m.warnings == a.mfu.warnings and m.peak_tflops == 67
    assert [c.cause for c in m.misreport] == [c.cause for c in a.mfu.misreport]
    assert all(c.evidence == {} for c in m.misreport)
    console = Console(width=120, record=True, color_system=None)
    render_diagnosis(again, back, console, details=True)
    text = console.export_text()
    assert "Model FLOPs utilization" in text and "Printed MFU 50.0% (--reported-mfu)" in text
    res = CliRunner().invoke(app, ["analyze", str(path), "--stored", "--details"], env={"COLUMNS": "120"})
    assert res.exit_code == 0, res.output
    assert "Model FLOPs utilization" in res.stdout
    res = CliRunner().invoke(app, ["analyze", str(path), "--stored", "--json"])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)["analysis"]["mfu"]
    assert list(printed) == [k for k in MFU_KEYS if k != "bandwidth_tb_s"] and printed["ceiling_dtype"] is None


def test_the_log_analysis_prints_as_the_dict_it_replaces():
    r = analyze_log(LOG, gpu="h200", config=FACTS_CFG)
    d = r.to_dict()
    assert list(d) == LOG_KEYS
    assert d["verdict"] == {"id": "healthy", "text": r.verdict.text}
    assert list(d["size_table"][0]) == ["model", "params", "flops_per_token", "floor_s", "true_mfu_at_step",
                                        "nanogpt_mfu_at_step"]
    assert [c["cause"] for c in d["misreport"]] == ["a100_constant", "impossible"]
    assert LogAnalysis.from_dict(json.loads(json.dumps(d))) == r
    assert isinstance(r.verdict, LogVerdict) and isinstance(r.size_table[0], SizeRow)
    assert isinstance(r.misreport[0], MisreportCause)
    res = CliRunner().invoke(app, ["analyze", "--log", str(LOG), "--gpu", "h200", "--batch-size", "16",
                                   "--block-size", "1024", "--grad-accum", "64", "--json"])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    assert list(printed) == [*LOG_KEYS, "findings"] and printed["findings"][0]["id"] == "mfu-misreported"
    assert {k: v for k, v in printed.items() if k != "findings"} == json.loads(json.dumps(d))


@pytest.mark.parametrize("older", [{"path": "x.log"}, {"path": "x.log", "verdict": None, "misreport": None}])
def test_an_older_log_result_reads_with_its_missing_figures_none(older):
    r = LogAnalysis.from_dict(older)
    assert r.path == "x.log" and r.true_mfu is None and r.verdict is None and r.misreport == ()
    assert r.iter_lines == 0 and r.world_size == 1
