"""The report people read, rendered from real profiles (the built-in loop, CPU scenarios) and a
hand-built CUDA one at 80 and 120 columns: the first screen by default (verdict and top fixes
first, at most 25 lines at 100 columns), the whole report and the details only when asked, one
value per figure, nothing wider than the terminal, no truncated cell, no broken word."""

import copy
import dataclasses
import types
from pathlib import Path

import pytest
from rich.console import Console

from gpuprof import scenarios as S
from gpuprof.analysis.bounds import violations
from gpuprof.analysis.logs import analyze_log
from gpuprof.analysis.pipeline import analyze
from gpuprof.analysis.rules.logs import log_findings
from gpuprof.measure.host import HostSampler
from gpuprof.measure.instruments import default_instruments
from gpuprof.report.details import HOST_COLS as _HOST_COLS, NVML_COLS as _NVML_COLS
from gpuprof.render.terminal import findings_table, render_diagnosis
from gpuprof.report.first_screen import HEADINGS as FS, build_first_screen
from gpuprof.report.model import build_report
from gpuprof.report.words import HEADINGS
from gpuprof.runners.builtin import LoopConfig, run_builtin
from gpuprof.units import pct, seconds
from render_report.profiles import cpu_profile, gpu_profile

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = (80, 120)
SCENARIOS = ("slow-storage", "eval-every-step", "tiny-micro-batch")


def unsampled(profile):
    """A copy of a measured profile whose host sampler took no sample: what a run shorter than
    one sampling interval gets (a fast machine), from the real sampler, driven by hand
    (threaded=False) and stopped before any sample."""
    p = copy.deepcopy(profile)
    smp = HostSampler(interval_s=p.measurements["host"]["interval_s"], threaded=False)
    ctx = types.SimpleNamespace(timer=None, profile=p, config=p.config)
    smp.start(ctx)
    p.measurements["host"] = smp.stop(ctx)
    assert p.measurements["host"]["available"] and p.measurements["host"]["samples"] == 0
    return p


@pytest.fixture(scope="module")
def reports():
    """name -> (profile, analysis); measured once for the module (~10 s on 2 cores).

    How many host samples the measured runs hold (every 50 ms over runs of a few tenths of a
    second) and what the post-run parts fit in their budget depend on the machine's speed; no
    assertion below depends on either (each holds for whatever the run measured), and so that
    every machine renders the same shapes, "builtin-unsampled" is the built-in run with no host
    sample and "cuda" a hand-built one with ten in every phase."""
    out = {}
    cfg = LoopConfig(n_layer=1, n_head=2, n_embd=32, batch_size=2, block_size=32, grad_accum=2, steps=3,
                     warmup=1)
    p = run_builtin(cfg, instruments=default_instruments("cpu", None, interval_s=0.05), post_budget_s=3)
    out["builtin"] = (p, analyze(p))
    q = unsampled(p)
    out["builtin-unsampled"] = (q, analyze(q))
    by_name = {sc.name: sc for sc in S.discover(ROOT / "scenarios")}
    for name in SCENARIOS:
        sc = by_name[name]
        sc = dataclasses.replace(sc, config={**sc.config, "steps": 2, "warmup": 1})
        inst = default_instruments("cpu", None, probe=False, flops=False, interval_s=0.05,
                                   microbatch=name == "tiny-micro-batch")
        res = S.run(sc, instruments=inst)
        out[name] = (res.profile, analyze(res.profile))
    g = gpu_profile()
    for s in g.steps:
        s.extra = {"h2d_pageable": 8, "h2d_pageable_bytes": 200e6}
    out["cuda"] = (g, analyze(g, gpu="h200"))
    return out


def render(profile, analysis, width: int, details: bool = False) -> str:
    c = Console(width=width, record=True, color_system=None)
    render_diagnosis(profile, analysis, c, details=details)
    return c.export_text()


def flat(text: str) -> str:
    """The text as one line of words: wrapped lines joined, panel edges and column rules dropped.
    A word broken across lines ("backwa" + "rd") does not survive this; a wrapped sentence does."""
    return " ".join(text.replace("│", " ").replace("┃", " ").split())


def _texts(f) -> list[str]:
    from gpuprof.report.words import because_text

    return [t for t in (f.title, f.fix, because_text(f), f.note) if t]


CASES = [(name, w, det) for name in ("builtin", "builtin-unsampled", *SCENARIOS, "cuda") for w in WIDTHS
         for det in (False, True)]


def test_the_measured_profiles_are_physical(reports):
    for name, (p, a) in reports.items():
        assert violations(p, a) == [], name


@pytest.mark.parametrize("name, width, details", CASES)
def test_fits_the_width_with_no_truncated_cell_and_no_broken_word(reports, name, width, details):
    p, a = reports[name]
    text = render(p, a, width, details)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    assert "…" not in text
    whole = flat(text)
    if not details:  # the first screen: the top fixes' titles, savings and changes, the phases in one line
        fs = build_first_screen(p, a)
        for fix in fs.fixes:
            for part in (fix.title, fix.saves, fix.change):
                assert flat(part) in whole, (name, width, part)
        assert flat(f"{FS.phases} " + " │ ".join(f"{ph} {sh}" for ph, sh in fs.phases)) in whole
        assert f"step {seconds(p.stats.step_s)} (" in whole
        return
    for f in a.findings:
        for part in _texts(f):
            assert flat(part) in whole, (name, width, part)
    # the phase table uses the whole width and each row keeps its cells on its line
    border = next(line for line in lines if line.startswith("┏"))
    assert len(border) == width
    for phase, e in p.stats.phases.items():
        row = next(line for line in lines if line.startswith(f"│ {phase} "))
        assert seconds(e.seconds) in row and pct(e.share) in row
    # ... and its total row is the headline step
    total = next(line for line in lines if line.startswith("│ total "))
    assert seconds(p.stats.step_s) in total and f"step {seconds(p.stats.step_s)} (" in whole


@pytest.mark.parametrize("name", ["builtin", "builtin-unsampled", *SCENARIOS, "cuda"])
def test_the_first_screen_is_verdict_first_and_at_most_25_lines_at_100_columns(reports, name):
    """Issue #43: without --details, at 100 columns, at most 25 lines come before "more with
    --details"; the verdict comes right after the run and the step (at most 3 lines)."""
    p, a = reports[name]
    lines = render(p, a, 100).splitlines()
    hint = next(i for i, line in enumerate(lines) if line.startswith(FS.details_flag))
    assert hint <= 25, "\n".join(lines)
    verdict = next(i for i, line in enumerate(lines) if line.startswith(FS.verdict))
    assert verdict <= 4 and lines[0].startswith("gpuprof diagnosis") and lines[1].startswith("step ")
    assert "What ran" not in "\n".join(lines) and "┏" not in "\n".join(lines)  # no table on the first screen


@pytest.mark.parametrize("width", WIDTHS)
def test_sampler_tables_keep_every_cell_whole(reports, width):
    """Today's `backwa…` and `1020 / MiB`: at 80 columns the columns continue in a second table,
    each row's cells stay on its line."""
    p, a = reports["cuda"]
    lines = render(p, a, width, details=True).splitlines()
    for section, cols in (("host", _HOST_COLS), ("nvml", _NVML_COLS)):
        for phase, row in p.measurements[section]["phases"].items():
            mine = [line for line in lines if line.startswith(f"│ {phase} ") and "┃" not in line]
            mine = [line for line in mine if line.count("│") >= 3]
            joined = " ".join(mine)
            for key, _, fmt in cols:
                assert fmt(row.get(key)) in joined, (section, phase, key)
    text = "\n".join(lines)
    # 1.07e9 bytes of memory (RSS, GPU memory used): binary units, units.gib
    assert "│ backward  │" in text and "1020 MiB" in text


def test_verdict_and_fixes_come_first_details_only_when_asked(reports):
    p, a = reports["cuda"]
    short = render(p, a, 100)
    for absent in ("Model FLOPs utilization", "What the machine did", "Details", "Where a typical step's time goes",
                   "What ran", "noise:"):
        assert absent not in short
    assert FS.details_flag in flat(short)
    order = [short.index(s) for s in ("step ", "Verdict:", FS.fixes, FS.phases, FS.corrected, FS.details_flag)]
    assert order == sorted(order)
    full = render(p, a, 100, details=True)
    order = [full.index(s) for s in ("step ", "Verdict:", "Fixes, ranked", "Where a typical step's time goes",
                                     "A typical step on", "MFU ", "What ran", "Model FLOPs utilization",
                                     "What the machine did")]
    assert order == sorted(order)
    # the fix: its saving and the one-line change first; the evidence in words with --details
    top = a.findings[0]
    assert top.id == "data-loading-exposed"
    assert (f"saves {seconds(top.saving_s)} per step, {pct(top.saving_share)} of the typical step; confidence "
            f"{top.confidence}") in flat(short)
    assert f"change {flat(top.fix)}" in flat(short)
    assert f"saves {seconds(top.saving_s)} per step ({pct(top.saving_share)} of the typical step)" in flat(full)
    assert "because the GPU sat idle 50.0 ms per step" in flat(full)
    assert "because the GPU sat idle" not in flat(short)
    assert "MFU 7.7% of the bf16 datasheet peak" in flat(short)  # MFU on the step line
    assert "MFU 7.7% of the bf16 datasheet peak of NVIDIA H200" in flat(full)  # MFU in one line
    # the phases in one line, in the words a nanoGPT user uses: h2d is the copy to GPU
    assert f"{FS.phases} data 14% │ copy to GPU 1% │ forward 27% │ backward 54% │ optimizer 3%" in short
    # the first screen's figures are the full report's, shortened, never new ones
    fs = build_first_screen(p, a)
    r = build_report(p, a)
    assert fs.step == r.step and [f.title for f in fs.fixes] == [f.title for f in r.fixes[:3]]


def test_one_step_figure_on_the_page():
    """Steps of 1.0, 1.1 and 1.6 s (none irregular: 1.6 < 1.5 × the median): the headline step is
    their mean, 1.23 s, labelled once with how it was obtained; the phase table's total is the same
    figure; the median, 1.10 s, is shown only as the spread's, labelled."""
    p = cpu_profile([{"data": 0.1, "forward": 0.3, "backward": 0.6},
                     {"data": 0.1, "forward": 0.35, "backward": 0.65},
                     {"data": 0.6, "forward": 0.35, "backward": 0.65}])
    a = analyze(p)
    assert seconds(p.stats.step_s) == "1.23 s" and seconds(p.stats.median_s) == "1.10 s" and not p.stats.irregular
    r = build_report(p, a)
    assert r.step == "1.23 s"
    assert r.step_statistic.startswith("mean of 3 measured steps, host wall time; median 1.10 s")
    assert r.phase_total == (r.step, "100.0%")  # the phase table adds up to the headline step
    text = flat(render(p, a, 120, details=True))
    assert text.count(flat(r.step_statistic)) == 1  # the statistic is named once
    assert f"{HEADINGS.step} {r.step} ({flat(r.step_statistic)})" in text  # the step line places both
    assert f"{HEADINGS.total} {' '.join(r.phase_total)}" in text  # ... and the total row repeats the step
    short = flat(render(p, a, 120))  # the first screen: the step once, labelled, and no other step figure
    assert f"{HEADINGS.step} {r.step} (the mean of 3 measured steps, host wall time)" in short
    assert short.count(r.step) == 1 and seconds(p.stats.median_s) not in short
    assert all(f.evidence.get("step_s", p.stats.step_s) == p.stats.step_s for f in a.findings)


def test_timeline_below_the_phase_table_with_a_gpu_row_only_on_the_gpu_timeline(reports):
    g = render(*reports["cuda"], 80, details=True)
    c = render(*reports["builtin"], 80, details=True)
    assert g.index("Where a typical step's time goes") < g.index("A typical step on") < g.index("MFU ")
    gpu_row = next(line for line in g.splitlines() if line.startswith("GPU  "))  # the row, not a caption
    assert "·" in gpu_row and "█" in gpu_row  # idle while the host loads, busy otherwise
    assert not any(line.startswith("GPU  ") for line in c.splitlines())
    assert "the host's phase spans as measured, in the order they ran" in flat(c)
    # A profile without measured spans (an older one) says its order is laid out, not measured.
    p, a = copy.deepcopy(reports["builtin"])  # the fixture is shared: change a copy
    for st in p.steps:
        st.extra.pop("spans", None)
    assert "The order is the loop's, not measured" in flat(render(p, a, 80, details=True))


def test_script_attribution_is_a_detail_and_the_scripts_own_log_is_not():
    p = cpu_profile([{"data": 0.2, "forward": 0.3, "backward": 0.5}] * 3)
    p.run.update(mode="script", command=["train.py", "--batch_size=8"])
    p.measurements["script"] = {
        "top_functions": {"data": [{"function": "get_batch", "file": "train.py", "line": 117, "share": 0.93,
                                    "hot_line": 121}]},
        "sampler": {"interval_s": 0.01, "samples": 40, "misses": 0},
        "reported": {"lines": 3, "format": "nanogpt", "step_ms_median": 1000.0}}
    a = analyze(p)
    short, full = render(p, a, 80), render(p, a, 80, details=True)
    assert "get_batch (train.py:117)" in flat(full)  # in the data fix's evidence, with --details
    assert "get_batch (train.py:117)" not in flat(short)
    assert "user code by phase" not in short and "user code by phase" in full
    assert "the script's own log: nanogpt format" in flat(full)
    assert "the script's own log" not in flat(short)


@pytest.mark.parametrize("width", WIDTHS)
def test_log_findings_fit_the_width(width):
    log = ROOT / "tests" / "mfu" / "fixtures" / "nanogpt_h200_21s_mfu164.log"
    res = analyze_log(log, gpu="h200", config=dict(batch_size=16, block_size=1024, gradient_accumulation_steps=64))
    findings = log_findings(res)
    c = Console(width=width, record=True, color_system=None)
    c.print(findings_table(findings))
    text = c.export_text()
    assert max(len(line) for line in text.splitlines()) <= width and "…" not in text
    for f in findings:
        for part in _texts(f):
            assert flat(part) in flat(text)
    assert "Verdict: compute-bound" in text and "Corrections" in text


def test_cli_analyze_shows_details_only_with_the_flag(tmp_path):
    """The hand-off: `gpuprof analyze PROFILE [--details]` prints the short report in 80 columns,
    and the MFU table and samplers only when asked."""
    from typer.testing import CliRunner

    from gpuprof.cli import app

    path = tmp_path / "cuda.gpuprof.json"
    path.write_text(gpu_profile().to_json())  # saved without an analysis: analyze makes one
    runner = CliRunner()
    short = runner.invoke(app, ["analyze", str(path)], env={"COLUMNS": "80"})
    full = runner.invoke(app, ["analyze", str(path), "--details"], env={"COLUMNS": "80"})
    assert short.exit_code == 0 and full.exit_code == 0, short.output + full.output
    assert "Verdict:" in short.stdout and "Model FLOPs utilization" not in short.stdout
    assert "Model FLOPs utilization" in full.stdout and "What the machine did" in full.stdout
    for res in (short, full):
        assert max(len(line) for line in res.stdout.splitlines()) <= 80 and "…" not in res.stdout


def test_the_noise_line_gives_the_step_spread_and_the_other_processes_cpu():
    """Issue #29: the run's own noise is shown, measured: the steps' (p90 − p10) ÷ median and, from
    the host sampler, what other processes used; on a GPU timeline, the GPU's other work is said
    to be not measured (NVML's utilisation is the device's)."""
    from gpuprof.report.model import build_report

    p = cpu_profile([{"forward": 0.3, "backward": 0.6}, {"forward": 0.35, "backward": 0.65},
                     {"forward": 0.3, "backward": 0.7}])
    r = build_report(p, analyze(p))
    assert r.noise.startswith(f"this run's steps varied {pct(p.stats.spread, 0)}")
    assert "other processes' CPU not measured (no host samples)" in r.noise
    g = gpu_profile()
    r = build_report(g, analyze(g))
    assert "other processes used 0.20 of 16 cores meanwhile" in r.noise
    assert "other work on the GPU not measured" in r.noise
    assert "noise: " + r.noise.split(";")[0] in flat(render(g, analyze(g), 200, details=True))


def test_the_noise_line_leaves_irregular_steps_out():
    """An eval step among regular ones is named irregular, not noise: the noise line gives the
    typical steps' own spread (five of 1.00–1.10 s: about 8%), not the spread
    the eval step makes of all six."""
    from gpuprof.report.model import build_report

    steps = [{"forward": 0.3, "backward": 0.7}, {"forward": 0.35, "backward": 0.7},
             {"forward": 0.3, "backward": 0.8}, {"forward": 0.3, "backward": 0.7},
             {"forward": 0.3, "backward": 2.7}, {"forward": 0.35, "backward": 0.7}]
    p = cpu_profile(steps)
    assert len(p.stats.irregular) == 1 and p.stats.spread > 0.5
    r = build_report(p, analyze(p))
    assert p.stats.typical_spread == pytest.approx(0.1 / 1.05, rel=0.2) and p.stats.typical_spread < 0.15
    assert r.noise.startswith(f"this run's typical steps varied {pct(p.stats.typical_spread, 0)} ((p90 − p10) "
                              "÷ median of 5 steps, the irregular ones left out)")


def test_the_outlier_steps_are_one_line_of_the_first_screen_and_their_section_a_detail():
    """An eval step among regular ones: on the first screen one line names it, how much slower it
    was and in which phase, what it costs the run and the usual change; the full section (its
    evidence and note) is in --details."""
    steps = [{"data": 0.1, "forward": 0.3, "backward": 0.7}, {"data": 0.1, "forward": 0.35, "backward": 0.7},
             {"data": 0.1, "forward": 0.3, "backward": 0.8}, {"data": 0.1, "forward": 0.3, "backward": 0.7},
             {"data": 0.1, "forward": 0.3, "backward": 0.7, "eval": 2.0}, {"data": 0.1, "forward": 0.35, "backward": 0.7}]
    p = cpu_profile(steps)
    a = analyze(p)
    (slow,) = p.stats.irregular
    finding = next(f for f in a.findings if f.kind == "irregular")
    short, full = render(p, a, 100), render(p, a, 100, details=True)
    line = next(x for x in short.splitlines() if x.startswith(FS.outliers))
    assert f"#{slow.index} ({slow.times_typical:.2f}× the typical step, eval +{seconds(slow.phase_extra_s)})" in line
    assert f"they add {seconds(p.stats.irregular_cost_s)} per step over the run" in flat(short)
    assert f"usual change: {finding.fix}" in flat(short)
    assert HEADINGS.irregular not in short and HEADINGS.irregular in full
    assert flat(finding.because) in flat(full) and flat(finding.note) in flat(full)
    assert "1 outlier step left out" in flat(short)
