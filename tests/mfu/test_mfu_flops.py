"""Analytic vs counted FLOPs for the built-in GPT, and counting without side effects."""

import types

import pytest
import torch

from gpuprof.dims import (GPT2_SIZES, PRESETS, GPTConfig, flops_per_token, gpt_flops_per_token,
                          gpt_param_count, param_count, preset_config, preset_dims)
from gpuprof.errors import GpuprofError
from gpuprof.measure.flops import FlopsInstrument, count_flops
from gpuprof.measure.timer import PhaseTimer
from gpuprof.profile import Profile, StepRecord
from gpuprof.runners.builtin import RunContext
from gpuprof.runners.gpt import GPT


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    cfg = preset_config("tiny", block_size=64)
    model = GPT(cfg)
    x = torch.randint(0, cfg.vocab_size, (2, 64))
    return cfg, model, x


def test_analytic_formula_matches_the_model_code():
    for name in PRESETS:
        cfg = preset_config(name, block_size=512)
        assert gpt_flops_per_token(cfg.to_dict()) == flops_per_token(cfg)
        assert gpt_param_count(**cfg.to_dict()) == param_count(cfg)
    assert gpt_param_count(**GPTConfig(bias=False).to_dict()) == param_count(GPTConfig(bias=False))
    # The GPT-2 family is PRESETS' rows: the published shapes, GPTConfig's padded vocab.
    published = {"gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024), "gpt2-large": (36, 20, 1280),
                 "gpt2-xl": (48, 25, 1600)}
    assert GPT2_SIZES == {name: dict(n_layer=L, n_head=H, n_embd=d, vocab_size=50304)
                          for name, (L, H, d) in published.items()}
    for name, dims in GPT2_SIZES.items():
        assert preset_dims(name) == dims and preset_config(name).vocab_size == 50304
        assert {k: PRESETS[name][k] for k in ("n_layer", "n_head", "n_embd")} == {
            k: dims[k] for k in ("n_layer", "n_head", "n_embd")}
    assert preset_dims("tiny") == dict(n_layer=2, n_head=4, n_embd=128, vocab_size=4096)
    with pytest.raises(GpuprofError, match="unknown model preset 'gpt5'"):
        preset_dims("gpt5")
    # FACTS.md: GPT-2 124M at T=1024 is 0.855 GFLOPs/token.
    assert gpt_flops_per_token(dict(GPT2_SIZES["gpt2"], block_size=1024)) / 1e9 == pytest.approx(0.855, abs=0.001)


def test_counted_agrees_with_analytic_for_builtin_gpt(tiny):
    cfg, model, x = tiny
    c = count_flops(model, (x, x))
    per_token = c["train"] / x.numel()
    # The count misses only layernorm/bias/softmax FLOPs: within a few percent.
    assert per_token / flops_per_token(cfg) == pytest.approx(1.0, abs=0.02)
    assert c["train"] == 3 * c["forward"]
    assert any("attention" in op for op in c["by_op"])  # CPU fused attention is counted


def test_counting_preserves_rng_and_grads(tiny):
    cfg, model, x = tiny
    model.zero_grad(set_to_none=True)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    count_flops(model, (x, x))
    assert torch.equal(torch.rand(3), expected)
    assert all(p.grad is None for p in model.parameters())


def test_compiled_wrapper_is_unwrapped(tiny):
    cfg, model, x = tiny
    wrapper = types.SimpleNamespace(_orig_mod=model)  # what torch.compile returns carries _orig_mod
    c = count_flops(wrapper, (x,))
    assert c["compiled"] is True
    assert c["forward"] == count_flops(model, (x,))["forward"]


def _ctx(cfg, model, x, micro=4):
    # The measured steps the instrument reads its micro-steps and tokens per step from (profile.stats).
    steps = [StepRecord(i, 1.0, {"forward": 1.0}, tokens=x.numel() * micro, micro_steps=micro) for i in range(2)]
    prof = Profile(run={}, steps=steps)
    return RunContext(config={"grad_accum": micro}, gpt_config=cfg, model=model, example_args=(x, x),
                      example_kwargs={}, device="cpu", timer=PhaseTimer(), autocast_dtype=None, profile=prof)


def test_instrument_reports_both_and_uses_analytic(tiny):
    cfg, model, x = tiny
    out = FlopsInstrument().stop(_ctx(cfg, model, x, micro=4))
    assert out["used"] == "analytic"
    assert out["analytic_per_step"] == flops_per_token(cfg) * x.numel() * 4
    assert out["counted_per_step"] == pytest.approx(out["counted_forward_per_micro"] * 3 * 4)
    assert out["agreement"] == pytest.approx(1.0, abs=0.02)
    assert out["errors"] == []


def test_instrument_without_gpt_config_uses_count(tiny):
    cfg, model, x = tiny
    ctx = _ctx(cfg, model, x, micro=2)
    ctx.gpt_config = None
    out = FlopsInstrument().stop(ctx)
    assert out["used"] == "counted" and out["analytic_per_step"] is None and out["agreement"] is None


def test_instrument_survives_a_model_that_cannot_run(tiny):
    cfg, model, x = tiny
    ctx = _ctx(cfg, model, x)
    ctx.example_args = ("not a tensor",)
    out = FlopsInstrument().stop(ctx)
    assert out["used"] == "analytic" and out["counted_per_step"] is None
    assert out["errors"] and "FlopCounterMode failed" in out["errors"][0]
