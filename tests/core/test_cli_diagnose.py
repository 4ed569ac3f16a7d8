"""CLI: diagnose on the built-in loop, --out/--json, analyze round trip, bad input -> exit 2."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from gpuprof.cli import app

runner = CliRunner()
FAST = ["--n-layer", "1", "--n-embd", "64", "--n-head", "2", "--batch-size", "2", "--block-size", "32",
        "--grad-accum", "2", "--steps", "3", "--warmup", "1", "--device", "cpu", "--no-samplers"]


def test_diagnose_json_and_analyze_round_trip(tmp_path):
    out = tmp_path / "run.gpuprof.json"
    res = runner.invoke(app, ["diagnose", *FAST, "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    saved = json.loads(out.read_text())
    assert printed == saved
    assert saved["schema_version"] == 1 and saved["tool"]["name"] == "gpuprof"
    s = saved["summary"]
    assert s["step_s"] > 0 and s["tokens_per_s"] == pytest.approx(2 * 32 * 2 / s["step_s"])
    for name in ("data", "h2d", "forward", "backward", "optimizer", "other"):
        assert 0 <= s["phases"][name]["share"] <= 1 and "seconds" in s["phases"][name]
    assert saved["findings"] and {"id", "title", "saving_s", "saving_share"} <= set(saved["findings"][0])

    again = runner.invoke(app, ["analyze", str(out), "--json"])
    assert again.exit_code == 0, again.output
    re_read = json.loads(again.stdout)
    assert re_read["summary"]["step_s"] == s["step_s"]
    assert re_read["steps"] == saved["steps"]

    report = runner.invoke(app, ["analyze", str(out)])
    assert report.exit_code == 0
    assert "Where a step's time goes" in report.stdout and "tokens/s" in report.stdout


def test_diagnose_report(tmp_path):
    res = runner.invoke(app, ["diagnose", *FAST])
    assert res.exit_code == 0, res.output
    assert "forward" in res.stdout and "Findings" in res.stdout


def _one_line_error(res, text):
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and text in err, err


def test_missing_data_file(tmp_path):
    _one_line_error(runner.invoke(app, ["diagnose", *FAST, "--data", str(tmp_path / "nope.bin")]), "does not exist")


def test_data_file_too_short(tmp_path):
    path = tmp_path / "short.bin"
    np.arange(8, dtype=np.uint16).tofile(path)
    _one_line_error(runner.invoke(app, ["diagnose", *FAST, "--data", str(path)]), "needs at least 33")


@pytest.mark.parametrize(
    "args, text",
    [
        (["--dtype", "fp12"], "unknown dtype"),
        (["--model", "gpt5"], "unknown model preset"),
        (["--steps", "0"], "--steps must be positive"),
        (["--steps", "-3"], "--steps must be positive"),
        (["--grad-accum", "0"], "--grad-accum must be positive"),
    ],
)
def test_bad_options(args, text):
    _one_line_error(runner.invoke(app, ["diagnose", *FAST, *args]), text)


@pytest.mark.parametrize(
    "content, text",
    [("{oops", "not valid JSON"), ('{"a": 1}', "not a gpuprof profile"),
     ('{"schema_version": 7, "tool": {"name": "gpuprof"}}', "newer")],
)
def test_analyze_bad_files(tmp_path, content, text):
    path = tmp_path / "p.json"
    path.write_text(content)
    _one_line_error(runner.invoke(app, ["analyze", str(path)]), text)


def test_write_refuses_an_existing_file_before_running(tmp_path):
    target = tmp_path / "corrected.py"
    target.write_text("batch_size = 12\n")
    res = runner.invoke(app, ["diagnose", *FAST, "--write", str(target)])
    _one_line_error(res, "already exists")
    assert target.read_text() == "batch_size = 12\n"


def test_bad_disk_report_fails_before_running(tmp_path):
    bad = tmp_path / "disk.json"
    bad.write_text('{"hello": 1}')
    _one_line_error(runner.invoke(app, ["diagnose", *FAST, "--disk-report", str(bad)]), "not a bench-disk JSON result")
