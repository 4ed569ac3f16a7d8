"""attention-by-hand, attention-need-weights, vocab-not-padded, optimizer-not-fused (and
optimizer-slow carrying it) and compile-missing claim what their paired rounds support (issue #29),
as precision-slow does: a real effect gives a saving whose interval holds the injected truth, with
a confidence from that interval; no effect is information within noise, with no saving, claims or
config change; a profile without rounds falls back to the point figure at confidence "low". The
rounds are injected (seeded), never timed here."""

import random

import pytest

from gpuprof.analysis.bounds import violations
from gpuprof.analysis.findings import Context
from gpuprof.analysis.pipeline import analyze
from gpuprof.analysis.rules import compute, gpu
from gpuprof.measure.paired import confidence, paired_ratio_interval

PHASES = {"forward": 0.3, "backward": 0.6, "optimizer": 0.1}  # a 1.0 s step of 4 micro-steps


def _rounds(ratio: float, base: float = 0.01, n: int = 12, noise: float = 0.05, seed: int = 3):
    """n paired rounds of the run's way (`base` seconds) and the changed way at `ratio` of it, each
    round with a shared drift and its own ±noise; and their interval."""
    rng = random.Random(seed)
    a, b = [], []
    for _ in range(n):
        drift = rng.uniform(0.9, 1.3)
        a.append(base * drift * (1 + rng.uniform(-noise, noise)))
        b.append(base * ratio * drift * (1 + rng.uniform(-noise, noise)))
    return a, b, paired_ratio_interval(a, b)


def _ctx(profile_factory, device="cpu", **measurements):
    p = profile_factory(dict(PHASES), device=device, measurements=measurements, micro_steps=4)
    return Context(profile=p, stats=p.stats)


def _bounded(ctx):
    assert violations(ctx.profile, analyze(ctx.profile)) == []


def _claims_the_interval(f, iv, of_s: float, truth: float):
    assert f.kind == "fix" and f.saving_s == pytest.approx(of_s * (1 - iv.estimate))
    ev = f.evidence
    assert ev["saving_low_s"] <= of_s * (1 - truth) <= ev["saving_high_s"]  # holds the injected truth
    assert ev["saving_low_s"] > 0 and ev["rounds"] == iv.n and ev["interval_level"] == iv.level
    assert f.confidence == confidence(iv) and f"{iv.n} rounds" in f.note
    assert sum(f.claims.values()) == pytest.approx(f.saving_s)


def _within_noise(f):
    assert f.kind == "info" and f.saving_s is None and f.confidence == "low"
    assert f.evidence["within_noise"] and f.evidence["saving_low_s"] < 0 < f.evidence["saving_high_s"]
    assert "within this machine's noise" in f.note and f.config_overrides == {} and f.claims == {}


def _point_figure(f, saving: float):
    assert f.kind == "fix" and f.saving_s == pytest.approx(saving) and f.confidence == "low"
    assert f.evidence["interval_measured"] is False and "saving_low_s" not in f.evidence
    assert "interval not measured" in f.note


# ------------------------------------------------------------------ attention-by-hand
def _attention(ratio=None, point=(6e-3, 3e-3)):
    """12 layers by hand at (8, 12, 1024, 64); one layer's forward is a third of its time."""
    calls = [{"module": f"h.{i}.attn", "shape": [8, 12, 1024, 64], "dtype": "bf16", "masked": True,
              "causal": True, "dropout_p": 0.0} for i in range(12)]
    hand, fused = point
    timing = {"by_hand_forward_s": hand / 3, "by_hand_backward_s": 2 * hand / 3, "sdpa_forward_s": fused / 3,
              "sdpa_backward_s": 2 * fused / 3, "rounds": 5, "shape": [8, 12, 1024, 64], "dtype": "bf16"}
    iv = None
    if ratio is not None:
        a, b, iv = _rounds(ratio, hand)
        timing.update(sdpa_forward_s=hand * ratio / 3, sdpa_backward_s=2 * hand * ratio / 3, rounds=iv.n,
                      interval=iv.as_dict(), round_seconds={"by_hand": a, "sdpa": b})
    return {"attention": {"by_hand": calls, "sdpa": [], "layers": 12, "timed_layers": 12, "timing": timing}}, iv


def test_attention_real_effect_claims_the_saving_with_its_interval(profile_factory):
    kernels, iv = _attention(0.5)
    ctx = _ctx(profile_factory, kernels=kernels)
    (f,) = compute.attention_by_hand(ctx)
    _claims_the_interval(f, iv, 6e-3 * 48, 0.5)  # the by-hand time: 6 ms × 12 layers × 4 micro-steps
    assert f.claims["backward"] == pytest.approx(2 * f.claims["forward"])  # where the gain was
    assert "the medians of 12 paired rounds" in f.because and "is_causal=True" in f.fix
    _bounded(ctx)


def test_attention_no_effect_is_within_noise(profile_factory):
    kernels, iv = _attention(1.0)
    (f,) = compute.attention_by_hand(_ctx(profile_factory, kernels=kernels))
    _within_noise(f)
    assert "100.7M values per layer" in f.note and "scaled_dot_product_attention" in f.fix


def test_attention_old_profile_gives_the_point_figure(profile_factory):
    kernels, _ = _attention()
    (f,) = compute.attention_by_hand(_ctx(profile_factory, kernels=kernels))
    _point_figure(f, 3e-3 * 48)


# ------------------------------------------------------------------ attention-need-weights
def _mha(ratio=None, point=(0.1, 0.08)):
    """The whole model's forward+backward (per micro-step) as it runs and with need_weights=False."""
    calls = [{"module": "enc.layers.0.self_attn", "shape": [8, 4, 64, 16], "dtype": "fp32", "masked": False,
              "causal": None, "dropout_p": 0.0, "torch_module": "nn.MultiheadAttention", "need_weights": True,
              "call_site": "train.py:42"}]
    hand, fused = point
    timing = {"by_hand_forward_s": hand / 3, "by_hand_backward_s": 2 * hand / 3, "sdpa_forward_s": fused / 3,
              "sdpa_backward_s": 2 * fused / 3, "rounds": 5, "modules": 1, "per": "model"}
    iv = None
    if ratio is not None:
        a, b, iv = _rounds(ratio, hand)
        timing.update(sdpa_forward_s=hand * ratio / 3, sdpa_backward_s=2 * hand * ratio / 3, rounds=iv.n,
                      interval=iv.as_dict(), round_seconds={"by_hand": a, "sdpa": b})
    return {"attention": {"by_hand": calls, "sdpa": [], "layers": 1, "mha_timing": timing}}, iv


def test_need_weights_real_effect_no_effect_and_old_profile(profile_factory):
    kernels, iv = _mha(0.7)
    (f,) = compute.attention_need_weights(_ctx(profile_factory, kernels=kernels))
    _claims_the_interval(f, iv, 0.1 * 4, 0.7)  # the model's 100 ms × 4 micro-steps
    assert "need_weights=False" in f.fix and "train.py:42" in f.fix
    kernels, iv = _mha(1.0)
    (f,) = compute.attention_need_weights(_ctx(profile_factory, kernels=kernels))
    _within_noise(f)
    kernels, _ = _mha()
    (f,) = compute.attention_need_weights(_ctx(profile_factory, kernels=kernels))
    _point_figure(f, 0.02 * 4)


# ------------------------------------------------------------------ vocab-not-padded
def _vocab(ratio=None, point=(0.05, 0.03)):
    t_v, t_pad = point
    timing = {"vocab_s": t_v, "padded_s": t_pad, "tokens": 8192, "rounds": 4}
    iv = None
    if ratio is not None:
        a, b, iv = _rounds(ratio, t_v)
        timing.update(padded_s=t_v * ratio, rounds=iv.n, interval=iv.as_dict(), round_seconds={"vocab": a, "padded": b})
    return {"vocab": {"vocab": 50257, "width": 768, "module": "lm_head", "multiple": 64, "padded_vocab": 50304,
                      "timing": timing}}, iv


def test_vocab_real_effect_claims_the_saving_with_its_interval(profile_factory):
    kernels, iv = _vocab(0.6)
    ctx = _ctx(profile_factory, kernels=kernels)
    (f,) = compute.vocab_not_padded(ctx)
    _claims_the_interval(f, iv, 0.05 * 4, 0.6)
    assert f.config_overrides == {"vocab_size": 50304}
    _bounded(ctx)


def test_vocab_no_effect_is_within_noise_and_a_supported_loss_is_no_finding(profile_factory):
    kernels, _ = _vocab(1.0)
    (f,) = compute.vocab_not_padded(_ctx(profile_factory, kernels=kernels))
    _within_noise(f)
    assert "vocab_size = 50304" in f.fix  # named, not applied
    kernels, iv = _vocab(1.3)
    assert iv.low > 1 and compute.vocab_not_padded(_ctx(profile_factory, kernels=kernels)) == []


def test_vocab_old_profile_gives_the_point_figure(profile_factory):
    kernels, _ = _vocab()
    (f,) = compute.vocab_not_padded(_ctx(profile_factory, kernels=kernels))
    _point_figure(f, 0.02 * 4)
    assert f.config_overrides == {"vocab_size": 50304}


# ------------------------------------------------------------------ optimizer-not-fused / optimizer-slow
def _opt(ratio=None, point=(0.08, 0.02)):
    cur, fused = point
    timing = {"current_s": cur, "fused_s": fused, "parameters": 124_000_000, "rounds": 3}
    iv = None
    if ratio is not None:
        a, b, iv = _rounds(ratio, cur)
        timing.update(fused_s=cur * ratio, rounds=iv.n, interval=iv.as_dict(), round_seconds={"current": a, "fused": b})
    return {"optimizer": {"class": "AdamW", "mode": "for-loop", "timing": timing}}, iv


def test_optimizer_real_effect_claims_the_saving_with_its_interval(profile_factory):
    kernels, iv = _opt(0.25)
    ctx = _ctx(profile_factory, kernels=kernels)
    (f,) = compute.optimizer_not_fused(ctx)
    _claims_the_interval(f, iv, 0.08, 0.25)  # the copy's 80 ms step (within the run's 100 ms phase)
    assert f.claims == {"optimizer": f.saving_s} and f.fix == "torch.optim.AdamW(..., fused=True)"
    _bounded(ctx)
    (f,) = gpu.optimizer_slow(_ctx(profile_factory, device="cuda", kernels=kernels))  # carried on CUDA
    _claims_the_interval(f, iv, 0.08, 0.25)


def test_optimizer_no_effect_is_within_noise(profile_factory):
    kernels, _ = _opt(1.0)
    (f,) = compute.optimizer_not_fused(_ctx(profile_factory, kernels=kernels))
    _within_noise(f)
    (f,) = gpu.optimizer_slow(_ctx(profile_factory, device="cuda", kernels=kernels))
    _within_noise(f)
    assert "measured no faster" not in f.fix  # undecided, not shown slower


def test_optimizer_old_profile_gives_the_point_figure(profile_factory):
    kernels, _ = _opt()
    (f,) = compute.optimizer_not_fused(_ctx(profile_factory, kernels=kernels))
    _point_figure(f, 0.06)


# ------------------------------------------------------------------ compile-missing
def _compiled(ratio=None, point=(0.20, 0.12)):
    eager, comp = point
    c = {"eager_s": eager, "compiled_s": comp, "compile_s": 42.0, "rounds": 3, "backend": "inductor"}
    iv = None
    if ratio is not None:
        a, b, iv = _rounds(ratio, eager)
        c.update(compiled_s=eager * ratio, rounds=iv.n, interval=iv.as_dict(), round_seconds={"eager": a, "compiled": b})
    return c, iv


def _compile_finding(profile_factory, c):
    (f,) = [x for x in gpu.compile_findings(_ctx(profile_factory, device="cuda", compile=c)) if x.id == "compile-missing"]
    return f


def test_compile_real_effect_claims_the_saving_with_its_interval(profile_factory):
    c, iv = _compiled(0.6)
    f = _compile_finding(profile_factory, c)
    _claims_the_interval(f, iv, 0.9, 0.6)  # the run's forward+backward
    assert f.config_overrides == {"compile": True} and "compiling took 42.00 s once" in f.note
    _bounded(_ctx(profile_factory, device="cuda", compile=c))


def test_compile_no_effect_is_within_noise(profile_factory):
    c, _ = _compiled(1.0)
    f = _compile_finding(profile_factory, c)
    _within_noise(f)
    assert "compiling took 42.00 s once" in f.note


def test_compile_old_profile_gives_the_point_figure(profile_factory):
    c, _ = _compiled()
    _point_figure(_compile_finding(profile_factory, c), 0.9 * 0.4)
