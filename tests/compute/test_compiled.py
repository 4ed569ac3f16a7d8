"""--measure-compile's timing (measure/compiled.py): the model compiled after the run, eager and
compiled forward+backward alternated, the compile's own time; the user's model left as it was.
dynamo's "eager" backend stands in for inductor here (no C compiler, seconds not minutes); the
mechanism is the same call."""

import torch

from gpuprof.measure.compiled import CompileProbe, time_compiled
from gpuprof.measure.instruments import default_instruments

from test_kernels import TinyGPT, _ctx, _ids


def test_the_model_is_timed_eager_and_compiled_and_left_as_it_was():
    torch._dynamo.reset()
    model = TinyGPT(dropout=0.0).eval()
    x, y = _ids()
    res = time_compiled(model, (x, y), {}, "cpu", None, backend="eager", seconds=1.0)
    assert res["eager_s"] > 0 and res["compiled_s"] > 0 and res["compile_s"] > 0 and res["rounds"] >= 2
    assert res["backend"] == "eager"
    assert not model.training  # restored
    assert all(p.grad is None for p in model.parameters())
    torch._dynamo.reset()


def test_the_probe_says_why_it_did_not_measure():
    model = TinyGPT()
    ctx = _ctx(model, None, _ids())
    ctx.config = {"compile": True}
    assert CompileProbe().stop(ctx) == {"not_measured": "the run is already compiled"}
    ctx.config = {"compile": False}
    out = CompileProbe(backend="no-such-backend").stop(ctx)
    assert out["not_measured"].startswith("compile failed: ")


def test_only_asked_for():
    names = [getattr(i, "name", None) for i in default_instruments("cpu", None, samplers=False)]
    assert "compile" not in names and names[-1] == "microbatch"
    names = [getattr(i, "name", None) for i in default_instruments("cpu", None, samplers=False, measure_compile=True)]
    assert names[-1] == "compile"  # after every budgeted part


def test_diagnose_measure_compile_reaches_the_probe_and_the_rule(monkeypatch, tmp_path):
    import json

    from typer.testing import CliRunner

    import gpuprof.measure.compiled as compiled
    from gpuprof.cli import app

    monkeypatch.setattr(compiled.CompileProbe.__init__, "__defaults__", ("eager", 1.0))  # no inductor here
    out = tmp_path / "p.json"
    res = CliRunner().invoke(app, ["diagnose", "--measure-compile", "--n-layer", "1", "--n-embd", "32", "--n-head", "2",
                                   "--batch-size", "2", "--block-size", "32", "--grad-accum", "1", "--steps", "2",
                                   "--warmup", "1", "--device", "cpu", "--post-budget", "0", "--out", str(out)])
    assert res.exit_code == 0, res.output
    prof = json.loads(out.read_text())
    c = prof["measurements"]["compile"]
    assert c["backend"] == "eager" and c["eager_s"] > 0 and c["compiled_s"] > 0 and c["compile_s"] > 0
    (f,) = [f for f in prof["analysis"]["findings"] if f["id"] == "compile-missing"]
    assert f["evidence"]["compile_s"] == c["compile_s"]
    torch._dynamo.reset()
