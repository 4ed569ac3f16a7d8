"""A timed saving's interval in the `saves` line (the report model: the terminal and the HTML page
lay out the same words), "within this machine's noise" where nothing is claimed, and two top fixes
whose intervals overlap marked tied by the engine (issue #29)."""

import pytest
from rich.console import Console

from gpuprof.analysis.engine import rank, with_share
from gpuprof.analysis.findings import Finding
from gpuprof.render.html import _findings
from gpuprof.render.terminal import findings_table
from gpuprof.report.model import Report, finding_view, group_findings


def _timed(fid, saving, low, high, rounds=8, level=0.9296875, claims=None, **kw):
    ev = {"saving_low_s": low, "saving_high_s": high, "interval_level": level, "rounds": rounds,
          "within_noise": saving is None}
    return Finding(fid, f"{fid} title", saving, evidence=ev, claims=claims or {}, **kw)


def _text(renderable) -> str:
    c = Console(width=200, record=True, color_system=None)
    c.print(renderable)
    return c.export_text()


def test_the_saves_line_carries_the_interval_on_every_renderer():
    f = with_share(_timed("precision-slow", 0.031, 0.018, 0.041, confidence="high"), 0.2)
    v = finding_view(f)
    assert v.saves_line == ("31.0 ms per step (18.0–41.0 ms, 93%, 8 rounds; 15.5% of the typical step, 9.0–20.5%); "
                            "confidence high")
    g = group_findings([f])
    assert "saves 31.0 ms per step (18.0–41.0 ms, 93%, 8 rounds" in g.verdict_text
    assert v.saves_line in _text(findings_table([f]))
    html = _findings(Report(title="", run_line="", has_steps=True, verdict_text=g.verdict_text, fixes=g.fixes))
    assert "31.0 ms per step (18.0–41.0 ms, 93%, 8 rounds; 15.5% of the typical step, 9.0–20.5%)" in html


def test_within_noise_claims_nothing_and_says_so():
    f = _timed("micro-batch-too-small", None, -0.005, 0.012, kind="info", confidence="low")
    v = finding_view(f)
    assert v.saves == "none claimed: within this machine's noise (-5.0 ms to 12.0 ms, 93%, 8 rounds)"
    assert not v.saves_time and v.saves_line.endswith("; confidence low")


def test_a_saving_without_an_interval_reads_as_before():
    f = with_share(Finding("data-loading-exposed", "t", 0.05, confidence="high"), 0.5)
    assert finding_view(f).saves == "50.0 ms per step (10.0% of the typical step)"


def test_the_top_two_fixes_tied_within_noise_are_marked():
    a = _timed("precision-slow", 0.030, 0.018, 0.041)
    b = _timed("micro-batch-too-small", 0.025, 0.010, 0.035)
    c = _timed("attention-by-hand", 0.005, 0.002, 0.008)  # apart from the top one
    d = Finding("data-loading-exposed", "t", 0.020)  # no interval: never tied
    top, second, third, fourth = rank([c, d, b, a])
    assert [top.id, second.id, fourth.id] == ["precision-slow", "micro-batch-too-small", "attention-by-hand"]
    assert top.tied_with == ["micro-batch-too-small"] and second.tied_with == ["precision-slow"]
    assert third.tied_with == [] and fourth.tied_with == []
    assert finding_view(with_share(top, 0.2)).saves.endswith("; tied with micro-batch-too-small within noise")
    # intervals apart: ordered by the measurements, no tie
    ranked = rank([_timed("precision-slow", 0.030, 0.025, 0.041), _timed("micro-batch-too-small", 0.010, 0.005, 0.020)])
    assert all(f.tied_with == [] for f in ranked)


def test_ties_below_the_top_fix_are_marked_too():
    a = _timed("precision-slow", 0.060, 0.050, 0.070)  # apart from both others
    b = _timed("micro-batch-too-small", 0.025, 0.015, 0.035)
    c = _timed("attention-by-hand", 0.012, 0.008, 0.018)  # overlaps b only
    top, second, third = rank([c, a, b])
    assert top.tied_with == [] and second.tied_with == ["attention-by-hand"]
    assert third.tied_with == ["micro-batch-too-small"]


def test_a_capped_saving_caps_its_interval():
    a = _timed("precision-slow", 0.030, 0.018, 0.041, claims={"forward": 0.030})
    b = _timed("micro-batch-too-small", 0.025, 0.010, 0.035, claims={"forward": 0.025})

    class Stats:
        step_s = 0.2
        phases = {"forward": type("P", (), {"seconds": 0.04})()}

    top, second = rank([a, b], Stats())
    assert second.saving_s == pytest.approx(0.010) == second.evidence["saving_high_s"]
    assert second.evidence["saving_low_s"] == 0.010  # its low end was already under what is left



def test_the_first_screen_keeps_the_range_and_drops_the_level_and_rounds():
    """Issue #43: the first screen's saving is the same figure with its range in seconds and its
    share of the typical step (no bare percentage); the level and rounds are in --details."""
    from gpuprof.report.first_screen import saving_short

    f = with_share(_timed("precision-slow", 0.031, 0.018, 0.041, confidence="high"), 0.2)
    assert saving_short(f) == "31.0 ms per step (18.0–41.0 ms), 15.5% of the typical step; confidence high"
    plain = with_share(Finding("data-loading-exposed", "t", 0.05, confidence="medium"), 0.5)
    assert saving_short(plain) == "50.0 ms per step, 10.0% of the typical step; confidence medium"
    a, b = rank([_timed("precision-slow", 0.030, 0.018, 0.041), _timed("micro-batch-too-small", 0.025, 0.010, 0.035)])
    assert saving_short(with_share(a, 0.2)).endswith("; tied with micro-batch-too-small within noise; confidence medium")
    ceiling = Finding("compile-missing", "t", None, evidence={"ceiling_s": 0.3}, confidence="low")
    assert saving_short(ceiling) == "not estimated; at most 300 ms per step; confidence low"


def test_the_first_screen_names_a_change_timed_within_noise_as_claiming_nothing():
    from gpuprof.report.first_screen import info_text

    f = _timed("micro-batch-too-small", None, -0.005, 0.012, kind="info", confidence="low")
    assert info_text(f) == ("micro-batch-too-small title (timed: within this machine's noise, no saving "
                            "claimed)")
    assert info_text(Finding("cpu-saturated", "the host's CPUs were 100% busy", kind="info")) == \
        "the host's CPUs were 100% busy"
