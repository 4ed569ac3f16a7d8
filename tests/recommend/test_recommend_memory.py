"""The memory model against measured peaks of real training steps on small GPTs (CPU tensor
tracker) and of GPT-2-shaped ones under FakeTensorMode. The issue asks for ±15%; the tensor
terms are modeled exactly, so these assert ±3%."""

import pytest
import torch

from gpuprof.recommend.memory import estimate_memory, max_batch_that_fits
from gpuprof.recommend.probe import measured_peak
from gpuprof.recommend.tracker import MemoryTracker
from gpuprof.dims import GPTConfig, param_count, preset_config


SMALL = GPTConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=512, block_size=64)
WIDE_VOCAB = GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=4096, block_size=32)


@pytest.mark.parametrize("cfg, batch, dtype, flash, ckpt, accum", [
    (SMALL, 4, "fp32", True, False, 2),
    (SMALL, 4, "bf16", True, False, 2),
    (SMALL, 4, "fp32", False, False, 2),   # math attention: B·H·T·T probabilities kept
    (SMALL, 4, "fp32", True, True, 2),     # activation checkpointing
    (SMALL, 4, "fp32", True, False, 1),    # no accumulation: no gradients at the peak
    (WIDE_VOCAB, 8, "fp32", True, False, 2),  # logits dominate
    (SMALL, 4, "fp16", True, False, 2),
    # checkpointing with few tokens: the peak is the forward's end, where autocast still
    # caches every weight cast
    (GPTConfig(n_layer=3, n_head=4, n_embd=192, vocab_size=256, block_size=32), 2, "bf16",
     True, True, 2),
])
def test_model_matches_measured_peak(cfg, batch, dtype, flash, ckpt, accum):
    measured = measured_peak(cfg, batch, dtype, flash=flash, checkpointing=ckpt, accum=accum)
    est = estimate_memory(cfg, batch, dtype=dtype, flash=flash, checkpointing=ckpt,
                          grad_accum=accum, device="cpu")
    assert est.peak_allocated_bytes == pytest.approx(measured, rel=0.03)


def test_model_matches_fake_gpt2_shapes():
    # GPT-2 124M dims (vocab 50304) at block 128: sized under FakeTensorMode, nothing allocated.
    cfg = preset_config("gpt2", block_size=128)
    measured = measured_peak(cfg, 2, "bf16", fake=True)
    est = estimate_memory(cfg, 2, dtype="bf16", device="cpu")
    assert est.peak_allocated_bytes == pytest.approx(measured, rel=0.03)
    assert measured > 2e9  # more than this test could afford to allocate for real, cheaply


def test_tracker_counts_views_once_and_frees():
    tr = MemoryTracker()
    with tr:
        a = torch.empty(1000, dtype=torch.float32)
        v = a.view(10, 100)[1:]
        assert tr.current_bytes == 4000
        b = torch.empty(500, dtype=torch.float64)
        assert tr.current_bytes == 8000
        del b
        assert tr.current_bytes == 4000
    assert tr.peak_bytes == 8000
    del a, v


def test_terms_add_up_and_cuda_overheads():
    cfg = preset_config("gpt2", 1024)
    cpu = estimate_memory(cfg, 16, dtype="bf16", device="cpu")
    gpu = estimate_memory(cfg, 16, dtype="bf16", device="cuda", capacity_bytes=141 * 10**9)
    assert sum(t.bytes for t in cpu.terms) == cpu.total_bytes == cpu.peak_allocated_bytes
    assert sum(t.bytes for t in gpu.terms) == gpu.total_bytes
    assert gpu.total_bytes > gpu.peak_allocated_bytes
    assert gpu.term("weights") == 4 * param_count(cfg, non_embedding=False)
    assert gpu.term("optimizer") == 8 * param_count(cfg, non_embedding=False)
    assert gpu.margin_bytes == int(0.05 * 141 * 10**9)


def test_memory_grows_with_batch_and_max_batch_is_consistent():
    cfg = preset_config("gpt2", 1024)
    a, b = (estimate_memory(cfg, n, dtype="bf16").peak_allocated_bytes for n in (8, 16))
    assert b > a
    cap = 80 * 10**9
    m = max_batch_that_fits(cfg, cap, dtype="bf16", compile=True)
    assert estimate_memory(cfg, m, dtype="bf16", compile=True, capacity_bytes=cap).fits
    assert not estimate_memory(cfg, m + 1, dtype="bf16", compile=True, capacity_bytes=cap).fits


def test_checkpointing_and_compile_reduce_memory():
    cfg = preset_config("gpt2", 1024)
    base = estimate_memory(cfg, 32, dtype="bf16").peak_allocated_bytes
    assert estimate_memory(cfg, 32, dtype="bf16", checkpointing=True).peak_allocated_bytes < base
    assert estimate_memory(cfg, 32, dtype="bf16", compile=True).peak_allocated_bytes < base
    assert estimate_memory(cfg, 32, dtype="bf16", flash=False).peak_allocated_bytes > base
