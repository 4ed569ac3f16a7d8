"""Training loops not shaped like nanoGPT, run unmodified (tests/fixtures/word_lm: pytorch/examples'
word_language_model, manual SGD by default): what a step is without an optimizer, a script that
shows no step, and gpuprof staying invisible to the script's own objects (tests/fixtures/
guest_checks_train.py: torch.save(model), pickle, deepcopy, state_dict, named_modules,
torch.compile in the middle of a measured run)."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from gpuprof.analysis.bounds import violations
from gpuprof.measure.hooks import NoStepLimits, StopScript, TrainingHooks
from gpuprof.measure.timer import PhaseTimer
from gpuprof.analysis.pipeline import analyze
from gpuprof.runners.script import run_script

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
WORD_LM = str(FIXTURES / "word_lm" / "main.py")
GUEST = str(FIXTURES / "guest_checks_train.py")
SMALL = ["--corpus", "40000", "--emsize", "32", "--nhid", "64", "--bptt", "16", "--log-interval", "5"]


def _run(tmp_path, *args, steps=3, warmup=1, stop=True, **kw):
    out = io.StringIO()
    run = run_script(WORD_LM, [*SMALL, "--save", str(tmp_path / "model.pt"), *args], steps=steps, warmup=warmup,
                     stop=stop, stdout=out, post_budget_s=0.0, **kw)
    return run, out.getvalue()


def _checked(profile):
    analysis = analyze(profile)
    assert violations(profile, analysis) == []
    return analysis


# -- what a step is -------------------------------------------------------------------------------

def test_manual_sgd_steps_end_at_model_zero_grad_and_the_script_is_stopped_after_them(tmp_path):
    run, out = _run(tmp_path)  # model.zero_grad(); forward; backward; clip; p.data.add_(p.grad, alpha=-lr)
    p = run.profile
    assert run.ended == "stopped"
    assert len(p.warmup_steps) == 1 and len(p.steps) == 3
    assert [s.micro_steps for s in p.steps] == [1, 1, 1]
    # Stopped after warmup + steps updates, counted in events: one backward per batch; batch 0's
    # zero_grad came before the first forward (not seen), batches 1-3's were counted, batch 4's
    # closed the 4th step and stopped the script. The log line of batch 5 never came.
    assert run.counts["backward"] == 4 and run.counts["module_zero_grad"] == 3
    assert "| epoch" not in out
    rule = p.measurements["script"]["steps"]
    assert (rule["rule"], rule["marker"]) == ("zero_grad", "TransformerModel.zero_grad()")
    assert all(s.tokens == 16 * 8 for s in p.steps)  # bptt × batch_size token ids into each forward
    # args.batch_size from the script's argparse Namespace; the (T, B) input then gives T
    assert (p.config["batch_size"], p.config["block_size"]) == (8, 16)
    assert p.config["source"]["batch_size"] == "script global `args`: `batch_size`"
    assert all(s.phases.get("optimizer", 0) > 0 for s in p.steps)  # clip_grad_norm_ and zero_grad
    _checked(p)


def test_an_optimizer_stepped_every_k_batches_makes_k_micro_steps(tmp_path):
    run, _ = _run(tmp_path, "--use-optimizer", "--accum", "3", steps=2)
    p = run.profile
    assert [s.micro_steps for s in p.steps] == [3, 3]
    rule = p.measurements["script"]["steps"]
    assert (rule["rule"], rule["marker"]) == ("optimizer", "SGD.step()")
    assert run.counts["optimizer_step"] == 3
    _checked(p)


def test_an_inference_loop_is_stopped_after_a_bounded_number_of_forwards(tmp_path):
    run, out = _run(tmp_path, "--no-backward")
    assert run.profile is None and run.ended == "stopped"
    assert run.no_step == "32 forwards with gradients enabled and no backward"
    # the model and its loss module are two outermost forwards per batch: 16 batches ran, of 281
    assert run.counts["forward"] == 32 and run.counts["backward"] == 0
    assert "|    10/" in out and "|    20/" not in out


def test_no_training_step_is_one_line_and_exit_2_through_the_cli(tmp_path, monkeypatch, capsys):
    # gpuprof's entry point in this process (as the run_script tests above run this script): the
    # script is stopped before any step, so nothing of it outlives the call
    import torch._logging._internal as tli

    from gpuprof.cli import main

    monkeypatch.chdir(tmp_path)
    artifacts = set(tli.log_state.artifact_names)
    with pytest.raises(SystemExit) as exc:
        main(["diagnose", "--no-samplers", "--steps", "2", "--warmup", "1", WORD_LM, *SMALL,
              "--save", str(tmp_path / "m.pt"), "--no-backward"])
    # with no complete step, the instruments still stop: dynamo's gives back the log state it changed
    assert set(tli.log_state.artifact_names) == artifacts
    _, stderr = capsys.readouterr()
    assert exc.value.code == 2, stderr
    errors = [x for x in stderr.splitlines() if x.startswith("gpuprof: error:")]
    assert len(errors) == 1 and "Traceback" not in stderr
    assert "no training step seen, so the script was stopped: 32 forwards with gradients enabled and no backward" \
        in errors[0] and "0 backward calls" in errors[0]


def test_without_an_optimizer_or_a_reset_each_loop_iteration_is_a_step(tmp_path):
    # p.grad = None by hand, no torch.optim anywhere: the forward after a backward opens the next
    # step. In a fresh process: the rule looks for optimizers alive in the process, and this
    # test process holds other tests' optimizers.
    out = tmp_path / "run.gpuprof.json"
    proc = subprocess.run([sys.executable, "-m", "gpuprof", "diagnose", "--no-samplers", "--post-budget", "0",
                           "--steps", "3", "--warmup", "1", "--details", "--out", str(out), WORD_LM, *SMALL,
                           "--save", str(tmp_path / "m.pt"), "--grad-reset", "by-hand"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr
    p = json.loads(out.read_text())
    assert p["measurements"]["script"]["steps"] == {
        "rule": "backward", "marker": "a forward after a backward (no optimizer in the script)", "optimizers_alive": 0}
    assert [s["micro_steps"] for s in p["steps"]] == [1, 1, 1]
    assert p["measurements"]["script"]["hooks"]["counts"]["backward"] == 4
    words = " ".join(proc.stdout.replace("│", " ").split())
    assert "steps one per loop iteration holding a backward: no torch.optim optimizer in the process" in words


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _hooks(limits, clock=None):
    model = nn.Linear(4, 4)
    hooks = TrainingHooks(lambda m, a, k: PhaseTimer(), stop_after=3, no_step_limits=limits,
                          clock=clock or FakeClock())
    return model, hooks


def test_a_no_grad_loop_is_stopped_after_its_bounded_forwards():
    model, hooks = _hooks(NoStepLimits(eval_forwards=10))
    hooks.install()
    try:
        with pytest.raises(StopScript), torch.no_grad():
            for _ in range(100):
                model(torch.zeros(2, 4))
    finally:
        hooks.remove()
    assert hooks.counts["eval_forward"] == 10 and hooks.no_step == "10 forwards under no_grad and no training forward"


def test_a_loop_that_never_ends_a_step_is_stopped_at_the_time_bound():
    # backward after backward, an optimizer alive (so it could be gradient accumulation), never
    # stepped: stopped once the injected clock passes the bound, counted in forwards, not waited.
    clock = FakeClock()
    model, hooks = _hooks(NoStepLimits(seconds=60.0), clock)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # alive, never stepped
    hooks.install()
    seen = 0
    try:
        with pytest.raises(StopScript):
            for _ in range(100):
                model(torch.zeros(2, 4)).sum().backward()
                seen += 1
                clock.t += 10.0
    finally:
        hooks.remove()
    assert seen == 6 and hooks.steps_done == 0 and opt is not None
    assert hooks.no_step == "60 s since the first forward without a complete step"


def test_a_bare_except_cannot_swallow_the_no_step_stop():
    model, hooks = _hooks(NoStepLimits(forwards=3))
    hooks.install()
    raised = 0
    try:
        for _ in range(5):
            try:
                model(torch.zeros(2, 4))
            except BaseException:  # noqa: B036 - what a careless script does
                raised += 1
    finally:
        hooks.remove()
    assert raised == 3  # the 3rd forward stopped it; each later forward raises again


# -- nothing gpuprof adds is visible to the script's objects --------------------------------------

LOAD_WITHOUT_GPUPROF = """
import importlib.abc, json, sys
class NoGpuprof(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "gpuprof" or name.startswith("gpuprof."):
            raise ImportError("gpuprof is not installed here")
sys.meta_path.insert(0, NoGpuprof())
sys.path.insert(0, sys.argv[1])
import torch, __main__
mod = __import__(sys.argv[2])
for name in ("LM", "Block"):
    if hasattr(mod, name):
        setattr(__main__, name, getattr(mod, name))
out = {}
for path in sys.argv[3:]:
    m = torch.load(path, weights_only=False)
    out[path] = [type(m).__name__, sum(len(x._forward_hooks) + len(x._forward_pre_hooks) for x in m.modules())]
print(json.dumps(out))
"""


def _load_elsewhere(folder, module, *paths):
    """torch.load each file in a Python where `import gpuprof` fails: [class name, hooks on it]."""
    proc = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_GPUPROF, str(folder), module, *map(str, paths)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_model_mid_run_pickles_copies_and_compiles_as_without_gpuprof(tmp_path):
    checks, saved = tmp_path / "checks.json", tmp_path / "model.pt"
    args = ["--checks", str(checks), "--save", str(saved), "--check-at", "3"]
    # the checks run in batch 3: after the warmup step, inside the measured steps, hooks installed
    run = run_script(GUEST, args, steps=4, warmup=1, stdout=io.StringIO(), post_budget_s=0.0)
    assert run.ended == "stopped" and len(run.profile.steps) == 4, run.error
    assert run.counts["forward"] >= 5  # the loop's 5 forwards were seen (and the checks' own)
    got = json.loads(checks.read_text())
    assert got == {"torch_save_bytes": got["torch_save_bytes"], "pickle_mentions_gpuprof": False,
                   "deepcopy_same_output": True, "deepcopy_hooks": 0, "hooks_on_model": 0,
                   "state_dict_keys_match": True, "named_modules_match": True, "instance_dict_keys_match": True,
                   "compiled_same_output": True}
    plain = tmp_path / "plain"
    plain.mkdir()
    proc = subprocess.run([sys.executable, GUEST, "--checks", str(plain / "c.json"), "--save", str(plain / "m.pt"),
                           "--check-at", "3", "--batches", "5"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((plain / "c.json").read_text())["torch_save_bytes"] == got["torch_save_bytes"]
    assert _load_elsewhere(FIXTURES, "guest_checks_train", saved) == {str(saved): ["LM", 0]}


def test_no_stop_script_saving_its_model_and_an_ema_copy_ends_with_its_own_exit_code(tmp_path):
    # word_language_model's end: torch.save(model, f) after the epoch, and an EMA kept with
    # copy.deepcopy(model); under --no-stop every hook is installed while it does so.
    run, out = _run(tmp_path, "--ema", "--epochs", "1", "--corpus", "8000", stop=False)
    assert run.ended == "finished", run.error
    assert "| End of training |" in out  # it loaded its own file back and evaluated it
    saved = tmp_path / "model.pt"
    loaded = _load_elsewhere(FIXTURES / "word_lm", "model", saved, f"{saved}.ema")
    assert loaded == {str(saved): ["TransformerModel", 0], f"{saved}.ema": ["TransformerModel", 0]}
    for path in (saved, Path(f"{saved}.ema")):
        assert b"gpuprof" not in path.read_bytes()
