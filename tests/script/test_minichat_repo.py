"""A current small-LLM pretraining repository, as its README runs it (tests/fixtures/minichat_repo:
nanochat's shape): `python -m scripts.base_train` from the repository's root, the model always
torch.compile'd, a torch.optim.Optimizer subclass whose updates are compiled functions, a generator
that reads text shards and tokenizes them in the training process advanced with `next(train_loader)`
after each backward, argparse flags (`--device-batch-size`, `--total-batch-size`: accumulation
follows from them), the precision from an environment variable, nanochat's step lines.

One run of it (module scope, ~10 s: aot_eager keeps dynamo's guards and AOT graphs without
inductor's C++ build) answers:
- the data phase is the generator's `next()`, within 3 points of the share the script itself timed
  around that call in the same steps (truth written by the fixture, MINICHAT_TRUTH);
- gpuprof causes no recompilation (no hook on the compiled model: its only recompiles are the
  optimizer's own, one per parameter shape), and a compiled optimizer step is not an evaluation;
- the script's own step lines are read (nanochat format) and the report names the recompiles;
- the knobs: the micro-batch is `--device-batch-size`, the accumulation follows `--total-batch-size`.
"""

import io
import json
import os
import sys
from pathlib import Path

import pytest
from rich.console import Console

from gpuprof.analysis.pipeline import analyze
from gpuprof.analysis.script_knobs import find_knobs, worded
from gpuprof.analysis.findings import Finding
from gpuprof.render.terminal import render_diagnosis
from gpuprof import session
from gpuprof.session import Measure

REPO = Path(__file__).resolve().parent.parent / "fixtures" / "minichat_repo"
ARGS = ["--depth=2", "--max-seq-len=64", "--device-batch-size=4", "--total-batch-size=1024",
        "--num-iterations=40", "--compile-backend=aot_eager"]


@pytest.fixture(scope="module")
def minichat(tmp_path_factory):
    base = tmp_path_factory.mktemp("minichat")
    env = {"MINICHAT_BASE_DIR": str(base), "MINICHAT_COMPILE_BACKEND": "aot_eager",
           "MINICHAT_LOADER_DELAY_MS": "6", "MINICHAT_TRUTH": str(base / "truth.json")}
    saved_env, saved_cwd = {k: os.environ.get(k) for k in env}, os.getcwd()
    os.environ.update(env)
    os.chdir(REPO)
    try:
        sys.path.insert(0, str(REPO))
        try:
            from minichat.dataset import write_shards

            write_shards(3, 400)
        finally:
            sys.path.remove(str(REPO))
            for name in [m for m in sys.modules if m == "minichat" or m.startswith("minichat.")]:
                del sys.modules[name]  # the run imports the package itself, as python -m would
        out = io.StringIO()
        # diagnose's instruments (dynamo's records among them), nothing after the run
        run = session.run_script("scripts.base_train", ARGS, Measure(steps=6, warmup=2, post_budget=0.0),
                                 stdout=out, module=True)
    finally:
        os.chdir(saved_cwd)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    truth = json.loads((base / "truth.json").read_text())
    return run, out.getvalue(), truth


def test_the_run_profiles_its_steps_as_python_m_runs_it(minichat):
    run, out, _ = minichat
    p = run.profile
    assert run.ended == "stopped" and len(p.steps) == 6 and len(p.warmup_steps) == 2
    assert p.run["command"][:2] == ["-m", "scripts.base_train"]
    assert p.run["script_file"].endswith(os.path.join("scripts", "base_train.py"))
    assert all(s.micro_steps == 4 for s in p.steps)  # 1024 tokens / (4 x 64)
    assert (p.config["batch_size"], p.config["block_size"]) == (4, 64)


def test_the_data_phase_is_the_generators_next_within_3_points_of_the_scripts_own_timing(minichat):
    run, _, truth = minichat
    p = run.profile
    att = p.measurements["script"]["data_attribution"]
    (label,) = att["discovered"]["timed"]
    assert label.startswith("next(train_loader): tokenizing_data_loader_with_state_bos_bestfit (dataloader.py:")
    assert att["discovered"]["call_site"].startswith("base_train.py:")
    # The names gpuprof used to wrap: the validation loader's factory, a text-generation helper.
    assert not any("build_val_loader" in w or "generate_batch" in w for w in att["wrapped"])
    # The same steps timed by the script itself: gpuprof's step k ends at iteration k's optimizer step
    # and holds its four next() calls; the last one was stopped there, before the script wrote it.
    by_step = {t["step"]: t for t in truth}
    steps = [s for s in p.steps if s.index in by_step]
    assert len(steps) == len(p.steps) - 1
    true_share = sum(by_step[s.index]["loader"] for s in steps) / sum(by_step[s.index]["dt"] for s in steps)
    ours = sum(s.phases.get("data", 0.0) for s in steps) / sum(s.wall_s for s in steps)
    assert true_share > 0.05  # the injected wait makes data a real share of the step
    assert abs(ours - true_share) <= 0.03, (ours, true_share)


def test_gpuprof_causes_no_recompile_and_a_compiled_optimizer_step_is_no_evaluation(minichat):
    run, _, _ = minichat
    p = run.profile
    dyn = p.measurements["dynamo"]
    assert dyn["compiled"] is True and p.config["compile"] is True
    # Every recompilation is the user's own: the optimizer's update compiled once per parameter
    # shape (the matrices' and the norms' ...); none of the model, none on a hook guard.
    assert {r["function"] for r in dyn["recompiles"]} <= {"muon_step_fused", "adamw_step_fused"}
    assert not any("hooks" in (r.get("reason") or "") for r in dyn["recompiles"])
    counts = p.measurements["script"]["hooks"]["counts"]
    assert counts["eval_forward"] == 0 and counts["forward_in_backward"] == 0
    assert sum(s.phases.get("eval", 0.0) for s in p.steps) == 0.0
    assert p.measurements["script"]["steps"]["marker"] == "MuonAdamW.step()"


def test_the_scripts_own_log_is_read_and_the_report_names_the_recompiles(minichat):
    run, out, _ = minichat
    p = run.profile
    rep = p.measurements["script"]["reported"]
    assert rep["format"] == "nanochat" and rep["lines"] >= 6 and 0.7 < rep["ratio"] < 1.4
    assert rep["mfu_pct_median"] is None and "no MFU claim" in rep["mfu_note"]  # it printed 0.00 on a CPU
    analysis = analyze(p)
    warm = analysis.finding("recompile-warmup")
    assert warm is not None and "muon_step_fused at optim.py:" in warm.because
    buf = io.StringIO()
    render_diagnosis(p, analysis, Console(file=buf, width=200), details=True)
    text = buf.getvalue()
    assert "torch.compile recompiled" in text and "nanochat format" in text and "leave the device" not in text
    first = io.StringIO()  # the first screen says more is there
    render_diagnosis(p, analysis, Console(file=first, width=200))
    assert "more with --details" in first.getvalue()


def test_the_micro_batch_and_accumulation_are_the_scripts_own_flags(minichat):
    run, _, _ = minichat
    cfg = run.profile.config
    inputs = {o["dest"]: o for o in cfg["script_inputs"]["argparse"]}
    assert inputs["device_batch_size"]["value"] == 4 and inputs["device_batch_size"]["given"] is True
    assert "MINICHAT_DTYPE" in cfg["script_inputs"]["env"]
    knobs = find_knobs(cfg)
    assert knobs.get("batch_size").name == "--device-batch-size" and knobs.total.name == "--total-batch-size"
    fix = Finding(id="micro-batch-too-small", title="t", fix="batch_size=16, gradient_accumulation_steps=1",
                  config_overrides={"batch_size": 16, "gradient_accumulation_steps": 1})
    assert worded(fix, cfg).fix == ("--device-batch-size=16; gradient accumulation follows from "
                                    "--total-batch-size=1024 (tokens per step): 4 -> 1 micro-step")
