"""The hand-built BEFORE/AFTER pair shared by the compare tests."""

import pytest

from gpuprof.analysis.mfu_results import MfuResult

from compare_profiles import BASE_PHASES, finding, hand

BEFORE_FORWARD = [0.10, 0.20, 0.20, 0.50, 1.20]  # steps 0.9, 1.0, 1.0, 1.3 and an irregular 2.0 s
BEFORE_STEP = 1.05  # the typical step: the mean of 0.9, 1.0, 1.0, 1.3 (2.0 s is irregular: left out)


@pytest.fixture
def hand_pair():
    """(BEFORE, its analysis, AFTER, its analysis). BEFORE: steps 0.9, 1.0, 1.0, 1.3 and 2.0 s; the
    2.0 s step is irregular (over 1.5x the 1.00 s median and over 5 robust deviations above it), so
    the typical step is the mean of the other four, 1.05 s (median 1.00 s, mean of all 1.24 s),
    with 0.30 s of data; AFTER: 0.75 s steps, data 0.05 s, batch 8→16 and accum 4→2 (same 4,096
    tokens). MFU: 4e12 FLOPs per step against a 10 TFLOP/s peak (and an 8 TFLOP/s ceiling BEFORE,
    none measured AFTER), at each typical step."""
    before, before_analysis = hand(
        [dict(BASE_PHASES, forward=f) for f in BEFORE_FORWARD],
        findings=[finding("data-loading-exposed", 0.30, {"data": 0.30}, step=BEFORE_STEP),
                  finding("micro-batch-too-small", 0.09, {"forward": 0.03, "backward": 0.06}, step=BEFORE_STEP),
                  finding("storage-too-slow", 0.10, {}, step=BEFORE_STEP),
                  finding("dominant-phase", None, kind="info")],
        mfu=MfuResult(mfu=4.0 / BEFORE_STEP / 10.0, mfu_vs_ceiling=4.0 / BEFORE_STEP / 8.0, flops_per_step=4e12,
                      peak_tflops=10.0, ceiling_tflops=8.0))
    after, after_analysis = hand(
        [dict(BASE_PHASES, data=0.05)] * 4, config={"batch_size": 16, "grad_accum": 2},
        findings=[finding("dominant-phase", None, kind="info"),
                  finding("cpu-saturated", None, kind="info", step=0.75)],
        mfu=MfuResult(mfu=4.0 / 0.75 / 10.0, mfu_vs_ceiling=None, flops_per_step=4e12, peak_tflops=10.0,
                      ceiling_tflops=None))
    return before, before_analysis, after, after_analysis
