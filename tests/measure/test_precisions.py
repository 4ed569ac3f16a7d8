"""measure/precisions.py: the matmul rate of each dtype at the model's own shapes, and the half
precision that is decided slower than the run's dtype before all its shapes are timed."""

import pytest
import torch

from gpuprof.measure import precisions as pr

SHAPES = {"m": 1024, "covered_share": 1.0,
          "shapes": [{"k": 64, "n": 2048, "count": 1, "flops_share": 0.6},
                     {"k": 64, "n": 256, "count": 2, "flops_share": 0.25},
                     {"k": 256, "n": 64, "count": 2, "flops_share": 0.15}]}


def _fake_cells(monkeypatch, rates):
    """_time_shape answers rates[dtype][shape index]; the calls are counted."""
    calls = []
    index = {(s["k"], s["n"]): i for i, s in enumerate(SHAPES["shapes"])}
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}

    def cell(torch_, dev, on_cuda, tdtype, m, k, n, budget_s, clock):
        dt = names[tdtype]
        calls.append((dt, k, n))
        return {"k": k, "n": n, "m": m, "tflops": rates[dt][index[(k, n)]], "reps": 3}

    monkeypatch.setattr(pr, "_time_shape", cell)
    return calls


def test_an_emulated_half_precision_is_cut_after_the_shape_that_decides_it(monkeypatch):
    """bf16 20x slower on the largest shape (60% of the FLOPs): 0.6 × 20 = 12x fp32's time at all
    the shapes, whatever the others do: one cell, not three; fp16 as fast as fp32 is timed whole."""
    calls = _fake_cells(monkeypatch, {"fp32": [1.0, 1.0, 1.0], "bf16": [0.05, 2.0, 2.0], "fp16": [1.0, 1.0, 1.0]})
    res = pr.measure_precisions("cpu", SHAPES, ["fp32", "bf16", "fp16"], 3.0, reference="fp32")
    assert [c[0] for c in calls] == ["fp32"] * 3 + ["bf16"] + ["fp16"] * 3
    assert res["slower"] == {"bf16": pytest.approx(12.0)} and "bf16" not in res["tflops"]
    assert res["tflops"]["fp16"] == 1.0 and res["reference"] == "fp32"
    assert "decided slower after 1 of 3 shapes" in res["skipped"]["bf16"]


def test_the_reference_is_timed_first_and_a_full_precision_is_never_cut(monkeypatch):
    """A bf16 run on a CPU without native bf16: bf16 is timed first and whole (the MFU's ceiling);
    fp32, many times faster, is a full precision and timed whole too (the runner-up rule reads it)."""
    calls = _fake_cells(monkeypatch, {"fp32": [1.0, 1.0, 1.0], "bf16": [0.05, 0.05, 0.05], "fp16": [0.04, 0.04, 0.04]})
    res = pr.measure_precisions("cpu", SHAPES, ["fp32", "bf16", "fp16"], 3.0, reference="bf16")
    assert [c[0] for c in calls] == ["bf16"] * 3 + ["fp32"] * 3 + ["fp16"] * 3
    assert set(res["tflops"]) == {"fp32", "bf16", "fp16"} and res["slower"] == {}


def test_a_half_precision_close_to_the_reference_is_timed_at_every_shape(monkeypatch):
    """1.4x slower on the largest shape, faster on the rest: 0.6 × 1.4 = 0.84 < 1.5, never cut; its
    rate is FLOP-weighted over all three."""
    _fake_cells(monkeypatch, {"fp32": [1.0, 1.0, 1.0], "bf16": [1 / 1.4, 4.0, 4.0], "fp16": [1.0, 1.0, 1.0]})
    res = pr.measure_precisions("cpu", SHAPES, ["fp32", "bf16"], 3.0, reference="fp32")
    assert res["slower"] == {}
    assert abs(res["tflops"]["bf16"] - 1.0 / (0.6 * 1.4 + 0.25 / 4 + 0.15 / 4)) < 1e-9


def test_without_a_reference_every_cell_is_timed(monkeypatch):
    calls = _fake_cells(monkeypatch, {"fp32": [1.0, 1.0, 1.0], "bf16": [0.05, 0.05, 0.05], "fp16": [1.0, 1.0, 1.0]})
    res = pr.measure_precisions("cpu", SHAPES, ["fp32", "bf16", "fp16"], 3.0)
    assert len(calls) == 9 and res["slower"] == {} and res["reference"] is None


def test_real_products_on_this_cpu_keep_the_reference_rate_and_bound_what_was_cut():
    """The real kernels, small shapes: whatever this CPU's bf16 does, the result is consistent —
    a cut dtype has a bound above SLOWER_CUT and no rate; an uncut one has a positive rate."""
    small = {"m": 64, "covered_share": 1.0, "shapes": [{"k": 32, "n": 64, "count": 1, "flops_share": 1.0}]}
    res = pr.measure_precisions("cpu", small, ["fp32", "bf16"], 0.2, reference="fp32")
    assert res["tflops"]["fp32"] > 0
    assert ("bf16" in res["tflops"]) != ("bf16" in res["slower"]) or "bf16" in res["skipped"]
    assert all(v >= pr.SLOWER_CUT for v in res["slower"].values())
