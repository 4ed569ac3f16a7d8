"""Trainer scripts under `gpuprof diagnose`: HF `Trainer` (tests/fixtures/hf_trainer_train.py) and
PyTorch Lightning (tests/fixtures/lightning_train.py), tiny models built in the script, no
downloads. Steps and micro-steps (= gradient accumulation), non-zero compute phases, an injected
__getitem__ delay recovered as the data share, a header without "None", no traceback.

And the script's stdout/stderr wrapper (_Tee) after the run: trainers leave objects holding it
(tqdm bars close from their finalizer at interpreter shutdown, when gpuprof's module globals are
already None), so once detached it must pass writes through without its callback.

transformers/accelerate and lightning are the `trainers` test extra (.ci/run installs it); without
them those tests skip.
"""

import gc
import io
import json
import os
import re
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuprof.cli import app
from gpuprof.runners import script as script_module
from gpuprof.runners.script import _Tee, run_script

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
HF = str(FIXTURES / "hf_trainer_train.py")
LIGHTNING = str(FIXTURES / "lightning_train.py")
REPO = Path(__file__).resolve().parent.parent.parent
ACCUM, BATCH, BLOCK = 2, 4, 32  # the fixtures' defaults
WARMUP, STEPS = 1, 5
DELAY = 0.01  # seconds slept in each __getitem__: BATCH x ACCUM = 8 items, ~80 ms of a ~120 ms step

runner = CliRunner()


def _need(*modules):
    for name in modules:
        pytest.importorskip(name, reason=f"{name} is not installed (pip install -e '.[trainers]')")


def _diagnose(script, *script_args, out):
    """`gpuprof diagnose` through the CLI: (result, the saved profile)."""
    res = runner.invoke(app, ["diagnose", "--warmup", str(WARMUP), "--steps", str(STEPS), "--no-samplers",
                              "--details", "--out", str(out), script, *script_args, f"--item-delay={DELAY}"])
    assert res.exit_code == 0, (res.output, res.stderr)
    return res, json.loads(out.read_text())


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    _need("transformers", "accelerate")
    tmp = tmp_path_factory.mktemp("hf")
    return _diagnose(HF, str(tmp / "trainer_out"), out=tmp / "hf.gpuprof.json")


@pytest.fixture(scope="module")
def lightning(tmp_path_factory):
    _need("lightning")
    tmp = tmp_path_factory.mktemp("lightning")
    return _diagnose(LIGHTNING, out=tmp / "lightning.gpuprof.json")


@pytest.fixture(params=["hf", "lightning"])
def trainer_run(request):
    return request.getfixturevalue(request.param)


def test_optimizer_steps_and_micro_steps_are_detected(trainer_run):
    _, p = trainer_run
    # stopped after its steps, or (its max_steps reached during the experiment steps that follow
    # them, measure/experiments.py) finished
    assert p["run"]["ended"] in ("stopped", "finished") and p["run"]["partial"] is False
    assert p["run"]["ended"] == "stopped" or p["measurements"]["experiments"]["steps"]
    assert len(p["warmup_steps"]) == WARMUP and len(p["steps"]) == STEPS
    assert [s["micro_steps"] for s in p["steps"]] == [ACCUM] * STEPS
    assert all(s["extra"]["forwards"] == ACCUM and s["extra"]["backwards"] == ACCUM for s in p["steps"])
    assert all(s["tokens"] == BATCH * BLOCK * ACCUM for s in p["steps"])
    assert p["analysis"]["steps"]["micro_steps"] == ACCUM
    cfg = p["run"]["config"]
    assert (cfg["batch_size"], cfg["block_size"], cfg["grad_accum"]) == (BATCH, BLOCK, ACCUM)
    assert p["measurements"]["script"]["hooks"]["counts"]["optimizer_step"] == WARMUP + STEPS


def test_forward_backward_and_optimizer_are_measured_in_every_step(trainer_run):
    _, p = trainer_run
    for s in p["steps"]:
        assert all(s["phases"].get(ph, 0) > 0 for ph in ("forward", "backward", "optimizer")), s["phases"]


def test_injected_getitem_delay_is_recovered_as_the_data_share(trainer_run):
    res, p = trainer_run
    # Truth: the time the fixture actually slept in __getitem__ during step K (its callback prints
    # it after optimizer step K; the last step is stopped before its line) / the steps' wall time.
    # A 10 ms sleep often takes 11-12 ms on a loaded machine: that is data time too, and in the truth.
    slept = {int(m.group(1)): float(m.group(2)) / 1e3
             for m in re.finditer(r"fixture: step (\d+) slept ([0-9.]+) ms", res.stdout)}
    steps = [s for s in p["steps"] if s["index"] in slept]
    # (with experiment steps after the measured ones, measure/experiments.py, the last one's line comes too)
    assert len(steps) >= STEPS - 1 and all(slept[s["index"]] >= BATCH * ACCUM * DELAY for s in steps)
    wall = sum(s["wall_s"] for s in steps)
    truth = sum(slept[s["index"]] for s in steps) / wall
    measured = sum(s["phases"]["data"] for s in steps) / wall
    # The rest of data time (collate, the loaders' own work, not in the truth) measured 2-3 ms a step
    # here: ~+0.02 on the share.
    assert abs(measured - truth) <= 0.05, (measured, truth)
    assert abs(p["analysis"]["steps"]["phases"]["data"]["share"] - truth) <= 0.10
    assert any(w.startswith("RandomTokens.__getitem__ (")
               for w in p["measurements"]["script"]["data_attribution"]["wrapped"])


def test_report_header_has_no_none_and_nothing_prints_a_traceback(trainer_run):
    res, _ = trainer_run
    report = res.stdout[res.stdout.index("gpuprof diagnosis"):]
    header = report[:report.index("╰")]
    assert "model " in header and "step " in header
    assert "None" not in header, header
    for stream in (res.stdout, res.stderr):
        assert "Traceback" not in stream and "Exception ignored" not in stream


def _words(report: str) -> str:
    """The report's text without the panel's borders and line wraps (the terminal is 80 wide)."""
    return " ".join(report.replace("│", " ").split())


def test_hf_header_reads_the_gpt2_config(hf):
    res, p = hf
    # block_size is the run's sequence length (the inputs), not GPT2Config.n_positions (64).
    assert p["run"]["config"]["model_dims"] == {"n_layer": 2, "n_head": 2, "n_embd": 64, "vocab_size": 256,
                                               "block_size": BLOCK}
    assert "n_layer=2 n_head=2 n_embd=64 vocab_size=256" in _words(res.stdout)


def test_lightning_dims_it_cannot_read_say_not_measured(lightning):
    # training_step calls self(x): the outermost module is the LightningModule, which has no
    # `config`; only the vocabulary is readable (the wte embedding).
    res, p = lightning
    assert p["run"]["config"]["model_dims"]["vocab_size"] == 256
    assert "n_layer=not measured" in _words(res.stdout) and "vocab_size=256" in res.stdout


def test_hf_trainer_under_the_cli_process_ends_without_a_traceback(tmp_path):
    """The real interpreter shutdown: Trainer's tqdm bar outlives the run and closes (writes to
    the stream it was created with, our _Tee) from its finalizer; nothing may print a traceback."""
    _need("transformers", "accelerate")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    # --post-budget 0: the post-run parts on the Trainer's model run in the `hf` fixture above;
    # here only the interpreter's end matters (they spent ~8 s of this test)
    proc = subprocess.run([sys.executable, "-m", "gpuprof", "diagnose", "--warmup", "1", "--steps", "2",
                           "--no-samplers", "--post-budget", "0", HF, str(tmp_path / "trainer_out")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gpuprof diagnosis" in proc.stdout
    tail = proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, tail
    assert "TypeError" not in tail, tail


# -- the wrapper after the run ---------------------------------------------------------------------

def test_detached_tee_passes_writes_through_without_its_callback():
    target, lines = io.StringIO(), []
    tee = _Tee(target, lines.append)
    assert tee.write("a\rb\nc") == 5
    assert lines == ["a", "b"]
    tee.detach()
    assert lines == ["a", "b", "c"]  # the unterminated last line is handed over once
    assert tee.write("late\r\n") == 6 and tee.write("x") == 1
    assert lines == ["a", "b", "c"]  # no parsing after detach
    assert target.getvalue() == "a\rb\nclate\r\nx"
    tee.detach()  # idempotent
    assert tee.isatty() is False and tee.encoding == target.encoding  # still the real stream's


def test_streams_the_script_kept_work_after_gpuprof_module_globals_are_gone(tmp_path, monkeypatch, capsys):
    """A bar left open by the script closes after the run, as at interpreter shutdown (this
    module's globals None): its write passes through, and the wrappers hold nothing of the run."""
    pytest.importorskip("tqdm", reason="tqdm is not installed (pip install -e '.[trainers]')")
    script = tmp_path / "open_bar.py"
    script.write_text(
        "import sys\n"
        "import torch\n"
        "from tqdm import tqdm\n"
        "bar = tqdm(total=10, file=sys.stdout, ascii=True)  # left open, as a stopped Trainer's\n"
        "model = torch.nn.Linear(4, 4)\n"
        "sys.gpuprof_test_left.extend([bar, sys.stdout, sys.stderr, model])\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    model(torch.randn(2, 4)).sum().backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
        "    bar.update()\n")
    # Imported before the run: torch imports dynamo lazily (Optimizer.add_param_group), and dynamo
    # built during a run keys its rule map on gpuprof's torch.autograd.backward wrapper, which holds
    # the run; that is the hooks' matter, not the streams'.
    import torch._dynamo  # noqa: F401

    left = []
    monkeypatch.setattr(sys, "gpuprof_test_left", left, raising=False)
    buf = io.StringIO()
    run = run_script(str(script), [], steps=2, warmup=1, stdout=buf)
    assert run.ended == "stopped"
    bar, out, err, model = left
    assert isinstance(out, _Tee) and isinstance(err, _Tee)
    model_ref = weakref.ref(model)
    del left[:], model, run
    gc.collect()
    assert model_ref() is None  # the wrappers the bar keeps do not keep the run's script alive
    # Interpreter shutdown sets each module's globals to None before late finalizers run.
    for name in [n for n in vars(script_module) if not n.startswith("__")]:
        monkeypatch.setitem(vars(script_module), name, None)
    bar.close()  # what tqdm.__del__ does at shutdown
    print("late line", file=err)
    monkeypatch.undo()
    last = buf.getvalue().split("\r")[-1]
    # The bar's closing render (2 updates: the 3rd optimizer step stopped the script), passed through.
    assert "2/10" in last and last.endswith("\n")
    assert capsys.readouterr().err.endswith("late line\n")
