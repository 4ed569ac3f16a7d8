"""torch's own attention modules are not the user's code (issue: wrong advice on
nn.TransformerEncoderLayer): nn.MultiheadAttention with need_weights=False (what the encoder and
decoder layers pass) runs SDPA inside and is never "attention by hand"; called with
need_weights=True (its default when a user calls it) torch computes it by hand, and the fix is
need_weights=False at the user's call site, timed. Models from tests/fixtures/word_lm/model.py
(pytorch/examples' word_language_model)."""

import importlib.util
import io
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gpuprof.analysis.bounds import violations
from gpuprof.analysis.pipeline import analyze
from gpuprof.measure.flops import count_flops
from gpuprof.measure.instruments import default_instruments
from gpuprof.measure.optrace import OpTrace
from gpuprof.runners.script import run_script

WORD_LM = Path(__file__).resolve().parent.parent / "fixtures" / "word_lm"
_spec = importlib.util.spec_from_file_location("word_lm_model", WORD_LM / "model.py")
word_lm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(word_lm)

CALL_LINE = next(i for i, line in enumerate((WORD_LM / "model.py").read_text().splitlines(), 1)
                 if "need_weights left at True" in line)


def _trace(model, x):
    trace = OpTrace(model)
    count_flops(model, (x,), autocast_dtype=None, extra_modes=(trace,), counter=False)
    return trace.summary()


def _tokens(t=16, b=2, vocab=50):
    return torch.randint(0, vocab, (t, b))  # (T, B): word_language_model's layout


def test_transformer_encoder_layers_call_sdpa_inside_and_nothing_is_by_hand():
    torch.manual_seed(0)
    model = word_lm.TransformerModel(50, 32, 2, 64, 2, dropout=0.0)
    s = _trace(model, _tokens())
    assert s["by_hand"] == []
    assert [c["module"] for c in s["sdpa"]] == ["encoder.layers.0.self_attn", "encoder.layers.1.self_attn"]
    c = s["sdpa"][0]
    assert (c["torch_module"], c["need_weights"], c["shape"]) == ("nn.MultiheadAttention", False, [2, 2, 16, 16])
    assert c["is_causal"] is True  # generate_square_subsequent_mask: -inf above the diagonal
    assert c["backend"] in ("flash (CPU)", "math")


def test_an_encoder_in_eval_mode_under_no_grad_still_shows_sdpa_inside_torchs_module():
    # torch's inference fast path (which would bypass nn.MultiheadAttention) is not taken while
    # the trace's function mode is active: the same SDPA-inside record as in training.
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True).eval()
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    with torch.no_grad():
        s = _trace(model, torch.randn(2, 16, 32))
    assert s["by_hand"] == []
    assert [(c["module"], c["need_weights"]) for c in s["sdpa"]] == [("layers.0.self_attn", False),
                                                                    ("layers.1.self_attn", False)]


@pytest.mark.parametrize("need_weights", [True, False])
def test_a_users_multihead_attention_call_is_by_hand_only_with_need_weights(need_weights):
    torch.manual_seed(0)
    model = word_lm.MHAModel(50, 32, 4, 2, need_weights=need_weights)
    s = _trace(model, _tokens())
    if not need_weights:
        assert s["by_hand"] == [] and [c["need_weights"] for c in s["sdpa"]] == [False, False]
        assert s["sdpa"][0]["backend"] == "flash (CPU)"
        return
    assert s["sdpa"] == []
    assert [c["module"] for c in s["by_hand"]] == ["attn.0", "attn.1"]
    c = s["by_hand"][0]
    assert (c["torch_module"], c["need_weights"], c["call_site"]) == ("nn.MultiheadAttention", True,
                                                                       f"model.py:{CALL_LINE}")
    assert c["shape"] == [2, 4, 16, 8] and c["masked"] is True and c["causal"] is True


class HandSA(nn.TransformerEncoderLayer):
    """A user's subclass that overrides the self-attention block with attention by hand."""

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
        b, t, c = x.shape
        q = k = v = x.view(b, t, 2, c // 2).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / (c // 2) ** 0.5
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        return (F.softmax(att, dim=-1) @ v).transpose(1, 2).reshape(b, t, c)


def test_a_subclass_that_writes_its_own_attention_is_the_users_code():
    torch.manual_seed(0)
    model = nn.Sequential(HandSA(32, 2, 64, dropout=0.0, batch_first=True))
    s = _trace(model, torch.randn(2, 16, 32))
    (c,) = s["by_hand"]
    assert c.get("torch_module") is None and c["module"] == "0" and c["causal"] is True


def _diagnose(*args):
    run = run_script(str(WORD_LM / "main.py"), ["--corpus", "20000", "--bptt", "64", "--emsize", "64", *args],
                     steps=2, warmup=1, stdout=io.StringIO(), post_budget_s=6.0,
                     instruments_factory=lambda dev, data: default_instruments(dev, data, samplers=False))
    analysis = analyze(run.profile)
    assert violations(run.profile, analysis) == []
    return run.profile, {f.id: f for f in analysis.findings}


def test_need_weights_true_gets_the_fix_at_the_users_line_with_a_timing():
    profile, found = _diagnose("--model", "MHA", "--use-optimizer", "--nhead", "4")
    assert "attention-by-hand" not in found
    f = found["attention-need-weights"]  # a fix, or information when under 5% of the step here
    if f.fix:
        assert f"pass need_weights=False in the nn.MultiheadAttention call at model.py:{CALL_LINE}" in f.fix
    else:  # timed slower here by ≥ 2% of the step (a loaded machine): never offered as a change
        assert f.evidence["measured_saving_s"] < 0 and "was not faster here" in f.note and f.kind == "info"
    timing = profile.measurements["kernels"]["attention"]["mha_timing"]  # the model, as it runs and without weights
    assert timing["per"] == "model" and timing["modules"] == 2
    assert timing["by_hand_forward_s"] > 0 and timing["sdpa_forward_s"] > 0
    assert f.evidence["timed_layers"] == 2 and f.evidence["call_site"] == f"model.py:{CALL_LINE}"
    assert "timing" not in profile.measurements["kernels"]["attention"]  # no attention of the user's own


def test_nn_transformer_gets_no_attention_advice():
    profile, found = _diagnose("--model", "Transformer", "--use-optimizer")
    assert not {"attention-by-hand", "attention-need-weights"} & set(found)
    assert "timing" not in profile.measurements["kernels"]["attention"]  # nothing by hand: nothing timed
