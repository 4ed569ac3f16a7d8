"""Renderers show the results' figures and 'not measured' where they are missing."""

from pathlib import Path

from rich.console import Console

from gpuprof.analysis.logs import analyze_log
from gpuprof.analysis.mfu_results import LogAnalysis, MfuResult, MisreportCause
from gpuprof.render.mfu import log_analysis_panel, mfu_panel, samplers_panel


def _text(renderable) -> str:
    c = Console(width=200, record=True, color_system=None)
    c.print(renderable)
    return c.export_text()


def test_mfu_panel_figures_and_missing():
    m = MfuResult(flops_per_step=1.075e16, flops_method="analytic", flops_analytic_per_step=1.075e16,
                  flops_counted_per_step=1.07e16, flops_agreement=0.995, step_s=21.0, timeline="gpu",
                  achieved_tflops=512.0, dtype="bf16", gpu_name="NVIDIA H200 SXM", peak_tflops=989.5,
                  peak_source="datasheet", mfu=0.5174, ceiling_tflops=None, mfu_vs_ceiling=None,
                  floor_s=10.87, expected_step_s={"40%": 27.2, "60%": 18.1}, step_over_floor=1.93,
                  reported_mfu_pct=164.1, reported_source="--reported-mfu",
                  misreport=(MisreportCause("impossible", "164.1% MFU is impossible"),), warnings=("w1",))
    out = _text(mfu_panel(m))
    for s in ("1.07e+16", "MFU uses analytic", "21.00 s", "512.0 TFLOP/s", "989.5 TFLOP/s", "51.7%",
              "10.87 s", "18.10 s at 60%", "1.93×", "164.1%", "impossible", "w1"):
        assert s in out, s
    assert "not measured" in out  # the ceiling
    empty = _text(mfu_panel(MfuResult()))
    assert "not measured" in empty and "no datasheet peak" in empty


def test_samplers_panel_missing_and_present():
    out = _text(samplers_panel({}))
    assert out.count("not measured") == 2
    meas = {"nvml": {"available": False, "reason": "NVML could not start: Driver Not Loaded"},
            "host": {"available": True, "samples": 12, "interval_s": 0.1, "late_ticks": 1, "errors": 0,
                     "cost": {"thread_cpu_s": 0.004, "share_of_one_core": 0.003}, "disk": "nvme0n1",
                     "summary": {"cpu_pct": {"mean": 55.0}}, "unreadable": {"io_counters": "denied"},
                     "phases": {"data": {"samples": 4, "cpu_pct": 97.0, "disk_read_bytes_s": 2.5e9},
                                "forward": {"samples": 8, "cpu_pct": 30.0}}}}
    out = _text(samplers_panel(meas))
    for s in ("Driver Not Loaded", "samples 12", "late 1", "nvme0n1", "97%", "2.5 GB/s", "55%", "denied"):
        assert s in out, s


def test_log_analysis_panel_shows_the_facts_case():
    log = Path(__file__).parent / "fixtures" / "nanogpt_h200_21s_mfu164.log"
    r = analyze_log(log, gpu="h200", config=dict(batch_size=16, block_size=1024, gradient_accumulation_steps=64))
    out = _text(log_analysis_panel(r))
    for s in ("21.00 s", "164.1%", "1,048,576", "51.7%", "10.87 s", "healthy", "gpt2-xl", "4.3%", "impossible"):
        assert s in out, s


def test_the_floor_is_worded_once_for_a_run_and_a_log():
    from gpuprof.report.details import log_view, mfu_view

    m = MfuResult(floor_s=10.87, expected_step_s={"40%": 27.2, "60%": 18.1}, step_over_floor=1.93,
                  step_s=21.0, peak_tflops=989.5)
    run = {r.label: r for r in mfu_view(m).rows}["Step-time floor"].value
    log = {r.label: r for r in log_view(LogAnalysis(path="train.log", floor_s=10.87, step_over_floor=1.93,
                                                    expected_step_s={"40%": 27.2, "60%": 18.1})).rows}
    log = log["Step-time floor"].value
    head = "10.87 s at 100% of peak; expected 27.20 s at 40%, 18.10 s at 60%"
    assert run == head + "; measured 21.00 s = 1.93× the floor"
    assert log == head + "; logged 1.93× the floor"
    # the panel adds no figure of its own: every row's value is in the rendered text
    out = _text(mfu_panel(m))
    assert all(r.value in " ".join(out.split()) for r in mfu_view(m).rows if len(r.value) < 60)


def test_the_samplers_panel_is_decided_in_the_report_model():
    """report.details.samplers_view words every status, figure and note; the panel only lays them out."""
    from gpuprof.report.details import QUIET, samplers_view
    from gpuprof.sections import Sections

    view = samplers_view(Sections.from_measurements({}))
    assert [b.heading for b in view.blocks] == ["GPU (NVML)", "Host (psutil)"]
    assert [b.status.text for b in view.blocks] == ["  not measured", "  not measured"]
    meas = {"host": {"available": True, "samples": 12, "interval_s": 0.1, "late_ticks": 1, "errors": 0, "cpu_count": 8,
                     "cost": {"thread_cpu_s": 0.004, "share_of_one_core": 0.003}, "disk": "nvme0n1",
                     "disk_reason": "a guess", "summary": {"cpu_pct": {"mean": 55.0}},
                     "phases": {"forward": {"samples": 8, "cpu_pct": 30.0}, "data": {"samples": 4, "cpu_pct": 97.0}}}}
    (_, host) = samplers_view(Sections.from_measurements(meas)).blocks
    assert host.status.tone == QUIET and "samples 12 every 0.1 s, late 1" in host.status.text
    assert host.columns[:3] == ("phase", "n", "CPU")
    assert [r[:3] for r in host.rows] == [("steps", "12", "55%"), ("data", "4", "97%"), ("forward", "8", "30%")]
    assert "cores of 8" in host.lines[0].text and host.warnings == ("data disk: a guess",)
    out = _text(samplers_panel(meas))
    for text in (host.status.text.strip(), *host.rows[1], host.lines[0].text.strip(), "! data disk: a guess"):
        assert text in " ".join(out.split()), text
