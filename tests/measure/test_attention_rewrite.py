"""The user's attention by hand computed through SDPA inside the model, for the post-run timing
(gpuprof/measure/attention_rewrite.py; issue #41): the shapes users write (nanoGPT's masked_fill on
a registered tril buffer, Llama's additive mask and fp32 softmax, HF GPT-2's torch.where with the
dtype's lowest value, a padding mask, a 3-d bmm), each giving the by-hand loss and gradients;
anything else refused so the caller times the layers alone."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpuprof.measure.attention_rewrite import SdpaRewrite, Unrewritable

B, T, C, H = 2, 16, 32, 4
D = C // H


class Attn(nn.Module):
    def __init__(self, style: str, dropout: float = 0.0):
        super().__init__()
        self.style = style
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.drop = nn.Dropout(dropout)
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
        self.pad = None  # (B, T) bool, True where a token is padding
        self.seen = None

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (z.view(b, t, H, D).transpose(1, 2) for z in (q, k, v))
        s = self.style
        if s == "nanogpt":
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
            att = self.drop(F.softmax(att, dim=-1))
            y = att @ v
        elif s == "llama":
            scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(D)
            mask = torch.full((t, t), float("-inf")).triu(1)
            scores = scores + mask
            scores = F.softmax(scores.float(), dim=-1).type_as(q)
            y = torch.matmul(scores, v)
        elif s == "hf":
            w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], D ** 0.5)
            causal = self.bias[:, :, :t, :t].bool()
            w = torch.where(causal, w, torch.tensor(torch.finfo(w.dtype).min))
            w = nn.functional.softmax(w, dim=-1)
            y = torch.matmul(self.drop(w), v)
        elif s == "padding":
            att = (q @ k.transpose(-2, -1)) * D ** -0.5
            att = att.masked_fill(self.pad[:, None, None, :], float("-inf"))
            y = att.softmax(dim=-1) @ v
        elif s == "bmm":
            q3, k3, v3 = (z.reshape(b * H, t, D) for z in (q, k, v))
            att = torch.bmm(q3 * D ** -0.5, k3.transpose(1, 2))
            att = att.masked_fill(self.bias[0, :, :t, :t] == 0, float("-inf"))
            y = torch.bmm(torch.softmax(att, dim=-1), v3).view(b, H, t, D)
        elif s == "keeps-weights":  # the weights used after · v: cannot be rewritten
            att = (q @ k.transpose(-2, -1)) * D ** -0.5
            att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")).softmax(dim=-1)
            y = att @ v
            self.seen = att.mean()
        elif s == "post-softmax-scale":  # an op the rewrite does not know
            att = F.softmax(q @ k.transpose(-2, -1), dim=-1) * 0.5
            y = att @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Model(nn.Module):
    def __init__(self, style: str, layers: int = 2, dropout: float = 0.0):
        super().__init__()
        self.emb = nn.Embedding(64, C)
        self.blocks = nn.ModuleList([Attn(style, dropout) for _ in range(layers)])
        self.head = nn.Linear(C, 64)

    def forward(self, idx, targets):
        x = self.emb(idx)
        for blk in self.blocks:
            x = x + blk(x)
        return F.cross_entropy(self.head(x).view(-1, 64), targets.view(-1))


SHAPES = {(B * H, T, D)}


def _inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 64, (B, T), generator=g), torch.randint(0, 64, (B, T), generator=g)


def _loss_and_grads(model, rewrite: bool):
    model.zero_grad(set_to_none=True)
    idx, tgt = _inputs()
    mode = SdpaRewrite(SHAPES) if rewrite else None
    if mode is None:
        loss = model(idx, tgt)
    else:
        with mode:
            loss = model(idx, tgt)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return loss.item(), grads, (mode.rewritten if mode else 0)


@pytest.mark.parametrize("style", ["nanogpt", "llama", "hf", "padding", "bmm"])
def test_the_rewrite_gives_the_by_hand_loss_and_gradients(style):
    torch.manual_seed(0)
    model = Model(style)
    if style == "padding":
        pad = torch.zeros(B, T, dtype=torch.bool)
        pad[0, -3:] = True
        for blk in model.blocks:
            blk.pad = pad
    a, ga, _ = _loss_and_grads(model, False)
    b, gb, n = _loss_and_grads(model, True)
    assert n == 2  # both layers ran through SDPA
    assert b == pytest.approx(a, rel=1e-5)
    for name in ga:
        assert torch.allclose(ga[name], gb[name], rtol=1e-4, atol=1e-6), name


def test_sdpa_is_called_causal_for_a_tril_mask_and_with_the_scale(monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    torch.manual_seed(0)
    model = Model("nanogpt", dropout=0.1)
    with SdpaRewrite(SHAPES):
        model(*_inputs())
    assert len(calls) == 2
    assert all(c["is_causal"] and c["attn_mask"] is None for c in calls)
    assert all(c["scale"] == pytest.approx(1 / math.sqrt(D)) for c in calls)
    assert all(c["dropout_p"] == pytest.approx(0.1) for c in calls)  # training: the module's p
    model.eval()
    calls.clear()
    with SdpaRewrite(SHAPES):
        model(*_inputs())
    assert all(c["dropout_p"] == 0.0 for c in calls)  # nn.Dropout in eval passes training=False


@pytest.mark.parametrize("style,why", [("keeps-weights", "used after"), ("post-softmax-scale", "on the attention")])
def test_other_uses_of_the_scores_are_refused(style, why):
    torch.manual_seed(0)
    model = Model(style)
    with pytest.raises(Unrewritable, match=why):
        with SdpaRewrite(SHAPES):
            model(*_inputs())
    # nothing is left switched on: torch runs as before
    assert not torch._C._is_torch_function_mode_enabled()
    assert isinstance(model(*_inputs()), torch.Tensor)


def test_other_matmuls_and_shapes_are_left_alone():
    x = torch.randn(B * H, T, D)
    w = torch.randn(D, D)
    with SdpaRewrite(SHAPES) as mode:
        y = x @ w  # (…, T, D) · (D, D): not scores
        z = torch.randn(3, 8, 8) @ torch.randn(3, 8, 8)  # square, but not a traced shape
    assert mode.rewritten == 0
    assert torch.allclose(y, torch.matmul(x, w))
    assert z.shape == (3, 8, 8)


def test_scores_never_multiplied_by_v_are_refused():
    q = torch.randn(B, H, T, D)
    with pytest.raises(Unrewritable, match="not multiplied by v"):
        with SdpaRewrite(SHAPES):
            _ = q @ q.transpose(-2, -1)


def _probe_ctx(model, args, micro_s: float):
    import types

    stats = types.SimpleNamespace(seconds=lambda phase: micro_s / 2, micro_steps=1)
    return types.SimpleNamespace(model=model, optimizer=None, example_args=args, example_kwargs={}, device="cpu",
                                 autocast_dtype=None, precision={"compute_dtype": "fp32"},
                                 profile=types.SimpleNamespace(stats=stats), op_trace=None, budget=None)


def test_the_probe_times_the_whole_model_and_leaves_its_gradients_and_buffers_alone():
    import json

    from gpuprof.measure import kernels

    torch.manual_seed(0)
    model = Model("nanogpt", dropout=0.1)
    args = _inputs()
    model(*args).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    out = kernels.ComputeFixesProbe(seconds=4.0).stop(_probe_ctx(model, args, micro_s=0.002))
    timing = out["attention"]["timing"]
    json.dumps(out)  # the profile is JSON: no tensor kept
    assert timing["per"] == "model" and timing["layers_rewritten"] == 2 and "model_not_timed" not in timing
    assert timing["rounds"] >= 2 and timing["by_hand_forward_s"] > 0 and timing["sdpa_backward_s"] > 0
    assert timing["check_loss"][0] == pytest.approx(timing["check_loss"][1], rel=1e-4)
    assert out["attention"]["timed_layers"] == 2
    assert all(torch.equal(grads[n], p.grad) for n, p in model.named_parameters())
    assert all(torch.equal(buffers[n], b) for n, b in model.named_buffers())
    assert model.training


def test_the_probe_falls_back_to_the_layers_alone_when_the_model_cannot_be_rewritten():
    from gpuprof.measure import kernels

    torch.manual_seed(0)
    model = Model("keeps-weights")
    out = kernels.ComputeFixesProbe(seconds=4.0).stop(_probe_ctx(model, _inputs(), micro_s=0.002))
    timing = out["attention"]["timing"]
    assert "used after" in timing["model_not_timed"]
    assert timing.get("per") is None and timing["by_hand_forward_s"] > 0  # the layers, alone



def test_the_benchmarks_switch_times_the_layers_alone(monkeypatch):
    from gpuprof.measure import kernels

    monkeypatch.setenv(kernels.LAYERS_ONLY_ENV, "1")
    torch.manual_seed(0)
    out = kernels.ComputeFixesProbe(seconds=4.0).stop(_probe_ctx(Model("nanogpt"), _inputs(), micro_s=0.002))
    timing = out["attention"]["timing"]
    assert timing.get("per") is None and kernels.LAYERS_ONLY_ENV in timing["model_not_timed"]
