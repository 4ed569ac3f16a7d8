"""attention-by-hand, attention-backend, vocab-not-padded and optimizer-not-fused (and
optimizer-slow carrying the fused timing) on synthetic profiles: chosen numbers, checked
arithmetic; every profile's analysis passes the physical-bounds checker."""

import pytest

from gpuprof.analysis.bounds import violations
from gpuprof.analysis.findings import Context
from gpuprof.analysis.pipeline import analyze
from gpuprof.analysis.rules import compute, gpu

PHASES = {"forward": 0.3, "backward": 0.6, "optimizer": 0.1}  # a 1.0 s step of 4 micro-steps


def _hand(n=12, shape=(8, 12, 1024, 64), dropout=0.0):
    return [{"module": f"transformer.h.{i}.attn", "shape": list(shape), "dtype": "bf16", "masked": True,
             "causal": True, "dropout_p": dropout} for i in range(n)]


def _ctx(profile_factory, kernels, device="cpu", phases=PHASES, mode="builtin"):
    p = profile_factory(dict(phases), device=device, measurements={"kernels": kernels}, micro_steps=4)
    p.run["mode"] = mode
    return Context(profile=p, stats=p.stats)


def _attention(fwd=(2e-3, 1e-3), bwd=(4e-3, 2e-3), **kw):
    return {"attention": {"by_hand": _hand(**kw), "sdpa": [], "layers": 12, "timed_layers": 12,
                          "timing": {"by_hand_forward_s": fwd[0], "sdpa_forward_s": fwd[1],
                                     "by_hand_backward_s": bwd[0], "sdpa_backward_s": bwd[1], "rounds": 5}}}


def _bounded(ctx):
    analysis = analyze(ctx.profile)
    assert violations(ctx.profile, analysis) == []
    return analysis


def test_attention_by_hand_saves_the_timed_difference_times_layers_and_micro_steps(profile_factory):
    ctx = _ctx(profile_factory, _attention())
    (f,) = compute.attention_by_hand(ctx)
    # (2-1 ms forward + 4-2 ms backward) per layer x 12 layers x 4 micro-steps
    assert f.saving_s == pytest.approx(0.003 * 48) and f.kind == "fix"
    assert f.claims == pytest.approx({"forward": 0.001 * 48, "backward": 0.002 * 48})
    assert "is_causal=True" in f.fix and "transformer.h.0.attn and 11 more" in f.fix and "dropout_p" not in f.fix
    assert "12 attention layers" in f.because and "× 12 layers × 4 micro-steps" in f.because
    assert "100.7M values per layer" in f.note  # 8 x 12 x 1024^2: the matrix SDPA never stores
    assert f.id in [x.id for x in _bounded(ctx).findings]


def test_attention_saving_is_capped_by_the_phases_it_comes_out_of(profile_factory):
    ctx = _ctx(profile_factory, _attention(fwd=(20e-3, 1e-3), bwd=(40e-3, 2e-3)))
    (f,) = compute.attention_by_hand(ctx)
    # the by-hand time (60 ms x 48) capped by the phases (0.3 + 0.6 s), × (1 - SDPA's 0.05 of it)
    assert f.claims["forward"] == pytest.approx(0.9 * 0.95 / 3) and f.claims["backward"] == pytest.approx(0.57)
    assert f.saving_s == pytest.approx(0.9 * 0.95) and "(capped by the run's phases)" in f.because
    assert f.confidence == "low" and "interval not measured" in f.note  # a profile before paired rounds
    _bounded(ctx)


def test_a_small_attention_difference_is_information_without_a_saving(profile_factory):
    ctx = _ctx(profile_factory, _attention(fwd=(1.05e-4, 1e-4), bwd=(2e-4, 2e-4), dropout=0.1))
    (f,) = compute.attention_by_hand(ctx)
    assert f.kind == "info" and f.saving_s is None and not f.claims
    assert "under 5%" in f.note and "dropout_p=self.dropout if self.training else 0.0" in f.fix
    ctx = _ctx(profile_factory, _attention(fwd=(1e-4, 2e-4), bwd=(2e-4, 3e-4)))
    (f,) = compute.attention_by_hand(ctx)
    assert f.kind == "info" and "SDPA was not faster here" in f.note


def test_attention_not_timed_still_names_the_fix_and_why(profile_factory):
    k = _attention()
    k["attention"]["timing"] = {"not_measured": "one round takes 3.00 s; 1.00 s would not hold 2 timed rounds"}
    (f,) = compute.attention_by_hand(_ctx(profile_factory, k))
    assert f.saving_s is None and f.note.startswith("not estimated: one round takes 3.00 s")


def test_sdpa_already_used_gives_no_attention_finding_and_the_backend_only_on_a_gpu(profile_factory):
    call = {"module": "h.0.attn", "shape": [8, 12, 1024, 64], "dtype": "fp32", "is_causal": True,
            "backend": "memory-efficient", "refused": ["Expected query dtype to be fp16 or bf16, got float32"]}
    k = {"attention": {"by_hand": [], "sdpa": [call]}}
    assert compute.attention_by_hand(_ctx(profile_factory, k)) == []
    assert compute.attention_backend(_ctx(profile_factory, k)) == []  # CPU: not a finding
    (f,) = compute.attention_backend(_ctx(profile_factory, k, device="cuda"))
    assert f.kind == "info" and "memory-efficient" in f.title and "fp16 or bf16" in f.because
    flash = {"attention": {"by_hand": [], "sdpa": [{**call, "backend": "flash", "refused": []}]}}
    assert compute.attention_backend(_ctx(profile_factory, flash, device="cuda")) == []


def _vocab(v=50257, t_v=0.05, t_pad=0.03):
    return {"vocab": {"vocab": v, "width": 768, "module": "lm_head", "multiple": 64, "padded_vocab": -(-v // 64) * 64,
                      "timing": {"vocab_s": t_v, "padded_s": t_pad, "tokens": 8192, "rounds": 4}}}


def test_vocab_padding_that_helps_is_a_fix_with_the_config_change(profile_factory):
    ctx = _ctx(profile_factory, _vocab())
    (f,) = compute.vocab_not_padded(ctx)
    assert f.saving_s == pytest.approx(0.02 * 4) and f.config_overrides == {"vocab_size": 50304}
    assert f.claims == pytest.approx({"forward": 0.08 / 3, "backward": 0.16 / 3})
    assert "vocab_size = 50304" in f.fix and "47 extra logits" in f.fix
    _bounded(ctx)
    script = _ctx(profile_factory, _vocab(), mode="script")
    assert compute.vocab_not_padded(script)[0].config_overrides == {}


def test_vocab_padding_that_does_not_help_or_is_already_padded_gives_no_finding(profile_factory):
    assert compute.vocab_not_padded(_ctx(profile_factory, _vocab(t_v=0.03, t_pad=0.031))) == []
    assert compute.vocab_not_padded(_ctx(profile_factory, _vocab(v=50304))) == []
    (f,) = compute.vocab_not_padded(_ctx(profile_factory, _vocab(t_v=0.0101, t_pad=0.0100)))
    assert f.kind == "info" and f.saving_s is None and "under 5%" in f.note


def _opt(mode="for-loop", cur=0.08, fused=0.02):
    return {"optimizer": {"class": "AdamW", "mode": mode,
                          "timing": {"current_s": cur, "fused_s": fused, "parameters": 124_000_000, "rounds": 3}}}


def test_an_unfused_optimizer_saves_the_timed_difference_capped_by_its_phase(profile_factory):
    ctx = _ctx(profile_factory, _opt())
    (f,) = compute.optimizer_not_fused(ctx)
    assert f.saving_s == pytest.approx(0.06) and f.claims == {"optimizer": pytest.approx(0.06)}
    assert f.fix == "torch.optim.AdamW(..., fused=True)" and "for-loop" in f.title
    (f,) = compute.optimizer_not_fused(_ctx(profile_factory, _opt(cur=0.5)))
    assert f.saving_s == pytest.approx(0.1 * (1 - 0.02 / 0.5))  # the ratio on at most the run's 0.1 s phase
    assert compute.optimizer_not_fused(_ctx(profile_factory, _opt(mode="fused"))) == []
    assert compute.optimizer_not_fused(_ctx(profile_factory, _opt(cur=0.02, fused=0.03))) == []
    _bounded(ctx)


def test_on_a_gpu_optimizer_slow_carries_the_fused_timing(profile_factory):
    ctx = _ctx(profile_factory, _opt(), device="cuda")
    assert compute.optimizer_not_fused(ctx) == []  # 10% of the step: optimizer-slow's finding
    (f,) = gpu.optimizer_slow(ctx)
    assert f.saving_s == pytest.approx(0.06) and f.evidence["fused_step_s"] == 0.02
    assert "with fused=True" in f.because and "estimate: one step of a copy" in f.note


def test_a_scripts_optimizer_saving_is_the_copys_difference_too(profile_factory):
    (f,) = compute.optimizer_not_fused(_ctx(profile_factory, _opt(cur=0.08, fused=0.02), mode="script"))
    assert f.saving_s == pytest.approx(0.06) and "the run's optimizer phase is 100 ms per step" in f.because


def _compiled(profile_factory, eager, comp, compile_s=42.0, device="cuda", compiled=False):
    p = profile_factory(dict(PHASES), device=device, micro_steps=4, config={"compile": compiled},
                        measurements={"compile": {"eager_s": eager, "compiled_s": comp, "compile_s": compile_s,
                                                  "rounds": 3}})
    return Context(profile=p, stats=p.stats)


def test_compile_missing_measured_applies_the_ratio_to_the_runs_forward_backward(profile_factory):
    ctx = _compiled(profile_factory, 0.20, 0.12)
    (f,) = [x for x in gpu.compile_findings(ctx) if x.id == "compile-missing"]
    assert f.saving_s == pytest.approx(0.9 * 0.4) and f.kind == "fix"  # forward+backward 0.9 s x (1 - 0.6)
    assert f.claims == pytest.approx({"forward": 0.12, "backward": 0.24})
    assert "compiling took 42.00 s once" in f.note and f.config_overrides == {"compile": True}
    _bounded(ctx)


def test_compile_missing_not_faster_or_not_measured(profile_factory):
    (f,) = [x for x in gpu.compile_findings(_compiled(profile_factory, 0.20, 0.21, device="cpu"))
            if x.id == "compile-missing"]
    assert f.kind == "info" and f.saving_s is None and "not faster" in f.note
    p = profile_factory(dict(PHASES), device="cuda", config={"compile": False},
                        measurements={"compile": {"not_measured": "compile failed: BackendCompilerFailed: no gcc"}})
    (f,) = [x for x in gpu.compile_findings(Context(profile=p, stats=p.stats)) if x.id == "compile-missing"]
    assert f.saving_s is None and "compile failed: BackendCompilerFailed" in f.note and "--measure-compile" in f.note


def test_optimizer_slow_believes_a_timing_that_says_fused_is_not_faster(profile_factory):
    (f,) = gpu.optimizer_slow(_ctx(profile_factory, _opt(cur=0.02, fused=0.021), device="cuda"))
    assert f.saving_s is None and "not faster" in f.note and "fused=True measured no faster" in f.fix
