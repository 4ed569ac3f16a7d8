"""`gpuprof compare`: the report, --json, the --fail-if-slower gate, each file's saved analysis (or one
made on load for a file saved without), bad input."""

import json

import pytest
from typer.testing import CliRunner

import gpuprof.cli.compare  # noqa: F401 - registers the verb on app
from compare_profiles import BASE_PHASES, finding, hand, hand_profile
from gpuprof.cli import app
from gpuprof.profile import save

runner = CliRunner()


def write(tmp_path, name, prof, analysis=None):
    """The profile saved with its analysis (as `diagnose --out` saves it), or without one."""
    path = tmp_path / name
    save(prof, path, None if analysis is None else analysis.to_dict())
    return str(path)


@pytest.fixture
def files(tmp_path, hand_pair):
    bp, ba, ap, aa = hand_pair
    slower = hand([dict(BASE_PHASES, forward=0.36)] * 3)  # 1.16 s vs BEFORE's 1.05 s typical step: 10.5% slower
    return {"before": write(tmp_path, "before.json", bp, ba), "after": write(tmp_path, "after.json", ap, aa),
            "slower": write(tmp_path, "slower.json", *slower)}


def test_report_and_exit_0(files):
    res = runner.invoke(app, ["compare", files["before"], files["after"]])
    assert res.exit_code == 0, res.output
    assert "data-loading-exposed" in res.stdout and "-300 ms (-28.6%)" in res.stdout
    assert res.stderr == ""


def test_json(files):
    res = runner.invoke(app, ["compare", files["before"], files["after"], "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["slower_pct"] == pytest.approx(-30 / 1.05) and "gate" not in d
    # the saved analyses are the ones compared: BEFORE's hand-made findings, exactly
    assert [f["id"] for f in d["findings"]] == ["data-loading-exposed", "micro-batch-too-small",
                                                "storage-too-slow", "dominant-phase"]
    assert [f["id"] for f in d["new_findings"]] == ["cpu-saturated"]


@pytest.mark.parametrize("limit,code", [("10", 1), ("11.5", 0), ("0", 1)])
def test_fail_if_slower(files, limit, code):
    res = runner.invoke(app, ["compare", files["before"], files["slower"], "--fail-if-slower", limit])
    assert res.exit_code == code, res.output
    if code:
        err = res.stderr.strip()
        assert len(err.splitlines()) == 1 and "10.5% slower per step" in err and f"--fail-if-slower {float(limit):g}" in err
    else:
        assert res.stderr == ""


def test_faster_passes_a_zero_gate_and_json_carries_it(files):
    res = runner.invoke(app, ["compare", files["before"], files["after"], "--fail-if-slower", "0", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["gate"] == {"fail_if_slower_pct": 0.0, "slower_pct": pytest.approx(-30 / 1.05),
                                              "basis": "step", "failed": False}


def test_gate_is_per_token_when_tokens_differ(tmp_path, files):
    """Twice the tokens in a 1.5 s step: 50% slower per step, 25% faster per token: the gate passes."""
    doubled = {k: v * 2 for k, v in BASE_PHASES.items()}
    big = write(tmp_path, "big.json", *hand([dict(doubled, data=0.10)] * 3, tokens=8192))
    res = runner.invoke(app, ["compare", files["before"], big, "--fail-if-slower", "5"])
    assert res.exit_code == 0, res.output
    assert "compared per token" in res.stdout
    back = runner.invoke(app, ["compare", big, files["before"], "--fail-if-slower", "5"])
    assert back.exit_code == 1 and "slower per token" in back.stderr


def test_profile_without_findings_is_analysed(tmp_path):
    """A profile saved without its analysis is analysed on load: BEFORE's data share (30%) is a finding."""
    raw = write(tmp_path, "raw.json", hand_profile([BASE_PHASES] * 3))
    fixed = write(tmp_path, "fixed.json", hand_profile([dict(BASE_PHASES, data=0.01)] * 3))
    res = runner.invoke(app, ["compare", raw, fixed, "--json"])
    assert res.exit_code == 0, res.output
    f = {x["id"]: x for x in json.loads(res.stdout)["findings"]}["data-loading-exposed"]
    assert f["predicted_s"] == pytest.approx(0.30) and f["achieved_s"] == pytest.approx(0.29)


def test_saved_analysis_is_used_unless_a_peak_is_given(tmp_path):
    """A file's saved analysis is what the run predicted: compare uses it as saved (a finding the
    rules would not make here is kept); --peak-tflops analyses both files again with that peak."""
    b = hand([BASE_PHASES] * 3, findings=[finding("storage-too-slow", 0.10, {})])
    saved = write(tmp_path, "saved.json", *b)
    fixed = write(tmp_path, "fixed.json", hand_profile([dict(BASE_PHASES, data=0.01)] * 3))
    res = runner.invoke(app, ["compare", saved, fixed, "--json"])
    assert res.exit_code == 0, res.output
    assert [x["id"] for x in json.loads(res.stdout)["findings"]] == ["storage-too-slow"]
    again = runner.invoke(app, ["compare", saved, fixed, "--json", "--peak-tflops", "10"])
    assert again.exit_code == 0, again.output
    ids = [x["id"] for x in json.loads(again.stdout)["findings"]]
    assert "data-loading-exposed" in ids and "storage-too-slow" not in ids


def _one_line_error(res, text):
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and text in err and "Traceback" not in res.output, err


def test_bad_input(tmp_path, files):
    _one_line_error(runner.invoke(app, ["compare", str(tmp_path / "nope.json"), files["after"]]), "no such file")
    (tmp_path / "x.json").write_text(json.dumps({"hello": 1}))
    _one_line_error(runner.invoke(app, ["compare", files["before"], str(tmp_path / "x.json")]), "not a gpuprof profile")
    (tmp_path / "bad.json").write_text("{not json")
    _one_line_error(runner.invoke(app, ["compare", str(tmp_path / "bad.json"), files["after"]]), "not valid JSON")
    _one_line_error(runner.invoke(app, ["compare", files["before"], files["after"], "--fail-if-slower", "-1"]),
                    "--fail-if-slower must be")
    _one_line_error(runner.invoke(app, ["compare", files["before"], files["after"], "--fail-if-slower", "nan"]),
                    "--fail-if-slower must be")
    empty = hand_profile([])
    _one_line_error(runner.invoke(app, ["compare", files["before"], write(tmp_path, "empty.json", empty)]),
                    "no measured step")
    _one_line_error(runner.invoke(app, ["compare", str(tmp_path), files["after"]]), "cannot read")
