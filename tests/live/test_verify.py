"""`diagnose --verify`: the top config fix applied and run again, predicted vs achieved printed."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpuprof.cli import app
from gpuprof.cli.verify import loop_config_with, script_args_with, top_config_fix
from gpuprof.errors import GpuprofError
from gpuprof.runners.builtin import LoopConfig


def test_top_config_fix_is_the_first_fix_with_overrides_and_a_saving():
    findings = [{"id": "a", "kind": "verdict", "config_overrides": {"x": 1}, "saving_s": 1.0},
                {"id": "b", "kind": "fix", "config_overrides": {}, "saving_s": 0.5},
                {"id": "c", "kind": "fix", "config_overrides": {"batch_size": 8}, "saving_s": 0.0},
                {"id": "d", "kind": "fix", "config_overrides": {"batch_size": 8}, "saving_s": 0.2}]
    assert top_config_fix(findings)["id"] == "d"
    assert top_config_fix(findings[:3]) is None


def test_overrides_map_onto_the_loop_and_the_script():
    cfg = loop_config_with(LoopConfig(batch_size=1, grad_accum=8),
                           {"batch_size": 8, "gradient_accumulation_steps": 1, "dtype": "bfloat16"})
    assert (cfg.batch_size, cfg.grad_accum, cfg.dtype) == (8, 1, "bf16")
    with pytest.raises(GpuprofError, match="no option for `warmup_iters`"):
        loop_config_with(LoopConfig(), {"warmup_iters": 3})
    args, used = script_args_with(["cfg.py", "--max_iters=5"], {"batch_size": 8, "foo": 1}, {"batch_size": 4})
    assert args == ["cfg.py", "--max_iters=5", "--batch_size=8"] and used == {"batch_size": 8}


def _profile(phases: dict, findings=()):
    from gpuprof.profile import Profile, StepRecord, summarize

    steps = [StepRecord(i, sum(phases.values()), dict(phases), tokens=256, micro_steps=4) for i in range(3)]
    return Profile(run={"mode": "builtin", "config": {"batch_size": 1, "grad_accum": 8}}, steps=steps,
                   summary=summarize(steps), findings=list(findings))


def test_verify_prints_the_fix_predicted_vs_achieved():
    import io

    from rich.console import Console

    from gpuprof.cli.verify import verify

    fix = {"id": "micro-batch-too-small", "kind": "fix", "title": "micro-batch too small", "saving_s": 0.2,
           "saving_share": 0.4, "config_overrides": {"batch_size": 8, "gradient_accumulation_steps": 1},
           "claims": {"forward": 0.1, "backward": 0.1}, "evidence": {}}
    before = _profile({"data": 0.05, "forward": 0.15, "backward": 0.3}, [fix])
    after = _profile({"data": 0.05, "forward": 0.1, "backward": 0.15})  # forward+backward 0.2 s shorter
    asked = []
    out, err = io.StringIO(), io.StringIO()
    verify(before, before.findings, lambda o: asked.append(o) or after, Console(file=out, width=120),
           Console(file=err, width=200), "the built-in loop")
    assert asked == [{"batch_size": 8, "gradient_accumulation_steps": 1}]
    assert "running the built-in loop again with batch_size=8, gradient_accumulation_steps=1" in err.getvalue()
    line = next(ln for ln in out.getvalue().splitlines() if ln.startswith("--verify: "))
    assert line == ("--verify: `micro-batch-too-small` predicted 200 ms, achieved 200 ms per step "
                    "(achieved / predicted 1.00)")


def test_verify_says_when_there_is_nothing_or_the_rerun_is_refused():
    import io

    from rich.console import Console

    from gpuprof.cli.verify import verify

    err = io.StringIO()
    verify(_profile({"forward": 0.1}), [], None, Console(file=io.StringIO()), Console(file=err, width=200), "x")
    assert "nothing to verify" in err.getvalue()
    fix = {"id": "f", "kind": "fix", "saving_s": 0.1, "config_overrides": {"batch_size": 64}}

    def refused(o):
        raise GpuprofError("the run cannot fit: 90 GiB needed")

    err = io.StringIO()
    verify(_profile({"forward": 0.1}), [fix], refused, Console(file=io.StringIO()), Console(file=err, width=200), "x")
    assert "--verify: not run: the run cannot fit: 90 GiB needed" in err.getvalue()


def test_verify_end_to_end_on_the_builtin_loop():
    r = CliRunner().invoke(app, ["diagnose", "--n-layer", "1", "--n-embd", "32", "--batch-size", "1",
                                 "--block-size", "32", "--grad-accum", "8", "--steps", "3", "--warmup", "1",
                                 "--post-budget", "6", "--no-samplers", "--verify"])
    assert r.exit_code == 0, r.output
    # Either the run found a config fix and verified it, or it said there was none: both are said.
    said = [ln for ln in r.output.splitlines() if ln.startswith(("--verify: `", "gpuprof: --verify: nothing"))]
    assert said, r.output[-2000:]


def test_verify_refuses_json_and_distributed():
    r = CliRunner().invoke(app, ["diagnose", "--verify", "--json"])
    assert r.exit_code == 2 and "without --json" in r.output
    r = CliRunner().invoke(app, ["diagnose", "--verify", "--nproc-per-node", "2"])
    assert r.exit_code == 2 and "data-parallel" in r.output
