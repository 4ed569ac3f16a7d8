"""The compute fixes' timings in paired rounds (issue #29): attention by hand vs SDPA, the model
with need_weights=False, the padded vocabulary, the fused optimizer and the compiled model. Each
really runs both ways on tiny tensors, but the seconds come from an injected clock (a set figure
per part, seeded noise), so nothing depends on which way is faster on this CPU."""

import pytest
import torch
import torch.nn as nn

from gpuprof.measure import attention_model, fused_optimizer, kernels, pair_rounds
from gpuprof.measure.compiled import time_compiled
from gpuprof.measure.paired import ADVISED_ROUNDS, Interval
from measure.test_paired_timings import FakeClock  # the one fake of pairs.Clock's contract


def _paired(out, run: str, changed: str, truth: float, rounds_at_least: int = ADVISED_ROUNDS):
    iv = Interval.from_dict(out["interval"])
    assert iv.low <= truth <= iv.high and iv.enough and iv.statistic == "sign"
    assert out["rounds"] >= rounds_at_least and iv.n == out["rounds"]
    assert set(out["round_seconds"]) == {run, changed}
    assert all(len(v) == out["rounds"] for v in out["round_seconds"].values())
    return iv


def test_attention_runs_paired_rounds_and_stores_the_interval_per_layer():
    clock = FakeClock({"by_hand": 0.004, "by_hand_backward": 0.006, "sdpa": 0.002, "sdpa_backward": 0.004})
    out = kernels.time_attention("cpu", [1, 2, 8, 4], "fp32", causal=True, masked=True, dropout_p=0.0,
                                 seconds=10.0, layers=2, clock=clock, now=clock.now)
    iv = _paired(out, "by_hand", "sdpa", 0.6)
    assert iv.high < 1
    # medians per layer (2 layers timed together), forward and backward apart
    assert out["by_hand_forward_s"] == pytest.approx(0.002, rel=0.06)
    assert out["sdpa_backward_s"] == pytest.approx(0.002, rel=0.06)
    assert out["round_seconds"]["by_hand"][0] == pytest.approx(0.005, rel=0.06)  # per layer too
    assert out["layers_timed"] == 2
    # ABBA: every other round starts with SDPA
    assert clock.calls[4:8] == ["by_hand", "by_hand_backward", "sdpa", "sdpa_backward"]
    assert clock.calls[8:12] == ["sdpa", "sdpa_backward", "by_hand", "by_hand_backward"]


def test_a_decided_interval_stops_at_the_advised_rounds_and_a_short_slice_takes_what_fits():
    clock = FakeClock({"vocab_100": 0.010, "vocab_128": 0.005}, noise=0.01)
    out = kernels.time_vocab("cpu", 8, 4, 100, 128, "fp32", torch.float32, 10.0, clock=clock, now=clock.now)
    assert out["rounds"] == ADVISED_ROUNDS  # "high" at once: no 16 rounds of a clear effect
    clock = FakeClock({"vocab_100": 0.010, "vocab_128": 0.005}, noise=0.01)
    out = kernels.time_vocab("cpu", 8, 4, 100, 128, "fp32", torch.float32, 0.1, clock=clock, now=clock.now)
    assert 2 <= out["rounds"] < ADVISED_ROUNDS and not Interval.from_dict(out["interval"]).enough
    clock = FakeClock({"vocab_100": 0.010, "vocab_128": 0.010})
    out = kernels.time_vocab("cpu", 8, 4, 100, 128, "fp32", torch.float32, 10.0, clock=clock, now=clock.now)
    assert out["rounds"] == 16  # no effect: never decided, the rounds run to their most


def test_vocab_runs_paired_rounds_and_keeps_its_keys():
    clock = FakeClock({"vocab_100": 0.010, "vocab_128": 0.008})
    out = kernels.time_vocab("cpu", 8, 4, 100, 128, "fp32", torch.float32, 10.0, clock=clock, now=clock.now)
    _paired(out, "vocab", "padded", 0.8)
    assert out["vocab_s"] == pytest.approx(0.010, rel=0.06) and out["padded_s"] == pytest.approx(0.008, rel=0.06)


class MHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x)[0].pow(2).mean()


def test_need_weights_runs_the_model_both_ways_in_paired_rounds():
    model = MHA()
    clock = FakeClock({"as_run_forward": 0.010, "by_hand_backward": 0.020,
                       "no_weights_forward": 0.008, "sdpa_backward": 0.016})
    out = kernels.time_need_weights(model, (torch.randn(2, 4, 8),), {}, "cpu", None, 10.0, clock=clock, now=clock.now)
    _paired(out, "by_hand", "sdpa", 0.8)
    assert out["per"] == "model" and out["modules"] == 1
    assert out["by_hand_backward_s"] == pytest.approx(0.020, rel=0.06)
    assert all(p.grad is None for p in model.parameters())


def test_the_optimizer_runs_paired_rounds_on_a_copy():
    lin = nn.Linear(4, 4)
    opt = torch.optim.AdamW(lin.parameters(), foreach=False)
    before = [p.detach().clone() for p in lin.parameters()]
    clock = FakeClock({"current_step": 0.010, "fused_step": 0.004})
    out = fused_optimizer.time_optimizer(opt, "cpu", 10.0, clock=clock, now=clock.now)
    _paired(out, "current", "fused", 0.4)
    assert out["current_s"] == pytest.approx(0.010, rel=0.06) and out["parameters"] == 20
    assert all(torch.equal(a, p) for a, p in zip(before, lin.parameters())) and not opt.state


def test_the_compiled_model_runs_paired_rounds():
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    clock = FakeClock({"eager": 0.010, "compiled": 0.007})
    out = time_compiled(model, (torch.randn(2, 4),), {}, "cpu", None, backend="eager", seconds=10.0,
                        clock=clock, now=clock.now)
    _paired(out, "eager", "compiled", 0.7)
    assert out["eager_s"] == pytest.approx(0.010, rel=0.06) and out["compile_s"] > 0
    torch._dynamo.reset()


def test_too_short_a_slice_refuses_as_before():
    def a():
        pass

    def b():
        pass

    clock = FakeClock({"a": 1.0, "b": 1.0})
    with pytest.raises(TimeoutError):
        pair_rounds.timed_pair(clock, {"a": [a], "b": [b]}, "a", "b", 5.0, clock.now)
    assert clock.calls == ["a", "b"]  # the warm-up only


class HandGPT(nn.Module):
    """An embedding, one attention layer by hand (q·kᵀ, causal mask, softmax, ·v) and a head to a
    vocabulary of 100 (not a multiple of 64)."""

    def __init__(self, vocab=100, c=16, h=2, t=8):
        super().__init__()
        self.wte, self.qkv, self.h = nn.Embedding(vocab, c), nn.Linear(c, 3 * c), h
        self.register_buffer("bias", torch.tril(torch.ones(t, t)).view(1, 1, t, t))
        self.lm_head = nn.Linear(c, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.wte(idx)
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / (c // self.h) ** 0.5)
        att = torch.softmax(att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf")), dim=-1)
        x = x + (att @ v).transpose(1, 2).reshape(b, t, c)
        logits = self.lm_head(x)
        return logits, nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def test_the_probe_stores_each_pairs_interval_and_the_sections_read_it(monkeypatch):
    import types

    from gpuprof.measure import pairs
    from gpuprof.sections.compute import KernelsSection

    seconds = {"by_hand": 0.004, "by_hand_backward": 0.008, "sdpa": 0.002, "sdpa_backward": 0.004,
               "as_run_forward": 0.004, "sdpa_forward": 0.002,  # the whole model, its attention through SDPA
               "vocab_100": 0.010, "vocab_128": 0.009, "current_step": 0.010, "fused_step": 0.003}
    made = []

    def make(device):
        made.append(FakeClock(seconds))
        return made[-1]

    rounds = pairs.alternate_rounds
    monkeypatch.setattr(kernels, "Clock", make)
    monkeypatch.setattr(attention_model, "Clock", make)
    monkeypatch.setattr(fused_optimizer, "Clock", make)
    monkeypatch.setattr(pairs, "alternate_rounds",  # the deadline on the fake clock's time too
                        lambda clock, variants, s, now=None, **kw: rounds(clock, variants, s, clock.now, **kw))
    model = HandGPT()
    opt = torch.optim.AdamW(model.parameters(), foreach=False)
    ids = (torch.randint(0, 100, (2, 8)), torch.randint(0, 100, (2, 8)))
    stats = types.SimpleNamespace(seconds=lambda phase: 0.01, micro_steps=1)
    ctx = types.SimpleNamespace(model=model, optimizer=opt, example_args=ids, example_kwargs={}, device="cpu",
                                autocast_dtype=None, precision={"compute_dtype": "fp32"},
                                profile=types.SimpleNamespace(stats=stats), op_trace=None, budget=None)
    out = kernels.ComputeFixesProbe(seconds=3.0).stop(ctx)
    assert len(made) == 3  # attention, vocabulary, optimizer: each timed on an injected clock
    k = KernelsSection.from_dict(out)
    assert k.attention.timing.per == "model" and k.attention.timing.model_not_timed is None
    for timing, truth in ((k.attention.timing, 0.5), (k.vocab.timing, 0.9), (k.optimizer.timing, 0.3)):
        iv = Interval.from_dict(timing.interval)
        assert iv.low <= truth <= iv.high and timing.rounds == iv.n >= ADVISED_ROUNDS
        assert len(next(iter(timing.round_seconds.values()))) == timing.rounds
        assert "paired rounds (ABBA)" in timing.method and "medians" in timing.method
    assert k.vocab.timing.vocab_s == pytest.approx(0.010, rel=0.06)


def test_old_kernels_and_compile_sections_load_without_the_rounds():
    from gpuprof.sections.compute import CompileSection, KernelsSection

    k = KernelsSection.from_dict({"vocab": {"vocab": 100, "timing": {"vocab_s": 0.01, "padded_s": 0.009, "rounds": 4}},
                                  "attention": {"timing": {"by_hand_forward_s": 0.001, "sdpa_forward_s": 0.001}}})
    assert k.vocab.timing.rounds == 4 and k.vocab.timing.interval is None and k.vocab.timing.round_seconds is None
    assert k.attention.timing.interval is None and k.optimizer.timing.interval is None
    c = CompileSection.from_dict({"eager_s": 0.2, "compiled_s": 0.1, "rounds": 3})
    assert c.interval is None and c.round_seconds is None and c.eager_s == 0.2
