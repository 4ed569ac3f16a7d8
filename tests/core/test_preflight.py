"""Before a built-in run: memory and step time estimated (output paths: tests/core/test_files.py)."""

import pytest

from gpuprof import preflight
from gpuprof.dims import flops_per_token, preset_config
from gpuprof.errors import GpuprofError
from gpuprof.preflight import Ceiling, check_memory, device_ceiling, estimate_step, preflight_run
from gpuprof.recommend.memory import estimate_memory
from gpuprof.runners.builtin import LoopConfig
from gpuprof.units import GiB, gib


FAST = dict(n_layer=1, n_embd=64, n_head=2, batch_size=2, block_size=32, grad_accum=2, steps=3, warmup=1)


# -- memory ---------------------------------------------------------------------------------


def _fits(loop, batch, block, capacity):
    cfg = preset_config(loop.model, block)
    return estimate_memory(cfg, batch, dtype=loop.dtype, grad_accum=loop.grad_accum, device="cpu",
                           capacity_bytes=capacity).fits


def test_block_size_100000_does_not_fit_and_the_largest_that_do_are_exact():
    loop = LoopConfig(block_size=100_000)
    cap = 16 * GiB
    m = check_memory(loop, capacity=(cap, "available RAM"))
    assert not m.fits and m.estimate.total_bytes > cap
    assert m.estimate.total_bytes == estimate_memory(preset_config("tiny", 100_000), 8, dtype="fp32",
                                                     grad_accum=4, device="cpu").total_bytes
    # The largest batch (at block 100000) and block (at batch 8) that fit, by the same model.
    assert _fits(loop, m.max_batch, 100_000, cap) and not _fits(loop, m.max_batch + 1, 100_000, cap)
    assert _fits(loop, 8, m.max_block, cap) and not _fits(loop, 8, m.max_block + 1, cap)
    msg = m.message(loop)
    assert msg.startswith(f"this run would not fit: its peak memory is estimated at "
                          f"{gib(m.estimate.total_bytes)} (memory model")
    assert "vs 16.0 GiB available RAM (15.2 GiB after a 5% margin)" in msg
    assert (f"largest that fit (estimated): --batch-size {m.max_batch} at --block-size 100000 or "
            f"--block-size {m.max_block} at --batch-size 8") in msg


def test_a_model_too_big_for_any_batch_says_so():
    m = check_memory(LoopConfig(model="gpt2-xl", block_size=1024), capacity=(8 * GiB, "available RAM"))
    assert (m.max_batch, m.max_block) == (0, 0)
    assert "not even --batch-size 1 at --block-size 1 fits" in m.message(LoopConfig(model="gpt2-xl"))


def test_the_default_run_fits_on_the_fake_h200(fake_cuda):
    m = check_memory(LoopConfig(model="gpt2", batch_size=16, block_size=1024, dtype="bf16", device="cuda"))
    assert m.fits and m.capacity_source.startswith("memory of NVIDIA H200")
    assert m.estimate.capacity_bytes == fake_cuda.total_memory


# -- step time ------------------------------------------------------------------------------


def test_step_estimate_is_flops_over_the_ceiling():
    loop = LoopConfig(**FAST)
    flops = flops_per_token(preset_config("tiny", 32, n_layer=1, n_embd=64, n_head=2)) * 2 * 32 * 2
    est = estimate_step(loop, ceiling=Ceiling(1e6, "a fake 1 MFLOP/s ceiling"))
    assert est.flops_per_step == flops and est.seconds == pytest.approx(flops / 1e6)
    assert est.slow and est.how.endswith("÷ a fake 1 MFLOP/s ceiling")


def test_a_small_step_is_not_probed(monkeypatch):
    monkeypatch.setattr(preflight, "probe_ceiling", lambda *a: pytest.fail("probed"))
    est = estimate_step(LoopConfig(**FAST))
    assert est.seconds is None and not est.slow and est.how.startswith("not probed")


def test_a_failed_probe_never_stops_the_run(monkeypatch):
    def broken(device, dtype):
        raise RuntimeError("no BLAS")

    monkeypatch.setattr(preflight, "probe_ceiling", broken)
    est = estimate_step(LoopConfig())  # tiny, 8x256x4: 5.2e10 FLOPs, probed
    assert est.seconds is None and est.how == "not estimated: RuntimeError: no BLAS"


def test_cuda_uses_the_datasheet_peak_at_the_stated_utilisation(monkeypatch):
    monkeypatch.setattr(preflight, "probe_ceiling", lambda *a: pytest.fail("probed"))
    bf16 = device_ceiling("cuda", "bf16", gpu="h200")
    assert bf16.flops_per_s == pytest.approx(0.40 * 989.5e12)
    assert bf16.how == "40% (assumed utilisation) of the NVIDIA H200 SXM's bf16 datasheet peak, 989.5 TFLOP/s"
    assert device_ceiling("cuda", "fp32", tf32=True, gpu="h200").flops_per_s == pytest.approx(0.40 * 494.5e12)
    assert device_ceiling("cuda", "fp32", tf32=False, gpu="h200").flops_per_s == pytest.approx(0.40 * 67e12)
    assert device_ceiling("cpu", "fp32", peak_tflops=2.0).flops_per_s == pytest.approx(0.8e12)


def test_no_datasheet_peak_means_a_probe(monkeypatch):
    seen = []
    monkeypatch.setattr(preflight, "probe_ceiling", lambda dev, dt: seen.append((dev, dt)) or Ceiling(1e9, "x"))
    device_ceiling("cuda", "bf16", gpu="Some Future GPU")
    device_ceiling("cuda", "bf16", gpu="t4")  # no bf16 tensor cores: no bf16 peak in the table
    device_ceiling("cpu", "bf16")
    assert seen == [("cuda", "bf16"), ("cuda", "bf16"), ("cpu", "bf16")]


def test_the_cpu_probe_is_short_and_labelled():
    c = preflight.probe_ceiling("cpu", "fp32")
    assert c.flops_per_s > 0 and " fp32 matmul ceiling a " in c.how and " s probe measured on this CPU" in c.how


def test_a_slow_step_is_said_up_front_and_an_hour_long_run_refused_unless_allowed():
    loop = LoopConfig(**FAST)
    slow = Ceiling(1e6, "a fake 1 MFLOP/s ceiling")
    warning = preflight_run(loop, ceiling=slow, capacity=(16 * GiB, "available RAM"))
    assert warning == ("one optimizer step is estimated at 4.0 min (2.4e8 FLOPs per step by the "
                       "nanoGPT formula ÷ a fake 1 MFLOP/s ceiling); the 4 steps of this run "
                       "(warmup + measured) ≈ 16.2 min; running it, Ctrl-C stops it")
    slower = Ceiling(2e5, "a fake 0.2 MFLOP/s ceiling")
    with pytest.raises(GpuprofError) as exc:
        preflight_run(loop, ceiling=slower, capacity=(16 * GiB, "available RAM"))
    assert "≈ 81.0 min; pass --allow-slow" in str(exc.value)
    assert preflight_run(loop, ceiling=slower, allow_slow=True, capacity=(16 * GiB, "RAM")).endswith("Ctrl-C stops it")
    assert preflight_run(loop, ceiling=Ceiling(1e9, "fast"), capacity=(16 * GiB, "RAM")) is None


def test_memory_is_checked_before_anything_is_probed(monkeypatch):
    monkeypatch.setattr(preflight, "probe_ceiling", lambda *a: pytest.fail("probed"))
    with pytest.raises(GpuprofError, match="would not fit"):
        preflight_run(LoopConfig(block_size=100_000), capacity=(16 * GiB, "available RAM"))
