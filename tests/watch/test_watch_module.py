"""`gpuprof watch -m MODULE ARGS`: a repo's script (tests/module_repo.py) watched to its end as
`python -m` runs it; gpuprof's options after it refused as diagnose refuses them."""

import json

import pytest
from typer.testing import CliRunner

from gpuprof.cli import app
from gpuprof.watch.events import read_events

from module_repo import forget_modules, make_repo

runner = CliRunner()
FAST = ["--no-samplers", "--post-budget", "0"]


@pytest.fixture
def repo(tmp_path, monkeypatch):
    forget_modules()
    root = make_repo(tmp_path / "repo")
    monkeypatch.chdir(root)
    yield root
    forget_modules()


def test_watch_runs_a_module_to_its_end(repo, tmp_path):
    events, out = tmp_path / "ev.jsonl", tmp_path / "run.json"
    res = runner.invoke(app, ["watch", "--every", "4steps", "--warmup", "1", "--events", str(events), "--out", str(out),
                              *FAST, "-m", "scripts.train", "--num-iterations", "14", "--device-batch-size", "4"])
    assert res.exit_code == 0, res.output
    assert "gpuprof: watching -m scripts.train until it finishes" in res.stderr
    assert "step 13: loss" in res.stdout  # run to its end, not stopped
    header, *rest = read_events(events)
    assert header["command"] == ["-m", "scripts.train", "--num-iterations", "14", "--device-batch-size", "4"]
    assert any(e["kind"] == "window" for e in rest)
    prof = json.loads(out.read_text())
    assert prof["run"]["command"] == header["command"]
    assert len(prof["warmup_steps"]) + len(prof["steps"]) == 14
    entry = next(e for e in prof["run"]["config"]["script_inputs"]["argparse"] if e["dest"] == "num_iterations")
    assert entry["value"] == 14 and entry["given"] is True


def test_a_watch_option_after_the_module_is_refused(repo):
    res = runner.invoke(app, ["watch", *FAST, "-m", "scripts.train", "--every", "4steps"])
    assert res.exit_code == 2, res.output
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("gpuprof: error:")]
    assert line == ["gpuprof: error: --every after the script is gpuprof's option, and the script has no --every "
                    "(its argparse would refuse it as unrecognized): put gpuprof's options before the script: "
                    "gpuprof watch --every 4steps -m scripts.train ..."]
    assert "step 0:" not in res.output
