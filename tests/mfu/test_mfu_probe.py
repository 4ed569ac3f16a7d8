"""The matmul ceiling probe on CPU: bounded time, a positive rate, the run's dtype."""

import types

import pytest
import torch

from gpuprof.hardware import observed_compute_dtype
from gpuprof.measure.probe import CeilingProbe, matmul_ceiling


def test_cpu_probe_is_short_and_positive():
    r = matmul_ceiling("cpu", "fp32", seconds=0.4)
    assert r["method"] == "wall" and r["dtype"] == "fp32"
    assert r["tflops"] > 0 and r["tflops"] >= r["tflops_mean"]
    assert r["matmuls"] >= 1 and 512 <= r["size"] <= 2048


def test_fixed_size_and_fp8_probed_as_bf16():
    r = matmul_ceiling("cpu", "fp8", seconds=0.2, size=128)
    assert r["size"] == 128 and r["dtype"] == "bf16" and r["requested_dtype"] == "fp8"


def test_compute_dtype_from_what_was_observed():
    assert observed_compute_dtype("bfloat16", "float32", False, "cuda:0") == "bf16"
    assert observed_compute_dtype(None, "float32", True, "cuda:0") == "tf32"
    assert observed_compute_dtype(None, "float32", True, "cpu") == "fp32"  # TF32 is a CUDA matmul mode
    assert observed_compute_dtype(None, "bfloat16", False, "cuda:0") == "bf16"  # model.to(torch.bfloat16)
    assert observed_compute_dtype(None, None, False, "cuda:0") == "fp32"


def test_probe_instrument_measures_the_runs_compute_dtype():
    ctx = types.SimpleNamespace(device="cpu", precision={"compute_dtype": "fp32"})
    out = CeilingProbe(seconds=0.1).stop(ctx)
    assert out["dtype"] == "fp32" and out["tflops"] > 0


@pytest.fixture
def gpu_matmuls(monkeypatch):
    """A two-GPU contract fake where every matmul queues 1 ms of work on the stream it would
    run on (the current stream of the device its tensors are on), with host tensors underneath."""
    from fakes.cuda import FakeCuda

    fake = FakeCuda(n_devices=2).install(monkeypatch)
    devices = {}
    real_randn, real_empty = torch.randn, torch.empty

    def on(fn):
        def make(*a, device=None, **k):
            t = fn(*a, **k)
            devices[id(t)] = torch.device(device).index if device is not None else fake.current
            return t
        return make

    def matmul(a, b, out=None):
        fake.enqueue(0.001, stream=fake.current_stream(devices[id(a)]))
        return out

    monkeypatch.setattr(torch, "randn", on(real_randn))
    monkeypatch.setattr(torch, "empty", on(real_empty))
    monkeypatch.setattr(torch, "matmul", matmul)
    return fake


def test_cuda_probe_times_the_measured_device_not_the_current_one(gpu_matmuls):
    # A script on cuda:1 that never called set_device: the current device is 0 and idle.
    r = matmul_ceiling("cuda:1", "bf16", seconds=0.05, size=64)
    assert gpu_matmuls.contexts == {1}
    assert r["method"] == "cuda-events"
    assert r["tflops"] == pytest.approx(2 * 64**3 / 1e-3 / 1e12)  # 1 ms per matmul


@pytest.fixture
def new_precision_api():
    """The script used torch 2.13's new TF32 API: reading the legacy flag now raises."""
    m = torch.backends.cuda.matmul
    m.allow_tf32 = False  # torch refuses the legacy read only when the two APIs disagree
    m.fp32_precision = "tf32"
    with pytest.raises(RuntimeError):
        m.allow_tf32
    yield
    m.fp32_precision = "none"


def test_probe_measures_exactly_the_asked_dtype_and_restores_tf32(gpu_matmuls, new_precision_api):
    tf32 = matmul_ceiling("cuda", "tf32", seconds=0.02, size=64)
    fp32 = matmul_ceiling("cuda", "fp32", seconds=0.02, size=64)
    assert tf32["dtype"] == "tf32" and tf32["tf32_during_probe"] is True
    assert fp32["dtype"] == "fp32" and fp32["tf32_during_probe"] is False
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"  # the script's setting is back


def test_probe_instrument_reports_errors_instead_of_raising():
    ctx = types.SimpleNamespace(device="nonsense-device", autocast_dtype=None)
    out = CeilingProbe(seconds=0.1).stop(ctx)
    assert out["tflops"] is None and out["not_measured"].startswith("matmul probe failed")
