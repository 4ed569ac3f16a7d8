"""The CUDA paths of the built-in loop and the CLI, against the contract fake of torch.cuda, and
the post-run guard: nothing after the measured steps can lose the profile."""

import pytest
import torch
from typer.testing import CliRunner

from gpuprof.cli import app
from gpuprof.errors import GpuprofError
from gpuprof.measure.cuda import cuda_device, resolve_device
from gpuprof.runners import builtin
from gpuprof.runners.builtin import LoopConfig, run_builtin

runner = CliRunner()
SMALL = dict(model="tiny", n_layer=1, n_embd=64, n_head=2, batch_size=2, block_size=32, grad_accum=2,
             steps=2, warmup=1, device="cpu")


def test_the_fake_refuses_what_torch_refuses(fake_cuda):
    with pytest.raises(ValueError, match="specified index"):
        torch.cuda.set_device(torch.device("cuda"))  # torch 2.13's _get_device_index
    torch.cuda.set_device(torch.device("cuda", 0))
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.cuda.set_device(3)


def test_device_without_index_resolves_to_the_current_one(fake_cuda):
    assert resolve_device("cuda") == "cuda:0" and resolve_device("cpu") == "cpu"
    assert cuda_device("cuda:0") == torch.device("cuda", 0)


class _Reached(Exception):
    pass


def test_default_cuda_run_sets_an_indexed_device(fake_cuda, monkeypatch):
    # Before: torch.cuda.set_device(torch.device("cuda")) raised ValueError on every GPU.
    seen = {}

    def stop_here(cfg, device, *rest):
        seen["device"] = device
        raise _Reached

    monkeypatch.setattr(builtin, "_run", stop_here)
    with pytest.raises(_Reached):
        run_builtin(LoopConfig(**dict(SMALL, device="cuda", dtype="bf16")))
    assert seen["device"] == "cuda:0" and ("set_device", 0) in fake_cuda.calls


def test_tf32_follows_the_loop_config_and_is_restored(fake_cuda, monkeypatch):
    from gpuprof.measure.precision import matmul_tf32_state

    seen = {}
    monkeypatch.setattr(builtin, "_run", lambda *a: seen.setdefault("tf32", matmul_tf32_state()["tf32_matmul"]))
    before = matmul_tf32_state()["tf32_matmul"]
    run_builtin(LoopConfig(**dict(SMALL, device="cuda", dtype="fp32")))
    assert seen["tf32"] is True  # as nanoGPT's train.py sets at import
    assert matmul_tf32_state()["tf32_matmul"] == before


def test_bf16_refused_where_it_is_only_emulated(monkeypatch):
    from fakes.cuda import FakeCuda

    FakeCuda(name="Tesla V100-SXM2-16GB", capability=(7, 0)).install(monkeypatch)
    with pytest.raises(GpuprofError, match="only emulated"):
        run_builtin(LoopConfig(**dict(SMALL, device="cuda", dtype="bf16")))


def test_cli_default_diagnose_reaches_the_run_on_a_gpu(fake_cuda, monkeypatch):
    seen = {}

    def stop_here(cfg, device, *rest):
        seen.update(device=device, dtype=cfg.dtype, model=cfg.model)
        raise GpuprofError("reached the run")

    monkeypatch.setattr(builtin, "_run", stop_here)
    res = runner.invoke(app, ["diagnose"])
    assert res.exit_code == 2, res.output
    assert "reached the run" in res.output
    assert seen == {"device": "cuda:0", "dtype": "bf16", "model": "gpt2"}


class _Broken:
    """An instrument whose post-run measurement fails, as a CUDA probe can."""

    name = "probe"

    def start(self, ctx):
        pass

    def stop(self, ctx):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


class _NoStart(_Broken):
    name = "nvml"

    def start(self, ctx):
        raise RuntimeError("NVML Shared Library Not Found")


def test_a_failing_post_run_measurement_is_not_measured_and_the_profile_kept():
    prof = run_builtin(LoopConfig(**SMALL), instruments=[_NoStart(), _Broken()])
    assert len(prof.steps) == 2 and prof.stats.step_s > 0
    assert prof.measurements["probe"]["not_measured"].startswith("probe failed: RuntimeError: CUDA error")
    assert "start failed" in prof.measurements["nvml"]["not_measured"]


def test_cli_exit_0_and_not_measured_in_the_report(monkeypatch, tmp_path):
    import gpuprof.measure.instruments as instruments

    monkeypatch.setattr(instruments, "diagnose_instruments", lambda dev, data, samplers, *more: [_Broken()])
    out = tmp_path / "p.json"
    res = runner.invoke(app, ["diagnose", "--n-layer", "1", "--n-embd", "64", "--n-head", "2",
                              "--batch-size", "2", "--block-size", "32", "--grad-accum", "2",
                              "--steps", "2", "--warmup", "1", "--device", "cpu", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "Not measured in this run: probe (--details says why)" in " ".join(res.stdout.split())  # first screen
    assert out.exists()
    full = runner.invoke(app, ["analyze", str(out), "--details"])  # the whole report says why
    assert full.exit_code == 0, full.output
    assert "probe: not measured: probe failed: RuntimeError: CUDA error" in " ".join(full.stdout.split())


def test_cli_no_tf32_reaches_the_loop(fake_cuda, monkeypatch):
    from gpuprof.measure.precision import matmul_tf32_state

    seen = {}

    def stop_here(cfg, device, *rest):
        seen["tf32"] = matmul_tf32_state()["tf32_matmul"]
        raise GpuprofError("reached the run")

    monkeypatch.setattr(builtin, "_run", stop_here)
    res = runner.invoke(app, ["diagnose", "--dtype", "fp32", "--no-tf32"])
    assert res.exit_code == 2 and seen == {"tf32": False}
