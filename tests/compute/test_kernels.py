"""The compute fixes' measurements (measure/optrace.py, measure/kernels.py) on real tiny modules:
attention by hand seen with its module, shape, mask and dropout; SDPA calls with the kernel torch
ran; the vocabulary head; the optimizer's mode; each pair timed without touching the user's
model or optimizer; the timing loop's rounds counted on an injected clock."""

import math
import types

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpuprof.measure import fused_optimizer, kernels, pairs
from gpuprof.measure.flops import count_flops
from gpuprof.measure.optrace import OpTrace


class HandAttention(nn.Module):
    """minGPT's CausalSelfAttention: q·kᵀ, scale, masked_fill with a tril buffer, softmax, dropout, ·v."""

    def __init__(self, c=32, h=4, t=16, dropout=0.1, sdpa=False, mask="tril"):
        super().__init__()
        self.c_attn, self.c_proj, self.h, self.sdpa, self.mask = nn.Linear(c, 3 * c), nn.Linear(c, c), h, sdpa, mask
        self.attn_dropout = nn.Dropout(dropout)
        self.dropout = dropout
        self.register_buffer("bias", torch.tril(torch.ones(t, t)).view(1, 1, t, t))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in self.c_attn(x).split(c, dim=2))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            if self.mask == "tril":
                att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
            elif self.mask == "padding":  # a key-padding mask: not causal
                keep = torch.ones(t, t, dtype=torch.bool)
                keep[:, -2:] = False
                att = att.masked_fill(~keep, float("-inf"))
            att = self.attn_dropout(F.softmax(att, dim=-1))
            y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class TinyGPT(nn.Module):
    def __init__(self, vocab=100, c=32, layers=2, **attn):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.h = nn.ModuleList([HandAttention(c=c, **attn) for _ in range(layers)])
        self.lm_head = nn.Linear(c, vocab, bias=False)

    def forward(self, idx, targets=None):
        x = self.wte(idx)
        for layer in self.h:
            x = x + layer(x)
        logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def _trace(model, *args, autocast=None):
    trace = OpTrace(model)
    count_flops(model, args, autocast_dtype=autocast, extra_modes=(trace,), counter=False)
    return trace.summary()


def _ids(b=2, t=16, vocab=100):
    return torch.randint(0, vocab, (b, t)), torch.randint(0, vocab, (b, t))


@pytest.mark.parametrize("autocast,dtype", [(None, "fp32"), (torch.bfloat16, "bf16")])
def test_attention_by_hand_is_seen_with_its_module_shape_mask_and_dropout(autocast, dtype):
    model = TinyGPT()
    s = _trace(model, *_ids(), autocast=autocast)
    assert s["sdpa"] == []
    assert [c["module"] for c in s["by_hand"]] == ["h.0", "h.1"]
    for c in s["by_hand"]:
        assert c["shape"] == [2, 4, 16, 8] and c["dtype"] == dtype
        assert c["masked"] is True and c["causal"] is True and c["dropout_p"] == pytest.approx(0.1)


def test_a_padding_mask_is_not_taken_for_causal_and_eval_has_no_dropout():
    model = TinyGPT(mask="padding").eval()
    (c, _) = _trace(model, *_ids())["by_hand"]
    assert c["masked"] is True and c["causal"] is False and c["dropout_p"] == 0.0


def test_sdpa_calls_are_seen_with_the_kernel_torch_ran():
    model = TinyGPT(sdpa=True, dropout=0.0)
    s = _trace(model, *_ids())
    assert s["by_hand"] == []
    assert [c["module"] for c in s["sdpa"]] == ["h.0", "h.1"]
    c = s["sdpa"][0]
    assert c["shape"] == [2, 4, 16, 8] and c["is_causal"] is True and c["mask"] is False
    assert c["backend"] == "flash (CPU)"  # torch 2.x's CPU flash kernel for fp32 without dropout


def test_the_trace_changes_neither_the_flop_count_nor_the_output():
    model = TinyGPT(dropout=0.0)
    args = _ids()
    plain = count_flops(model, args)
    trace = OpTrace(model)
    traced = count_flops(model, args, extra_modes=(trace,))
    assert traced["forward"] == plain["forward"] > 0
    assert len(trace.summary()["by_hand"]) == 2


class Ticks:
    """An injected clock: `now` advances only when told; spans() returns set seconds."""

    def __init__(self, spans):
        self.t, self.spans_given, self.calls = 0.0, list(spans), 0

    def now(self):
        return self.t

    def sync(self):
        pass

    def spans(self, *fns):
        self.calls += 1
        out = self.spans_given[min(self.calls - 1, len(self.spans_given) - 1)]
        self.t += sum(out)
        return list(out)


def test_alternate_stops_when_the_bests_settle_and_keeps_the_minimum():
    clock = Ticks([[1.0], [1.0]] + [[0.5], [0.8]] * 20)  # 2 warm-ups, then steady rounds
    res = pairs.alternate(clock, {"a": [None], "b": [None]}, seconds=100.0, now=clock.now)
    assert res["best"] == {"a": [0.5], "b": [0.8]}
    assert res["rounds"] == pairs.MIN_REPS  # round 2 and 3 improved nothing: settled
    assert clock.calls == 2 + 2 * pairs.MIN_REPS


def test_alternate_refuses_when_the_warm_up_leaves_no_room():
    clock = Ticks([[1.0], [1.0]])
    with pytest.raises(TimeoutError):
        pairs.alternate(clock, {"a": [None], "b": [None]}, seconds=5.0, now=clock.now)
    assert clock.calls == 2  # the warm-ups only


def test_attention_timing_times_both_ways_forward_and_backward():
    res = kernels.time_attention("cpu", [1, 2, 32, 8], "fp32", causal=True, masked=True, dropout_p=0.0, seconds=1.0,
                                 layers=3)
    for k in ("by_hand_forward_s", "by_hand_backward_s", "sdpa_forward_s", "sdpa_backward_s"):
        assert 0 < res[k] < 1.0
    assert res["rounds"] >= 2 and res["causal"] is True and res["layers_timed"] == 3


def test_vocab_head_is_found_and_padded_to_64():
    assert kernels.output_head(TinyGPT(vocab=50257)) == {"vocab": 50257, "width": 32, "module": "lm_head"}
    assert kernels.padded(50257) == 50304 and kernels.padded(65) == 128 and kernels.padded(50304) == 50304
    assert kernels.output_head(nn.Sequential(nn.Linear(4, 4))) is None


@pytest.mark.parametrize("kw,mode", [({"fused": True}, "fused"), ({"foreach": True}, "foreach"),
                                     ({"foreach": False}, "for-loop"), ({}, "for-loop")])
def test_optimizer_mode_is_how_step_runs(kw, mode):
    opt = torch.optim.AdamW(nn.Linear(4, 4).parameters(), **kw)
    assert fused_optimizer.optimizer_mode(opt) == mode  # CPU parameters: torch's default is the for-loop
    assert fused_optimizer.optimizer_mode(torch.optim.SGD(nn.Linear(4, 4).parameters(), lr=0.1)) is None


def _ctx(model, optimizer, args):
    stats = types.SimpleNamespace(seconds=lambda phase: 0.01, micro_steps=1)
    return types.SimpleNamespace(model=model, optimizer=optimizer, example_args=args, example_kwargs={},
                                 device="cpu", autocast_dtype=None, precision={"compute_dtype": "fp32"},
                                 profile=types.SimpleNamespace(stats=stats), op_trace=None, budget=None)


def test_the_probe_times_each_fix_and_leaves_the_users_model_and_optimizer_alone():
    torch.manual_seed(0)
    model = TinyGPT(vocab=100, dropout=0.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = _ids()
    model(x, y)[1].backward()
    opt.step()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    state = {k: {n: t.clone() for n, t in v.items()} for k, v in opt.state.items()}
    rng = torch.get_rng_state()
    out = kernels.ComputeFixesProbe(seconds=3.0).stop(_ctx(model, opt, (x, y)))
    att, vocab, o = out["attention"], out["vocab"], out["optimizer"]
    assert att["layers"] == 2 and att["timing"]["by_hand_forward_s"] > 0 and att["timing"]["sdpa_forward_s"] > 0
    assert vocab["vocab"] == 100 and vocab["padded_vocab"] == 128
    assert vocab["timing"]["vocab_s"] > 0 and vocab["timing"]["padded_s"] > 0 and vocab["timing"]["tokens"] == 32
    assert o["mode"] == "for-loop" and o["timing"]["current_s"] > 0 and o["timing"]["fused_s"] > 0
    assert o["timing"]["parameters"] == sum(p.numel() for p in model.parameters())
    assert all(torch.equal(before[n], p) and torch.equal(grads[n], p.grad) for n, p in model.named_parameters())
    assert all(torch.equal(state[k][n], t) for k, v in opt.state.items() for n, t in v.items())
    assert torch.equal(torch.get_rng_state(), rng)  # the trace's forward restored the RNG


def test_a_fused_optimizer_a_padded_vocab_and_sdpa_are_not_timed():
    model = TinyGPT(vocab=128, sdpa=True, dropout=0.0)
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    out = kernels.ComputeFixesProbe(seconds=3.0).stop(_ctx(model, opt, _ids(vocab=128)))
    assert out["attention"]["by_hand"] == [] and "timing" not in out["attention"]
    assert out["vocab"]["padded_vocab"] == 128 and "timing" not in out["vocab"]
    assert out["optimizer"] == {"class": "AdamW", "mode": "fused"}


def test_no_time_left_skips_the_timings_and_says_so():
    from gpuprof.measure.budget import PostRunBudget

    model = TinyGPT(vocab=100)
    ctx = _ctx(model, torch.optim.AdamW(model.parameters()), _ids())
    ctx.budget = PostRunBudget(0.0)
    out = kernels.ComputeFixesProbe().stop(ctx)
    assert "does not fit" in out["attention"]["not_measured"] or "no time left" in str(out["attention"])
    assert "no time left" in out["vocab"]["timing"]["not_measured"]
    assert "not_measured" in out["optimizer"]["timing"]
    assert set(ctx.budget.parts["kernels"]["skipped"]) >= {"vocabulary timed padded", "optimizer timed fused"}


def test_on_cuda_the_pairs_are_timed_with_events_on_the_measured_devices_stream(fake_cuda):
    """pairs.Clock on a (fake, strict) GPU: each part is the GPU time between its events on the device's
    current stream, read only after the last event completed; cuda:1 never touches cuda:0."""
    gpu = fake_cuda  # one device
    clock = pairs.Clock("cuda:0")
    work = {"hand": 0.003, "sdpa": 0.001}
    parts = {name: [lambda s=s: gpu.enqueue(s)] for name, s in work.items()}
    res = pairs.alternate(clock, parts, seconds=10.0)
    assert res["best"]["hand"] == [pytest.approx(0.003)] and res["best"]["sdpa"] == [pytest.approx(0.001)]
    records = [c for c in gpu.calls if c[0] == "Event.record"]
    assert records and all(c[1:] == (0, 0) for c in records)  # cuda:0's current stream


def test_torchs_own_flash_checker_is_called_with_this_torchs_signature():
    from gpuprof.measure.optrace import flash_refusals

    q = torch.randn(2, 4, 16, 8)
    assert flash_refusals(q, q, q, None, 0.0, True)  # CPU tensors: refused (reasons are CUDA's to give)


class Variants(nn.Module):
    """Attention written the other ways users write it."""

    def __init__(self, kind, t=16, d=16):
        super().__init__()
        self.kind, self.t, self.d = kind, t, d

    def forward(self, q):  # q: (B, H, T, D); k = v = q
        b, h, t, d = q.shape
        if self.kind == "einsum":
            att = torch.einsum("bhtd,bhsd->bhts", q, q) / math.sqrt(d)
            return torch.einsum("bhts,bhsd->bhtd", F.softmax(att, dim=-1), q)
        if self.kind == "hf-additive":  # HF eager attention: a finfo.min additive causal mask
            mask = torch.full((t, t), torch.finfo(q.dtype).min).triu(1)
            return F.softmax(q @ q.transpose(-2, -1) + mask, dim=-1) @ q
        if self.kind == "gqa5d":  # (B, H_kv, group, T, D) against (B, H_kv, 1, T, D)
            qq = q.view(b, 2, h // 2, t, d)
            kv = q[:, :2].unsqueeze(2)
            return F.softmax(qq @ kv.transpose(-2, -1), dim=-1) @ kv
        if self.kind == "sdpa-keywords":
            return F.scaled_dot_product_attention(q, key=q, value=q, is_causal=True)
        raise ValueError(self.kind)


@pytest.mark.parametrize("kind,shape,causal", [("einsum", [2, 4, 16, 16], None), ("hf-additive", [2, 4, 16, 16], True),
                                               ("gqa5d", [2, 4, 16, 16], None)])
def test_attention_by_hand_written_other_ways_is_sized_right(kind, shape, causal):
    """T equal to the head dim (16 and 16: the ·v product is square too), einsum's permutes, HF's
    finfo.min mask, GQA's 5-D grouping (every query head counts)."""
    s = _trace(Variants(kind), torch.randn(2, 4, 16, 16))
    assert [c["shape"] for c in s["by_hand"]] == [shape]
    assert s["by_hand"][0]["causal"] is causal


def test_sdpa_called_with_keywords_is_read_and_never_fails_the_count():
    s = _trace(Variants("sdpa-keywords"), torch.randn(2, 4, 16, 8))
    assert s["sdpa"][0]["shape"] == [2, 4, 16, 8] and s["sdpa"][0]["kv_shape"] == [2, 4, 16, 8] and "error" not in s


def test_the_optimizer_is_not_copied_when_memory_would_not_hold_two_copies(monkeypatch):
    model = TinyGPT(vocab=100)
    monkeypatch.setattr(fused_optimizer, "optimizer_memory", lambda opt: (10 * 2**30, 4 * 2**30))
    out = kernels.ComputeFixesProbe(seconds=2.0).stop(_ctx(model, torch.optim.AdamW(model.parameters()), _ids()))
    assert out["optimizer"]["timing"]["not_measured"].startswith("two copies of the parameters with their state need")
