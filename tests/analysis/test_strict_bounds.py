"""The suite's own strictness (tests/strict_bounds.py): a test that makes an analysis or a
measured profile with an impossible figure fails, whether the analysis comes from `analyze`, from
a saved file or from a module-scoped fixture, and when the profile is never analysed; a test
marked `adversarial` does not. Run in a child pytest, so that the failures it proves are not this
suite's."""

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

CHILD = '''
import pytest
from gpuprof.analysis.pipeline import Analysis, analyze
from gpuprof.profile import Profile, StepRecord


def profile(host=None):
    return Profile(run={"mode": "builtin", "config": {"device": "cpu"}},
                   steps=[StepRecord(i, 1.0, {"forward": 1.0}, tokens=64, micro_steps=1) for i in range(3)],
                   environment={"device": "cpu"}, measurements={"host": host} if host else {})


def cpu_above_the_cores():  # a producer's impossible measured figure: 741% on 2 cores
    return profile({"cpu_count": 2, "summary": {"proc_cpu_pct": {"max": 741.0}}})


@pytest.fixture(scope="module")
def analysed_once():
    return analyze(cpu_above_the_cores())


def test_analyze_of_an_impossible_profile():
    analyze(cpu_above_the_cores())


def test_a_saved_saving_above_the_step():
    Analysis.from_dict({"findings": [{"id": "x", "title": "x", "saving_s": 5.0, "saving_share": 5.0,
                                      "evidence": {}}]}, profile())


def test_a_module_fixture(analysed_once):
    pass


def test_a_profile_never_analysed():
    assert cpu_above_the_cores().steps


def test_a_possible_analysis():
    assert analyze(profile()).findings is not None


@pytest.mark.adversarial
def test_adversarial_on_purpose():
    analyze(cpu_above_the_cores())
'''


def test_a_test_making_an_impossible_analysis_fails(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_child.py").write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "strict_bounds",
                          "-c", str(tmp_path / "pytest.ini"), str(tmp_path / "test_child.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300).stdout
    lines = out.splitlines()

    def outcome(name):
        return {ln.split()[0] for ln in lines if f"::{name}" in ln and ln.split()[0] in ("PASSED", "ERROR", "FAILED")}

    for name in ("test_analyze_of_an_impossible_profile", "test_a_saved_saving_above_the_step", "test_a_module_fixture",
                 "test_a_profile_never_analysed"):
        assert outcome(name) == {"PASSED", "ERROR"}, out  # the test body passes; its teardown fails it
    assert outcome("test_a_possible_analysis") == {"PASSED"}, out
    assert outcome("test_adversarial_on_purpose") == {"PASSED"}, out
    assert "proc_cpu_pct.max = 741% is above 200%" in out and "finding x: saving 5 s is outside" in out, out
