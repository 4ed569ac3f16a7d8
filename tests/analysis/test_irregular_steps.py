"""Steps far slower than the others (a checkpoint, an eval, a GC pause inside the loop): named by
their own finding with what they cost the run, left out of the typical step the report prints,
so the phase table adds up to that step and no fix saves more than it (issue 18's bar: one 1 s
pause among eight ~45 ms steps)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprof.analysis.bounds import violations
from gpuprof.analysis.pipeline import analyze
from gpuprof.profile import Profile, StepRecord
from gpuprof.stats import irregular_indices, step_stats
from gpuprof.units import seconds

SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "pause_train.py"


def _steps(walls_and_phases):
    return [StepRecord(i, sum(ph.values()), dict(ph), tokens=64, micro_steps=1) for i, ph in enumerate(walls_and_phases)]


def test_which_steps_are_irregular():
    assert irregular_indices([0.045] * 7 + [1.045]) == [7]
    assert irregular_indices([0.045, 0.049, 0.041, 0.047, 0.044, 0.050, 0.043, 0.046]) == []  # jitter
    assert irregular_indices([0.045, 0.060, 0.044, 0.046]) == []  # 1.3x the median is not a pause
    assert irregular_indices([0.045, 1.0]) == []  # two steps: no median to stand out from
    assert irregular_indices([0.045, 0.045, 1.0, 1.0]) == []  # half of them: slow is the run's normal
    assert irregular_indices([0.045, 0.046, 0.044, 2.0, 0.045, 3.0, 0.047]) == [3, 5]


def test_the_typical_step_is_the_mean_of_the_others_and_its_phases_add_up_to_it():
    fast = {"data": 0.040, "forward": 0.002, "backward": 0.002, "optimizer": 0.001}
    steps = _steps([fast] * 7 + [dict(fast, other=1.0)])
    s = step_stats(steps)
    assert s.step_s == pytest.approx(0.045) and sum(p.seconds for p in s.phases.values()) == pytest.approx(s.step_s)
    assert s.typical == tuple(range(7)) and [x.index for x in s.irregular] == [7]
    (x,) = s.irregular
    assert x.phase == "other" and x.phase_extra_s == pytest.approx(1.0) and x.times_typical == pytest.approx(1.045 / 0.045)
    assert s.mean_s == pytest.approx((7 * 0.045 + 1.045) / 8) and s.irregular_cost_s == pytest.approx(0.125)
    assert s.median_s == pytest.approx(0.045) and s.tokens_per_s == pytest.approx(64 / 0.045)


def test_the_finding_names_the_pause_and_no_fix_saves_more_than_the_typical_step():
    fast = {"data": 0.040, "forward": 0.002, "backward": 0.002, "optimizer": 0.001}
    steps = _steps([fast] * 7 + [dict(fast, data=1.040)])  # the pause is in data this time
    p = Profile(run={"mode": "builtin", "config": {"device": "cpu", "grad_accum": 1}}, steps=steps,
                environment={"device": "cpu", "device_name": "CPU"})
    a = analyze(p)
    f = a.finding("irregular-steps")
    assert f is not None and f.kind == "irregular" and f.saving_s is None
    assert "#7" in f.title and "23.22× the typical step" in f.title
    assert f.evidence["cost_per_step_s"] == pytest.approx(0.125)
    assert f.evidence["share_of_measured_time"] == pytest.approx(0.125 / 0.170)
    assert "persistent_workers=True" in f.fix and "epoch" in f.note  # the data phase grew: its usual causes
    data = a.finding("data-loading-exposed")
    assert data.saving_s == pytest.approx(0.040)  # judged on the typical step, not inflated by the pause
    assert all((x.saving_s or 0) <= a.stats.step_s for x in a.findings)
    assert violations(p, a) == []


def test_a_script_with_one_1s_pause_among_eight_45ms_steps(tmp_path):
    """The issue's case end to end: the script's steps sleep 40 ms in get_batch (so they take ~45
    ms on any CPU) and one pauses 1 s after its optimizer step."""
    out = tmp_path / "pause.gpuprof.json"
    r = subprocess.run([sys.executable, "-m", "gpuprof", "diagnose", "--steps", "8", "--warmup", "2",
                        "--post-budget", "0", "--no-samplers", "--details", "--out", str(out), str(SCRIPT)],
                       capture_output=True, text=True, timeout=180, env=dict(os.environ, COLUMNS="100"))
    assert r.returncode == 0, r.stderr[-3000:]
    saved = json.loads(out.read_text())
    steps, findings = saved["analysis"]["steps"], saved["analysis"]["findings"]
    # the 1 s sleep, named; a step the suite's other worker slowed may be irregular too (seen: a 101-ms
    # step, +36 ms in `other`, beside the 1-s pause in a full suite, 2026-12-07): it is, but not a pause
    pause = [x for x in steps["irregular"] if x["phase"] == "other" and x["phase_extra_s"] >= 0.5]
    assert len(pause) == 1 and 0.9 <= pause[0]["phase_extra_s"] <= 1.5
    assert 0.040 <= steps["step_s"] < 0.25  # the typical step: a 40 ms sleep and a tiny model, not the pause
    irr = next(f for f in findings if f["id"] == "irregular-steps")
    assert f"#{pause[0]['index']}" in irr["title"] and irr["evidence"]["cost_per_step_s"] > 0.09
    # No fix saves more than the step it is a share of; together they save at most all of it.
    fixes = [f for f in findings if f["kind"] == "fix" and f["saving_s"] is not None]
    assert all(f["saving_s"] <= steps["step_s"] for f in fixes)
    assert sum(f["saving_s"] for f in fixes) <= steps["step_s"] * (1 + 1e-9)
    # The report (--details: the whole of it): the headline step, the phase table's total row and the shares agree.
    text = " ".join(r.stdout.replace("│", " ").split())
    head = seconds(steps["step_s"])
    assert f"step {head} (typical: the mean of" in text and "irregular step" in text
    assert re.search(rf"total {re.escape(head)} 100\.0%", text), text[-2000:]
    assert "Irregular steps (not in the typical step)" in text
