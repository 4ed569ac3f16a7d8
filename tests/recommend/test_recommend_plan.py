"""Exact token arithmetic, ranking, and the honest answer to the famous 256 × 4 suggestion."""

import pytest

from gpuprof.errors import GpuprofError
from gpuprof.hardware import find_gpu
from gpuprof.recommend.plan import recommend, token_window
from gpuprof.recommend.throughput import ThroughputModel
from gpuprof.dims import preset_config

H200 = find_gpu("h200")
GPT2 = preset_config("gpt2", block_size=1024)


def test_window_is_exact_integers():
    assert token_window(1_000_000, 0.05) == (950_000, 1_050_000)
    assert token_window(1_048_576, 0.0) == (1_048_576, 1_048_576)
    assert token_window(524_288, 0.05) == (498_074, 550_502)  # ceil / floor of ×0.95 / ×1.05


def test_every_candidate_is_exact_and_in_window():
    rec = recommend(GPT2, 1_000_000, H200, "bf16", compile=True)
    lo, hi = token_window(1_000_000, 0.05)
    assert rec.candidates
    for c in rec.candidates:
        assert c.tokens == c.batch_size * 1024 * c.grad_accum
        assert lo <= c.tokens <= hi
        assert c.gradient_accumulation_steps == c.grad_accum
    pairs = {(c.batch_size, c.grad_accum) for c in rec.candidates}
    # "1M" is 1,000,000, but the power-of-two splits of 2^20 are still candidates (+4.86%)
    assert {(16, 64), (64, 16), (128, 8), (256, 4), (1024, 1)} <= pairs
    assert (16, 61) in pairs  # the closest to exactly 1,000,000 for batch 16: 999,424 tokens


def test_world_size_multiplies_tokens_and_nanogpt_accum():
    rec = recommend(GPT2, 2**20, H200, "bf16", compile=True, world_size=8, tolerance=0.0)
    for c in rec.candidates:
        assert c.tokens == c.batch_size * 1024 * c.grad_accum * 8 == 2**20
        assert c.gradient_accumulation_steps == 8 * c.grad_accum
    assert rec.overrides()["gradient_accumulation_steps"] % 8 == 0
    assert any("divides gradient_accumulation_steps" in n for n in rec.notes)


def test_the_famous_256x4_on_h200_does_not_fit():
    """GPT-2 124M, block 1024, 2^20 tokens, H200 bf16: the suggested batch_size=256 × 4."""
    for compile in (True, False):
        rec = recommend(GPT2, 2**20, H200, "bf16", compile=compile, tolerance=0.0)
        c256 = next(c for c in rec.candidates if c.batch_size == 256)
        assert c256.grad_accum == 4 and c256.tokens == 1_048_576
        assert c256.fits is False
        assert c256.memory.peak_allocated_bytes > H200.memory_bytes  # not even the tensors fit
        assert rec.best is not None and rec.best.fits and rec.best.batch_size < 256
    eager = recommend(GPT2, 2**20, H200, "bf16", compile=False, tolerance=0.0)
    c128 = next(c for c in eager.candidates if c.batch_size == 128)
    assert c128.fits is False  # eager keeps the fp32 B·T·V loss buffers
    comp = recommend(GPT2, 2**20, H200, "bf16", compile=True, tolerance=0.0)
    assert next(c for c in comp.candidates if c.batch_size == 128).fits is True


def test_ranking_prefers_measured_speed_and_fit():
    # A large fixed cost per micro-step (slow data loading): fewer micro-steps clearly win.
    tp = ThroughputModel(fixed_s=0.3, per_token_s=1e-6, optimizer_s=0.01, source="profile",
                         note="test")
    rec = recommend(GPT2, 2**20, H200, "bf16", compile=True, tolerance=0.0, throughput=tp,
                    current=(16, 64))
    assert rec.best.batch_size == 128 and rec.best.grad_accum == 8  # largest that fits
    assert rec.candidates[0] is rec.best
    assert rec.best.step_s == pytest.approx(8 * (0.3 + 1e-6 * 128 * 1024) + 0.01)
    assert rec.current.step_s == pytest.approx(64 * (0.3 + 1e-6 * 16 * 1024) + 0.01)
    fits = [c.fits for c in rec.candidates]
    assert fits == sorted(fits, reverse=True)  # everything that fits ranks above what doesn't


def test_near_equal_speeds_prefer_less_memory():
    rec = recommend(GPT2, 2**20, H200, "bf16", compile=True, tolerance=0.0)  # FLOP estimate
    fastest = max(c.tokens_per_s for c in rec.candidates if c.fits)
    assert rec.best.tokens_per_s >= 0.99 * fastest
    assert rec.best.pow2
    assert all(c.memory.total_bytes >= rec.best.memory.total_bytes for c in rec.candidates
               if c.fits and c.pow2 and c.tokens_per_s >= 0.99 * fastest)


def test_nothing_fits():
    rec = recommend(preset_config("gpt2-xl", 1024), 2**20, None, "fp32", compile=False,
                    capacity_bytes=8 * 10**9)
    assert rec.best is None and "nothing fits" in rec.reason
    assert rec.overrides() == {}


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(target_tokens=1000), "smaller than one sequence"),
    (dict(target_tokens=10_000, world_size=8, tolerance=0.05), "nearest are 8,192 (-18.1%) and 16,384"),
    (dict(target_tokens=0), "must be a positive integer"),
    (dict(target_tokens=2**20, world_size=0), "must be a positive integer"),
    (dict(target_tokens=2**20, tolerance=1.5), "--tolerance"),
    (dict(target_tokens=2**20, dtype="int8"), "unknown dtype"),
    (dict(target_tokens=2**20, current=(0, 4)), "batch-size must be a positive integer"),
])
def test_bad_inputs(kwargs, fragment):
    kw = dict(gpu=H200)
    kw.update(kwargs)
    with pytest.raises(GpuprofError) as exc:
        recommend(GPT2, **kw)
    assert fragment in str(exc.value)


def test_to_dict_keys():
    rec = recommend(GPT2, 2**20, H200, "bf16", compile=True, current=(16, 64))
    d = rec.to_dict()
    for key in ("target_tokens", "candidates", "best", "reason", "breakdown", "current",
                "throughput", "capacity_bytes", "flop_floor_s", "overrides", "notes"):
        assert key in d
    for key in ("batch_size", "grad_accum", "tokens", "memory_bytes", "fits", "step_s"):
        assert key in d["best"] and key in d["candidates"][0]
    assert sum(t["bytes"] for t in d["breakdown"]["terms"]) == d["breakdown"]["total_bytes"]
    assert d["flop_floor_s"] == pytest.approx(0.906, abs=0.01)  # FACTS.md: 0.91 s at 100% peak


def test_huge_target_with_tiny_block_is_exact():
    rec = recommend(preset_config("tiny", block_size=8), 2**30, find_gpu("h100"), "bf16")
    lo, hi = token_window(2**30, 0.05)
    assert all(lo <= c.tokens <= hi and c.batch_size <= 65536 for c in rec.candidates)
    assert any(c.pow2 for c in rec.candidates)
