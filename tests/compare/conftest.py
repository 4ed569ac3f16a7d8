"""The hand-built BEFORE/AFTER pair shared by the compare tests."""

import pytest

from compare_profiles import BASE_PHASES, finding, hand_profile


@pytest.fixture
def hand_pair():
    """BEFORE: a 1.00 s median step (steps 0.9, 1.0, 1.0, 1.3 s: mean 1.05 s) with 0.30 s of data;
    AFTER: 0.75 s steps, data 0.05 s, batch 8→16 and accum 4→2 (same 4,096 tokens). MFU: 4e12 FLOPs
    per step against a 10 TFLOP/s peak (and an 8 TFLOP/s ceiling BEFORE, none measured AFTER)."""
    fwd = [0.10, 0.20, 0.20, 0.50]
    before = hand_profile(
        [dict(BASE_PHASES, forward=f) for f in fwd],
        findings=[finding("data-loading-exposed", 0.30, {"data": 0.30}, step=1.05),
                  finding("micro-batch-too-small", 0.09, {"forward": 0.03, "backward": 0.06}, step=1.05),
                  finding("storage-too-slow", 0.10, {}, step=1.05),
                  finding("dominant-phase", None, kind="info")],
        mfu={"mfu": 0.40, "mfu_vs_ceiling": 0.50, "flops_per_step": 4e12, "peak_tflops": 10.0,
             "ceiling_tflops": 8.0})
    after = hand_profile(
        [dict(BASE_PHASES, data=0.05)] * 4, config={"batch_size": 16, "grad_accum": 2},
        findings=[finding("dominant-phase", None, kind="info"),
                  finding("cpu-saturated", None, kind="info", step=0.75)],
        mfu={"mfu": 4.0 / 0.75 / 10.0, "mfu_vs_ceiling": None, "flops_per_step": 4e12, "peak_tflops": 10.0,
             "ceiling_tflops": None})
    return before, after
