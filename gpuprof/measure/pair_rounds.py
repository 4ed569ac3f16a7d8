"""A post-run pair, the run's way and the changed way, timed in paired rounds and kept with the
interval of their ratio (issue #29, docs/savings-intervals.md): what the compute fixes
(measure/kernels.py: attention, need_weights, vocabulary; measure/fused_optimizer.py; and
measure/compiled.py) time with, as precisions.time_steps_paired and microbatch.time_pair do.

`timed_pair` runs pairs.alternate_rounds (a warm-up of each way, then rounds of one run of each in
ABBA order while another round fits the seconds given, up to 16). It does at least
ADVISED_ROUNDS rounds when they fit those seconds (the deadline decides, judged by the warm-up
round, as alternate_rounds does), else what fits, at least 2; from ADVISED_ROUNDS on it stops once
the interval's confidence is "high". It returns the interval of changed ÷ run
(measure/paired.py, the sign-test interval, `Interval.as_dict`), the rounds, each round's seconds
per way (its parts summed) and the median of each part over the rounds: the figures the timings
store beside their per-way seconds, which are those medians."""

from __future__ import annotations

import time

from gpuprof.measure import pairs
from gpuprof.measure.paired import ADVISED_ROUNDS, confidence, interval_from_rounds
from gpuprof.stats import median


def device_of(device):
    """The torch.device a timing's tensors go on (the current CUDA device for "cuda")."""
    import torch

    from gpuprof.measure.cuda import cuda_device, is_cuda

    return cuda_device(device) if is_cuda(device) else torch.device(str(device))


def timed_pair(clock, variants: dict, run: str, changed: str, seconds: float, now=time.perf_counter, *,
               per: float = 1.0) -> dict:
    """The two ways {name: [part fns]} (`run`: the run's way, `changed`: the changed one) in paired
    rounds within `seconds` (see the module's words). Returns {"interval": changed ÷ run as
    Interval.as_dict, "rounds": n, "round_seconds": {name: [seconds per round]}, "median_parts":
    {name: [median seconds of each part]}, "ratio": the interval's estimate}, seconds ÷ `per`
    (per layer, say). Raises TimeoutError when the warm-up leaves no room for 2 rounds."""

    def decided(res) -> bool:
        return res["rounds"] >= ADVISED_ROUNDS and confidence(interval_from_rounds(res, run, changed)) == "high"

    res = pairs.alternate_rounds(clock, variants, seconds, now, min_rounds=2, until=decided)
    iv = interval_from_rounds(res, run, changed)
    return {"interval": iv.as_dict(), "ratio": iv.estimate, "rounds": res["rounds"],
            "round_seconds": {name: [s / per for s in pairs.round_seconds(res, name)] for name in (run, changed)},
            "median_parts": {name: [median(p) / per for p in zip(*res["times"][name])] for name in (run, changed)}}


def rounds_words(out: dict, ways: str) -> str:
    """How a timing's figures were made, for its `method`: the rounds, and what the ratio is."""
    return (f"{out['rounds']} paired rounds (ABBA) after a warm-up, the medians of the rounds; the ratio is the "
            f"median of the rounds' {ways} with its sign-test interval")
