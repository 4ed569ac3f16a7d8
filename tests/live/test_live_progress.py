"""The live progress of `diagnose`: a panel on a terminal (the script's lines whole above it),
plain lines otherwise, nothing under --json; its figures are the closed steps' own."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from typer.testing import CliRunner

from gpuprof.cli import app
from gpuprof.render.live import LiveProgress
from gpuprof.report.live import PLAIN, TITLE, gpu_line, live_figures, live_view, post_plain_line, where


def _rec(i, wall, data, fwd, tokens=100):
    return {"index": i, "wall_s": wall, "phases": {"data": data, "forward": fwd, "backward": wall - data - fwd},
            "tokens": tokens, "micro_steps": 1}


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


MEASURED = [_rec(1, 0.2, 0.05, 0.05), _rec(2, 0.4, 0.1, 0.1), _rec(3, 0.4, 0.3, 0.05)]


def test_the_live_figures_are_the_reports_typical_step():
    # 3 measured steps of 100 tokens, 1.0 s of phases in all, none irregular: the typical step
    # (the report's: the mean of the regular steps' phases) 333 ms, 300 tokens/s;
    # host phases data 0.45 s, backward 0.35 s, forward 0.2 s of 1.0 s.
    f = live_figures(MEASURED)
    assert (f.last, f.typical, f.tokens_per_s) == ("400 ms", "333 ms", "300 tokens/s")
    assert [(r.phase, r.share_text) for r in f.shares] == [("data", "45.0%"), ("backward", "35.0%"),
                                                           ("forward", "20.0%")]
    assert [r.share for r in f.shares] == pytest.approx([0.45, 0.35, 0.20])
    assert f.line == "step 333 ms typical; 300 tokens/s; data 45%, backward 35%, forward 20%"
    assert f.headline == "step 400 ms last, 333 ms typical · 300 tokens/s"
    assert live_figures([]) is None
    assert live_figures([_rec(0, 0.5, 0.25, 0.05, tokens=0)]).headline.endswith("· tokens/s not measured")


def test_the_live_view_words_where_the_run_is_and_the_gpu():
    assert [where(d, 1, 3) for d in (1, 2, 4)] == ["warmup 1/1", "measured 1/3", "measured 3/3"]
    assert where(5, 2, None) == "measured 3"
    assert gpu_line({"gpu_util_pct": 87.0, "mem_used_bytes": 3 * 2**30}) == (
        "GPU utilization 87% (NVML, latest sample) · memory used 3.00 GiB")
    assert gpu_line({"gpu_util_pct": 12.4}) == "GPU utilization 12% (NVML, latest sample)"
    assert gpu_line({}) is None and gpu_line(None) is None  # off a GPU, or before its first sample
    v = live_view("train.py", 4, 1, 3, MEASURED, post="FLOP count")
    assert (v.title, v.heading, v.gpu_line) == (TITLE, "train.py: measured 3/3", None)
    assert v.plain_line == f"{PLAIN}measured 3/3: {v.figures.line}" and v.post_line == "after the run: FLOP count"
    assert live_view("w", 1, 1, 3, []).figures is None


def test_plain_lines_at_warmup_end_every_few_seconds_and_at_the_end():
    buf = io.StringIO()
    clock = Clock()
    live = LiveProgress(Console(file=buf, width=200), what="w", warmup=1, steps=3, live=False, clock=clock)
    with live:
        live.on_step(_rec(0, 1.0, 0.5, 0.2))  # warmup: a line that it ended
        clock.t = 1.0
        live.on_step(MEASURED[0])  # < 5 s since the last line: quiet
        clock.t = 2.0
        live.on_step(MEASURED[1])
        clock.t = 3.0
        live.on_step(MEASURED[2])  # the last measured step: a line
        live.on_post("FLOP count (up to 1 s of the 5 s budget)")
    lines = buf.getvalue().splitlines()
    # each line is the live view's, printed whole
    assert lines[0] == f"{PLAIN}{where(1, 1, 3)}"
    assert lines[1] == f"{PLAIN}{where(4, 1, 3)}: {live_figures(MEASURED).line}"
    assert lines[2] == post_plain_line("FLOP count (up to 1 s of the 5 s budget)")
    assert len(lines) == 3


def test_disabled_prints_nothing():
    buf = io.StringIO()
    live = LiveProgress(Console(file=buf), what="w", warmup=0, steps=1, enabled=False, live=False)
    with live:
        live.on_step(_rec(0, 1.0, 0.5, 0.2))
        live.on_post("x")
    assert buf.getvalue() == ""


def test_live_panel_shows_shares_and_keeps_script_lines_whole(monkeypatch):
    buf = io.StringIO()
    console = Console(file=buf, width=80, force_terminal=True, color_system=None)
    live = LiveProgress(console, what="train.py", warmup=0, steps=2, live=True,
                        gpu_sample=lambda: {"gpu_util_pct": 87.0, "mem_used_bytes": 3 * 2**30})
    with live:
        live.on_step(_rec(0, 0.5, 0.25, 0.05, tokens=1000))
        print("iter 0: loss 5.0, time 500.00ms")  # the script's own line, while the panel is up
        live.on_step(_rec(1, 0.5, 0.25, 0.05, tokens=1000))
        panel = live._render()
    out = buf.getvalue()
    assert "iter 0: loss 5.0, time 500.00ms" in out  # printed whole, above the panel
    c = Console(file=io.StringIO(), width=80, color_system=None)
    c.print(panel)
    text = c.file.getvalue()
    records = [_rec(0, 0.5, 0.25, 0.05, tokens=1000)] * 2
    v = live_view("train.py", 2, 0, 2, records, sample={"gpu_util_pct": 87.0, "mem_used_bytes": 3 * 2**30})
    assert v.figures.typical == "500 ms" and v.figures.tokens_per_s == "2,000 tokens/s"
    for line in (v.title, v.heading, v.figures.headline, v.gpu_line):  # the panel places the view's lines
        assert line in text
    data = next(r for r in v.figures.shares if r.phase == "data")
    assert data.share_text == "50.0%"
    assert any(ln.lstrip("│ ").startswith("data      ") and ln.rstrip(" │").endswith(data.share_text)
               for ln in text.splitlines())
    assert " ".join(v.figures.caption.split()) in " ".join(text.replace("│", " ").split())


def test_cli_json_has_no_progress_and_plain_lines_otherwise():
    runner = CliRunner(mix_stderr=False) if "mix_stderr" in CliRunner.__init__.__code__.co_varnames else CliRunner()
    args = ["diagnose", "--n-layer", "1", "--n-embd", "32", "--batch-size", "2", "--block-size", "32",
            "--grad-accum", "1", "--steps", "2", "--warmup", "1", "--post-budget", "0", "--no-samplers"]
    r = runner.invoke(app, args + ["--json"])
    assert r.exit_code == 0, r.output
    assert "gpuprof: warmup" not in r.stderr and "gpuprof: measured" not in r.stderr
    r = runner.invoke(app, args)
    assert r.exit_code == 0
    assert "gpuprof: warmup 1/1" in r.stderr and "gpuprof: measured 2/2: step" in r.stderr
