"""gpu_check's plan: every check in its run order, the least time worth starting it with and what
it shows (the report's words), and run_check, which runs one within the time budget and never
raises."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import Callable

from gpu_check_checks import (check_compiled, check_compute_fixes, check_cuda_scenarios, check_cudagraphs,
                              check_default_diagnose, check_event_overhead, check_fp32_tf32, check_gpu_spans,
                              check_h2d_pageable, check_loop_promises, check_nanogpt_data_delay, check_nvml,
                              check_sync_counts)
from gpu_check_checks_ranks import check_fsdp, check_nccl
from gpu_check_run import TAIL_CHARS, Check, Ctx
from gpu_check_verdicts_meters import OVERHEAD_LIMIT, SYNC_J, SYNC_K


@dataclass(frozen=True)
class Spec:
    name: str
    fn: Callable[[Ctx], Check]
    min_s: float  # the least time left worth starting it with
    what: str


# Run order: the default run first (nvml reads its profile), the slow compiled run last so that
# a long compile can only cost itself.
CHECKS = [
    Spec("default-diagnose", check_default_diagnose, 40,
         "`gpuprof diagnose` with the CUDA defaults (GPT-2 124M, bf16): step time, phases on the GPU "
         "timeline, true MFU, and the bf16 matmul ceiling at 50-100% of the datasheet peak."),
    Spec("nvml", check_nvml, 0,
         "From the default run's profile: NVML available, every field sampled or named unreadable, and the "
         "sampled GPU's UUID equal to torch's device 0."),
    Spec("gpu-spans", check_gpu_spans, 0,
         "From the default run's profile: per step, the GPU spans add up to the GPU phase totals and lie "
         "inside the step, in order."),
    Spec("nccl-one-rank", check_nccl, 60,
         "tests/fixtures/ddp_train.py with --nproc-per-node 1 on NCCL, DDP on cuda:0: the all-reduce meter "
         "counts one round per step on CUDA events, in flight and exposed measured, busbw not given for one "
         "rank; then SIGINT mid-run: exit 130 within 60 s with the rank's steps kept."),
    Spec("fsdp-one-rank", check_fsdp, 60,
         "tests/fixtures/fsdp_train.py with --nproc-per-node 1 on NCCL, FSDP2 on cuda:0: it finishes, the "
         "sharding is read, every step on the GPU timeline, and no post-run part runs the sharded model."),
    Spec("cudagraphs", check_cudagraphs, 90,
         "The built-in loop with --compile-mode reduce-overhead (CUDA graphs): every measured step on the GPU "
         "timeline, no event recorded during a capture, no sync counted as the loop's own."),
    Spec("nanogpt-data-delay", check_nanogpt_data_delay, 30,
         "tests/fixtures/nanogpt_train.py with 20 ms slept in every get_batch: gpuprof's data share vs the "
         "slept ÷ iteration time the fixture prints, within 5 points."),
    Spec("fp32-tf32", check_fp32_tf32, 30,
         "The fixture with --dtype=float32 (it allows TF32 as nanoGPT does): MFU against the TF32 peak, "
         "and the probe measures TF32."),
    Spec("sync-counts", check_sync_counts, 30,
         f"benchmarks/gpu_scripts/sync_counts.py: {SYNC_K} .item() + {SYNC_J} torch.cuda.synchronize() per "
         "step, 5 .item() in a warmup eval: exactly the per-step counts."),
    Spec("h2d-pageable", check_h2d_pageable, 40,
         "benchmarks/gpu_scripts/h2d_copies.py pageable vs pinned (16 MiB per micro-step): h2d-pageable "
         "fires on the pageable run only, and sync-in-step not for its blocking copies."),
    Spec("event-overhead", check_event_overhead, 30,
         "benchmarks/timing_overhead.py on CUDA: steps with and without the phase timer (ABBA pairs): "
         f"median on/off ratio ≤ {OVERHEAD_LIMIT}."),
    Spec("compute-fixes", check_compute_fixes, 40,
         "tests/fixtures/mingpt_train.py with attention by hand, vocabulary 50257 and AdamW not fused (GPT-2 "
         "widths, 4 layers, bf16): each seen and timed both ways on CUDA events; attention-by-hand found."),
    Spec("cuda-scenarios", check_cuda_scenarios, 40,
         "`gpuprof scenario run NAME` for every scenario whose device is cuda: each MATCHes (exit 0)."),
    Spec("compiled", check_compiled, 120,
         "`gpuprof diagnose --batch-size 16 --block-size 1024 --grad-accum 8 --dtype bf16 --compile`: "
         "the same figures and verdict as the default run."),
    Spec("loop-promises", check_loop_promises, 240,
         "The promises measured on the built-in loop's own steps, met by the corrected config: the same shape "
         "eager with --measure-compile (compile-missing measured in experiment steps) against the compiled run, "
         "and in fp32 (precision-slow: bf16 autocast) against the eager bf16 run; achieved within the promised "
         "interval ±15%."),
]
CHECK_WHAT = {s.name: s.what for s in CHECKS}


def run_check(ctx: Ctx, spec: Spec) -> Check:
    """One check, never raising: a broken check is a FAIL with its traceback in the report."""
    if ctx.left() < spec.min_s:
        return Check(spec.name).skip(f"time budget spent ({max(ctx.left(), 0):.0f} s left, needs {spec.min_s:.0f} s)")
    t0 = time.monotonic()
    try:
        c = spec.fn(ctx)
    except Exception as exc:  # noqa: BLE001 - one broken check must not stop the others
        c = Check(spec.name).decide(False, f"the check raised {exc.__class__.__name__}: {exc}")
        c.error = traceback.format_exc()[-TAIL_CHARS:]
    c.wall_s = time.monotonic() - t0
    return c
