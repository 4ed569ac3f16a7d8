"""Attention by hand switched to SDPA in the script's own loop (gpuprof/measure/attention_switch.py):
offered only after the model's loss through SDPA matched its own on the run's micro-batch, refused
with the reason otherwise; the check leaves the model, its gradients and the RNG as they were; in a
real script the experiment steps with it on compute the attention through SDPA, and the finding
says it was measured on the loop (the post-run timing then skipped)."""

import io
import math
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpuprof.analysis.bounds import violations
from gpuprof.measure.instruments import default_instruments
from gpuprof.measure.attention_switch import ID, SdpaSwitch, attention_switch
from gpuprof.measure.switches import Unavailable
from gpuprof.runners.script import run_script

MODEL = '''
class Attn(nn.Module):
    def __init__(self, c=16, h=2, t=16, returns_weights=False, sdpa=False):
        super().__init__()
        self.h, self.returns_weights, self.sdpa = h, returns_weights, sdpa
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.register_buffer("bias", torch.tril(torch.ones(t, t)).view(1, 1, t, t))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (z.view(B, T, self.h, C // self.h).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
            if self.returns_weights:
                self.last = att.mean()
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class GPT(nn.Module):
    def __init__(self, layers=2, **kw):
        super().__init__()
        self.wte = nn.Embedding(64, 16)
        self.blocks = nn.ModuleList(Attn(**kw) for _ in range(layers))
        self.head = nn.Linear(16, 64)

    def forward(self, idx, targets):
        x = self.wte(idx)
        for b in self.blocks:
            x = x + b(x)
        logits = self.head(x)
        return logits, F.cross_entropy(logits.view(-1, 64), targets.view(-1))
'''
exec(MODEL)  # noqa: S102 - the same model the script below defines


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g)


def test_the_switch_is_offered_after_the_check_and_computes_the_same_loss():
    torch.manual_seed(0)
    model = GPT()  # noqa: F821
    x, y = _batch()
    model(x, y)[1].backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.register_buffer("seen", torch.zeros(()))  # a buffer a train-mode forward would change
    model.register_forward_pre_hook(lambda m, a: m.seen.add_(1) and None)
    rng = torch.get_rng_state()
    entered = []

    class Suspended:
        def __enter__(self):
            entered.append(1)

        def __exit__(self, *exc):
            return False

    sw = attention_switch(model, (x, y), {}, "cpu", None, compiled=False, suspended=Suspended)
    assert isinstance(sw, SdpaSwitch) and sw.id == ID and sw.why_not() is None and sw.layers == 2
    assert sw.check_loss[0] == pytest.approx(sw.check_loss[1], rel=1e-5) and "is_causal=True" in sw.fix
    assert entered == [1, 1] and torch.equal(torch.get_rng_state(), rng) and model.training
    assert model.seen.item() == 0  # three forwards ran; the buffer is as it was
    assert all(torch.equal(p.grad, grads[n]) for n, p in model.named_parameters())  # the user's gradients kept
    model.eval()
    plain = model(x, y)[1]
    sw.enter()  # off (an `a` step): the same mode, nothing rewritten
    passed = model(x, y)[1]
    sw.leave()
    assert passed.item() == plain.item() and sw.rewritten == 0
    sw.on()
    sw.enter()
    rewritten = model(x, y)[1]
    sw.leave()
    assert rewritten.item() == pytest.approx(plain.item(), rel=1e-5) and sw.rewritten == 2
    assert sw.ineffective() is None and sw.describe()["rewritten"] == 2
    sw.restore()  # off: nothing entered, nothing left


def test_a_model_that_uses_its_weights_is_refused_with_the_reason_and_sdpa_or_compiled_are_not_offered():
    x, y = _batch()
    sw = attention_switch(GPT(returns_weights=True), (x, y), {}, "cpu", None, compiled=False)  # noqa: F821
    assert isinstance(sw, Unavailable) and "weights are used after" in sw.why_not()
    assert attention_switch(GPT(sdpa=True), (x, y), {}, "cpu", None, compiled=False) is None  # noqa: F821
    assert attention_switch(GPT(), (x, y), {}, "cpu", None, compiled=True) is None  # noqa: F821


def test_activation_checkpointing_is_refused_before_a_step_could_fail():
    """Non-reentrant checkpointing recomputes the forward in backward, without the mode: its
    metadata check would raise in the user's backward. The training check sees it first."""
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(GPT):  # noqa: F821
        def forward(self, idx, targets):
            x = self.wte(idx)
            for b in self.blocks:
                x = x + checkpoint(b, x, use_reentrant=False)
            logits = self.head(x)
            return logits, F.cross_entropy(logits.view(-1, 64), targets.view(-1))

    x, y = _batch()
    model = Checkpointed()
    sw = attention_switch(model, (x, y), {}, "cpu", None, compiled=False)
    assert isinstance(sw, Unavailable) and "failed" in sw.why_not(), sw.why_not()
    assert all(p.grad is None for p in model.parameters())


def test_the_checks_keep_each_submodules_own_mode():
    x, y = _batch()
    model = GPT()  # noqa: F821
    model.train()
    model.blocks[1].eval()  # frozen by the user
    assert isinstance(attention_switch(model, (x, y), {}, "cpu", None, compiled=False), SdpaSwitch)
    assert model.training and model.blocks[0].training and not model.blocks[1].training


def test_a_switch_that_rewrote_nothing_is_not_measured():
    sw = SdpaSwitch({(8, 16, 8)}, [{"masked": True, "causal": True}], (1.0, 1.0), 1)
    assert sw.ineffective() == "no attention by hand was rewritten in the steps with the fix on"


SCRIPT = '''
import math, torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
torch.set_num_threads(1)
''' + MODEL + '''
model = GPT()
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
for i in range(100000):  # stopped by gpuprof after its steps and experiments
    x = torch.randint(0, 64, (4, 16)); y = torch.randint(0, 64, (4, 16))
    logits, loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    assert math.isfinite(loss.item())
'''


@pytest.fixture(scope="module")
def looped(tmp_path_factory):
    path = tmp_path_factory.mktemp("attn") / "train.py"
    path.write_text(textwrap.dedent(SCRIPT))
    return run_script(str(path), [], steps=4, warmup=1, stdout=io.StringIO(), post_budget_s=8.0,
                      experiments={"compile": False},
                      instruments_factory=lambda dev, data: default_instruments(dev, data, samplers=False))


def test_in_a_script_the_attention_is_switched_on_the_loop_and_the_finding_says_so(looped):
    from gpuprof.analysis.pipeline import analyze

    p = looped.profile
    sec = p.measurements["experiments"]
    res = {r["id"]: r for r in sec["results"]}
    assert ID in res, sec
    exp = res[ID]
    assert exp["rewritten"] > 0 and exp["pairs"] >= 4 and exp.get("ratio") and not sec.get("failures")
    assert exp["check_loss"][0] == pytest.approx(exp["check_loss"][1], rel=1e-4)
    att = p.measurements["kernels"]["attention"]
    assert len(att["by_hand"]) == 2 and "measured on your loop" in att["timing"]["not_measured"]
    analysis = analyze(p)
    assert violations(p, analysis) == []
    (f,) = [x for x in analysis.findings if x.id == "attention-by-hand"]
    assert f.evidence["experiment"] == ID and f.evidence["measured_on"] == "your loop"
    assert "measured on your loop" in f.because


def test_the_mask_is_read_in_the_first_forward_only(monkeypatch):
    """Reading a mask's values is a host sync on CUDA: with the fix on, only its first forward pays
    it (a (T, T) mask keeps its pattern), so the `b` steps are not slowed by syncs the `a` steps lack."""
    x, y = _batch()
    model = GPT()  # noqa: F821
    sw = attention_switch(model, (x, y), {}, "cpu", None, compiled=False)
    reads = []
    real = torch.equal
    monkeypatch.setattr(torch, "equal", lambda a, b: reads.append(1) or real(a, b))
    sw.on()
    for n in range(3):
        sw.enter()
        loss = model(x, y)[1]
        sw.leave()
        assert math.isfinite(loss.item())
    assert len(reads) == 2 and sw.rewritten == 6  # two layers, read once each


class HfAttn(nn.Module):
    """HF GPT-2's attention by hand: the scores ÷ a one-value tensor, torch.where with a tensor
    holding the dtype's lowest value."""

    def __init__(self, c=16, h=2, t=16):
        super().__init__()
        self.h = h
        self.qkv, self.proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
        self.register_buffer("bias", torch.tril(torch.ones(t, t, dtype=torch.bool)).view(1, 1, t, t))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (z.view(B, T, self.h, C // self.h).transpose(1, 2) for z in (q, k, v))
        w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], v.size(-1) ** 0.5, dtype=q.dtype)
        w = torch.where(self.bias[:, :, :T, :T], w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype))
        y = torch.matmul(F.softmax(w, dim=-1), v)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


def test_a_tensor_scale_and_fill_value_are_never_read_after_the_first_forward(monkeypatch):
    """A one-value tensor read with .item() is a host sync on CUDA in every `b` forward (the `a`
    forwards have none): the divisor goes to q unread, the fill value is read once per switch."""
    x, y = _batch()
    model = GPT()  # noqa: F821
    model.blocks = nn.ModuleList(HfAttn() for _ in range(2))
    sw = attention_switch(model, (x, y), {}, "cpu", None, compiled=False)
    assert isinstance(sw, SdpaSwitch)
    with torch.no_grad():
        plain = model(x, y)[1].item()
    reads = []
    real_item, real_equal = torch.Tensor.item, torch.equal
    monkeypatch.setattr(torch.Tensor, "item", lambda t: reads.append("item") or real_item(t))
    monkeypatch.setattr(torch, "equal", lambda a, b: reads.append("equal") or real_equal(a, b))
    sw.on()
    per_forward, losses = [], []
    for _ in range(3):
        before = len(reads)
        sw.enter()
        with torch.no_grad():
            loss = model(x, y)[1]
        sw.leave()
        per_forward.append(len(reads) - before)
        losses.append(real_item(loss))
    assert per_forward == [4, 0, 0]  # per layer: the fill value and the mask, in the first forward only
    assert losses == pytest.approx([plain] * 3, rel=1e-5) and sw.rewritten == 6 and sw.ineffective() is None


def test_forwards_that_did_not_rewrite_every_layer_leave_the_fix_not_measured():
    """A batch of another length than the traced one (a last short batch) runs its attention by
    hand with the fix on: those steps compare nothing, and the switch says so."""
    x, y = _batch()
    model = GPT()  # noqa: F821
    sw = attention_switch(model, (x, y), {}, "cpu", None, compiled=False)
    sw.on()
    for idx, tgt in ((x, y), (x[:, :8].contiguous(), y[:, :8].contiguous())):  # T 16 as traced, then T 8
        sw.enter()
        with torch.no_grad():
            model(idx, tgt)
        sw.leave()
    assert sw.rewritten == 2 and sw.forwards_on == 2
    assert sw.ineffective() == ("1 of 2 forwards with the fix on rewrote fewer than the 2 attention layers traced "
                                "(their shapes differ from the traced ones'): those steps did not compare SDPA "
                                "with the attention by hand")


def test_the_check_compares_the_outputs_element_by_element(monkeypatch):
    """Attention through SDPA returned in the wrong order along T: logits permuted, the loss that
    averages them unchanged. The loss alone would pass it; the check refuses it."""
    import gpuprof.measure.attention_rewrite as rw
    from gpuprof.measure.attention_model import check_rewrite
    from gpuprof.measure.attention_rewrite import Unrewritable

    class OneLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(64, 16)
            self.attn = Attn()  # noqa: F821
            self.head = nn.Linear(16, 64)

        def forward(self, idx, targets):
            logits = self.head(self.attn(self.wte(idx)))  # no residual: a row permutation of y permutes the logits
            return logits, logits.mean()

    torch.manual_seed(0)
    model = OneLayer()
    x, y = _batch()
    shapes = {(4 * 2, 16, 8)}
    assert check_rewrite(model, (x, y), {}, "cpu", None, shapes)[2] == 1
    real = rw.F.scaled_dot_product_attention
    monkeypatch.setattr(rw.F, "scaled_dot_product_attention", lambda *a, **k: real(*a, **k).flip(-2))
    with pytest.raises(Unrewritable, match="output 0 \\(4, 16, 64\\): differs by up to"):
        check_rewrite(model, (x, y), {}, "cpu", None, shapes)
