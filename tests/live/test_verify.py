"""`diagnose --verify`: the top config fix applied and run again, predicted vs achieved printed."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpuprof.analysis.corrected import CorrectedConfig
from gpuprof.analysis.findings import Finding
from gpuprof.analysis.pipeline import Analysis, AnalysisOptions
from gpuprof.cli import app
from gpuprof.errors import GpuprofError
from gpuprof.runners.builtin import LoopConfig
from gpuprof.session import loop_config_with, script_args_with, top_config_fix


def _finding(fid, kind="fix", saving=None, overrides=None, **kw) -> Finding:
    return Finding(id=fid, title=kw.pop("title", fid), saving_s=saving, saving_share=kw.pop("saving_share", None),
                   evidence={}, kind=kind, config_overrides=dict(overrides or {}), **kw)


def _analysis(findings, profile=None) -> Analysis:
    """An analysis that concluded exactly these findings (of `profile`, when given)."""
    return Analysis(options=AnalysisOptions(), stats=profile.stats if profile is not None else None, mfu=None,
                    findings=tuple(findings), corrected=CorrectedConfig())


def test_top_config_fix_is_the_first_fix_with_overrides_and_a_saving():
    findings = [_finding("a", "verdict", 1.0, {"x": 1}),
                _finding("b", "fix", 0.5, {}),
                _finding("c", "fix", 0.0, {"batch_size": 8}),
                _finding("d", "fix", 0.2, {"batch_size": 8})]
    assert top_config_fix(_analysis(findings)).id == "d"
    assert top_config_fix(_analysis(findings[:3])) is None


def test_overrides_map_onto_the_loop_and_the_script():
    cfg = loop_config_with(LoopConfig(batch_size=1, grad_accum=8),
                           {"batch_size": 8, "gradient_accumulation_steps": 1, "dtype": "bfloat16"})
    assert (cfg.batch_size, cfg.grad_accum, cfg.dtype) == (8, 1, "bf16")
    with pytest.raises(GpuprofError, match="unknown dtype 'int8'; choose fp32, bf16 or fp16"):
        loop_config_with(LoopConfig(), {"dtype": "int8"})  # the user's error, not a ValueError
    with pytest.raises(GpuprofError, match="no option for `warmup_iters`"):
        loop_config_with(LoopConfig(), {"warmup_iters": 3})
    args, used = script_args_with(["cfg.py", "--max_iters=5"], {"batch_size": 8, "foo": 1}, {"batch_size": 4})
    assert args == ["cfg.py", "--max_iters=5", "--batch_size=8"] and used == {"batch_size": 8}


def _profile(phases: dict):
    from gpuprof.profile import Profile, StepRecord

    steps = [StepRecord(i, sum(phases.values()), dict(phases), tokens=256, micro_steps=4) for i in range(3)]
    return Profile(run={"mode": "builtin", "config": {"batch_size": 1, "grad_accum": 8}}, steps=steps)


def test_verify_prints_the_fix_predicted_vs_achieved():
    import io

    from rich.console import Console

    from gpuprof.cli.verify import run_verify

    fix = _finding("micro-batch-too-small", "fix", 0.2, {"batch_size": 8, "gradient_accumulation_steps": 1},
                   title="micro-batch too small", saving_share=0.4, claims={"forward": 0.1, "backward": 0.1})
    before = _profile({"data": 0.05, "forward": 0.15, "backward": 0.3})
    after = _profile({"data": 0.05, "forward": 0.1, "backward": 0.15})  # forward+backward 0.2 s shorter
    asked = []
    out, err = io.StringIO(), io.StringIO()
    run_verify(before, _analysis([fix], before), AnalysisOptions(), Console(file=err, width=200),
               lambda o: asked.append(o) or after, "the built-in loop", console=Console(file=out, width=300))
    assert asked == [{"batch_size": 8, "gradient_accumulation_steps": 1}]
    assert "running the built-in loop again with batch_size=8, gradient_accumulation_steps=1" in err.getvalue()
    line = next(ln for ln in out.getvalue().splitlines() if ln.startswith("--verify: "))
    assert line == ("--verify: `micro-batch-too-small` predicted 200 ms, achieved 200 ms per step "
                    "(achieved / predicted 1.00): realised; no interval: judged on ±15% of the prediction")


def test_verify_says_when_there_is_nothing_or_the_rerun_is_refused():
    import io

    from rich.console import Console

    from gpuprof.cli.verify import run_verify

    err, out = io.StringIO(), io.StringIO()
    prof = _profile({"forward": 0.1})
    run_verify(prof, _analysis([], prof), AnalysisOptions(), Console(file=err, width=200), None, "x",
               console=Console(file=out))
    assert "nothing to verify" in err.getvalue() and out.getvalue() == ""
    fix = _finding("f", "fix", 0.1, {"batch_size": 64})

    def refused(o):
        raise GpuprofError("the run cannot fit: 90 GiB needed")

    err = io.StringIO()
    run_verify(prof, _analysis([fix], prof), AnalysisOptions(), Console(file=err, width=200), refused, "x",
               console=Console(file=out))
    assert "--verify: not run: the run cannot fit: 90 GiB needed" in err.getvalue() and out.getvalue() == ""


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
