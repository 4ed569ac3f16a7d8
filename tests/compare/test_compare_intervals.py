"""compare with intervals (issue #29): a timed saving judged against its promised interval, the
step change's Hodges–Lehmann / Mann–Whitney interval, and the --significant gate."""

import itertools
import json
from collections import Counter
from math import comb

import numpy as np
import pytest
from typer.testing import CliRunner

import gpuprof.cli.compare  # noqa: F401 - registers the verb on app
from compare_profiles import BASE_PHASES, finding, hand, noise, scaled_steps
from gpuprof.analysis.compare import compare, critical_u, mann_whitney_counts, step_change, verdict
from gpuprof.cli import app
from gpuprof.profile import save
from gpuprof.report.compare import compare_view, outcome_line

runner = CliRunner()
TIMED = {"saving_low_s": 0.08, "saving_high_s": 0.16, "interval_level": 0.923, "rounds": 16,
         "interval_statistic": "sign", "within_noise": False}


def timed_pair(drop: float, evidence: dict | None = None, predicted: float = 0.12):
    """BEFORE (1.0 s steps, forward 0.2 + backward 0.4) with a precision-slow fix predicting
    `predicted` s out of forward+backward, timed with `evidence`'s interval; AFTER with forward+backward
    `drop` s shorter (split 1:2 like the claims)."""
    b = hand([BASE_PHASES] * 4, findings=[finding(
        "precision-slow", predicted, {"forward": predicted / 3, "backward": predicted * 2 / 3},
        evidence=TIMED if evidence is None else evidence)])
    a = hand([dict(BASE_PHASES, forward=0.2 - drop / 3, backward=0.4 - drop * 2 / 3)] * 4)
    return (*b, *a)


@pytest.mark.parametrize("drop,word,where", [
    (0.10, "realised", "inside"),  # ratio 0.83: ±15% would say "partly"; the interval holds it
    (0.16, "realised", "inside"),  # the interval's high end, inclusive
    (0.20, "exceeded", "above"),
    (0.05, "partly", "below"),
    (0.01, "not realised", "below"),
    (-0.03, "worse", "below")])
def test_achieved_against_the_promised_interval(drop, word, where):
    c = compare(*timed_pair(drop))
    o = c.outcomes[0]
    assert o.achieved_s == pytest.approx(drop) and o.judged_by == "interval"
    assert (o.promised_low_s, o.promised_high_s, o.interval_level, o.rounds) == (0.08, 0.16, 0.923, 16)
    assert o.verdict == word
    line = outcome_line(o)
    assert f", {where} the promised 80.0–160 ms (92%, 16 rounds)" in line
    assert "achieved = drop of forward + backward" in line


def test_a_narrow_interval_is_stricter_than_the_tolerance():
    """Achieved 130 ms against a promised 115–125 ms: ±15% of 120 ms would call it realised; the
    interval says exceeded."""
    ev = dict(TIMED, saving_low_s=0.115, saving_high_s=0.125)
    o = compare(*timed_pair(0.13, ev)).outcomes[0]
    assert o.ratio == pytest.approx(0.13 / 0.12) and verdict(0.12, o.ratio, o.achieved_s) == "realised"
    assert o.verdict == "exceeded" and "above the promised 115–125 ms" in outcome_line(o)


def test_a_finding_without_an_interval_keeps_the_tolerance_and_says_so():
    o = compare(*timed_pair(0.10, evidence={})).outcomes[0]
    assert o.judged_by == "tolerance" and o.promised_low_s is None and o.interval_level is None
    assert o.verdict == "partly"  # 0.83 of the prediction: outside ±15%
    assert "no interval: judged on ±15% of the prediction" in outcome_line(o)
    o = compare(*timed_pair(0.11, evidence={})).outcomes[0]
    assert o.verdict == "realised"  # 0.92


def test_a_saving_within_noise_is_listed_with_its_interval():
    """A timing whose interval held no change claimed no saving: no verdict, its interval said."""
    ev = dict(TIMED, saving_low_s=-0.02, saving_high_s=0.05, within_noise=True)
    b = hand([BASE_PHASES] * 4, findings=[finding("precision-slow", None, kind="info", evidence=ev)])
    c = compare(*b, *hand([BASE_PHASES] * 4))
    o = c.outcomes[0]
    assert o.verdict == "no prediction" and o.judged_by is None and o.within_noise is True
    assert compare_view(c).unpredicted == ("BEFORE's findings without a predicted saving: precision-slow "
                                           "(gone; within noise when timed: -20.0 ms to 50.0 ms)")


def test_json_keeps_the_old_keys_and_adds_the_interval():
    d = compare(*timed_pair(0.10)).to_dict()
    f = d["findings"][0]
    old = {"id", "title", "kind", "predicted_s", "achieved_s", "ratio", "measured_from", "phases",
           "other_phases_change_s", "verdict", "in_after", "after_saving_s", "overlaps"}
    assert old <= set(f) and f["verdict"] == "realised"
    assert (f["judged_by"], f["promised_low_s"], f["promised_high_s"]) == ("interval", 0.08, 0.16)
    sc = d["step_change"]
    assert sc["statistic"] == "hodges-lehmann/mann-whitney" and sc["n_before"] == sc["n_after"] == 4
    assert sc["estimate"] == pytest.approx(0.9) and sc["estimate_pct"] == pytest.approx(-10.0)
    assert sc["enough"] is True and sc["within_noise"] is False
    json.dumps(d)


# -- the step change's interval ------------------------------------------------------------------

def _brute_counts(m, n):
    counts = Counter(sum(p - i for i, p in enumerate(pos)) for pos in itertools.combinations(range(m + n), m))
    return [counts[u] for u in range(m * n + 1)]


@pytest.mark.parametrize("m,n", [(1, 1), (1, 4), (2, 3), (3, 3), (4, 4), (3, 6), (5, 5), (7, 4)])
def test_mann_whitney_null_matches_enumeration(m, n):
    assert list(mann_whitney_counts(m, n)) == _brute_counts(m, n)
    assert mann_whitney_counts(m, n).sum() == comb(m + n, m)


def test_critical_ranks():
    # the published two-sided 10% critical U (k - 1): 27 for 10 and 10 steps, 138 for 20 and 20
    assert critical_u(10, 10, 0.90)[0] == 28 and critical_u(20, 20, 0.90)[0] == 139
    assert critical_u(3, 3, 0.90) == (1, pytest.approx(0.90))  # the fewest steps that reach 90%
    k, coverage = critical_u(2, 3, 0.90)
    assert k == 0 and coverage == pytest.approx(0.8)  # too few: the full range, 80%
    assert step_change([1.0, 1.1], [1.0, 1.2, 1.1]).enough is False


def test_interval_covers_an_injected_shift_and_holds_no_change_for_noise():
    before = noise(24)
    slower = step_change(before, [x * 1.10 for x in noise(24, 100)])
    assert slower.low < 1.10 < slower.high and slower.low > 1.0 and not slower.within_noise
    assert slower.level == pytest.approx(0.9028, abs=1e-4)
    same = step_change(before, noise(24, 100))
    assert same.low < 1.0 < same.high and same.within_noise


def test_coverage_at_the_level():
    """Over 400 simulated pairs of runs (lognormal steps, 15% slower), the 90% interval covers
    the true ratio at least at its level, minus three Monte-Carlo standard errors."""
    rng = np.random.default_rng(7)
    hits = 0
    for _ in range(400):
        b, a = np.exp(rng.normal(0, 0.1, 12)), 1.15 * np.exp(rng.normal(0, 0.1, 10))
        sc = step_change(list(b), list(a))
        hits += sc.low <= 1.15 <= sc.high
    assert hits / 400 >= sc.level - 3 * np.sqrt(0.1 * 0.9 / 400)


def test_per_token_interval_and_irregular_steps():
    """Per token, the ratio is the step ratio × BEFORE's tokens per AFTER's; an irregular step is
    left out as it is from the typical step."""
    b = hand(scaled_steps([1.0] * 4 + [3.0]))
    a = hand(scaled_steps([1.5] * 4), tokens=8192)
    c = compare(*b, *a)
    assert c.basis == "token" and c.step_change.n_before == 4
    assert c.step_change.low == c.step_change.high == pytest.approx(0.75)


def test_the_spread_note_only_without_an_interval():
    """The runs' spread judged the noise before the interval; it still does when too few steps."""
    few = compare(*hand(scaled_steps([0.9, 1.1])), *hand(scaled_steps([0.92, 1.12])))
    assert not few.step_change.enough and any("within run-to-run noise" in n for n in few.notes)
    assert compare_view(few).step_change == "change interval: 2 and 2 steps are too few for a 90% interval"


# -- the gate ------------------------------------------------------------------------------------

def _files(tmp_path, before_mults, after_mults):
    paths = []
    for name, mults in (("before.json", before_mults), ("after.json", after_mults)):
        prof, analysis = hand(scaled_steps(mults))
        save(prof, tmp_path / name, analysis.to_dict())
        paths.append(str(tmp_path / name))
    return paths


def test_gate_passes_on_noise_and_fails_on_a_real_slowdown(tmp_path):
    # noise: the same ±20% steps, AFTER's mean 3.5% slower by the draw; the bare gate flaps
    noisy = _files(tmp_path, noise(24, 0, 0.2), [x * 1.03 for x in noise(24, 100, 0.2)])
    bare = runner.invoke(app, ["compare", *noisy, "--fail-if-slower", "1"])
    assert bare.exit_code == 1, bare.output
    sig = runner.invoke(app, ["compare", *noisy, "--fail-if-slower", "1", "--significant", "--json"])
    assert sig.exit_code == 0 and sig.stderr == "", sig.output
    g = json.loads(sig.stdout)["gate"]
    assert g["failed"] is False and g["significant"] is True and g["judged_by"] == "interval"
    assert g["slower_low_pct"] < 1 < g["slower_high_pct"] and g["slower_pct"] > 1
    # a real 30% slowdown: the whole interval is above 5%
    slow = _files(tmp_path, noise(24, 0, 0.05), [x * 1.3 for x in noise(24, 100, 0.05)])
    res = runner.invoke(app, ["compare", *slow, "--fail-if-slower", "5", "--significant"])
    assert res.exit_code == 1, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "slower per step" in err and "interval +28" in err
    assert "is all above 5%; --fail-if-slower 5 --significant" in err
    # ... but not above 35%
    assert runner.invoke(app, ["compare", *slow, "--fail-if-slower", "35", "--significant"]).exit_code == 0
    view = runner.invoke(app, ["compare", *slow], env={"COLUMNS": "200"})
    assert "change interval: +28.2% to +32.4% per step (90%, Mann–Whitney, 24 and 24 steps): slower beyond" \
        in view.stdout


def test_gate_with_too_few_steps_falls_back_to_the_typical_step(tmp_path):
    few = _files(tmp_path, [1.0, 1.0], [1.2, 1.2])
    res = runner.invoke(app, ["compare", *few, "--fail-if-slower", "5", "--significant", "--json"])
    assert res.exit_code == 1, res.output
    assert json.loads(res.stdout)["gate"]["judged_by"] == "typical step (too few steps for an interval)"
    assert "too few steps for an interval, judged on the typical step" in res.stderr


def test_significant_without_a_threshold_is_bad_input(tmp_path):
    files = _files(tmp_path, [1.0] * 3, [1.0] * 3)
    res = runner.invoke(app, ["compare", *files, "--significant"])
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "--significant needs --fail-if-slower" in err
    assert "Traceback" not in res.output
