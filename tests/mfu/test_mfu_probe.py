"""The matmul ceiling probe on CPU: bounded time, a positive rate, the run's dtype."""

import time
import types

import torch

from gpuprof.measure.probe import CeilingProbe, matmul_ceiling, run_dtype


def test_cpu_probe_is_short_and_positive():
    t = time.perf_counter()
    r = matmul_ceiling("cpu", "fp32", seconds=0.4)
    wall = time.perf_counter() - t
    assert wall < 1.5
    assert r["method"] == "wall" and r["dtype"] == "fp32"
    assert r["tflops"] > 0 and r["tflops"] >= r["tflops_mean"]
    assert r["matmuls"] >= 1 and 512 <= r["size"] <= 2048


def test_fixed_size_and_fp8_probed_as_bf16():
    r = matmul_ceiling("cpu", "fp8", seconds=0.2, size=128)
    assert r["size"] == 128 and r["dtype"] == "bf16" and r["requested_dtype"] == "fp8"


def test_run_dtype():
    assert run_dtype(torch.bfloat16, "cuda") == "bf16"
    assert run_dtype(None, "cpu") == "fp32"


def test_probe_instrument_reports_errors_instead_of_raising():
    ctx = types.SimpleNamespace(device="nonsense-device", autocast_dtype=None)
    out = CeilingProbe(seconds=0.1).stop(ctx)
    assert out["tflops"] is None and "error" in out
