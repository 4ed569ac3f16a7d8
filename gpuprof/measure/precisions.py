"""Every precision this device offers, measured at the model's own matmul shapes.

A training step's time is mostly its big matmuls: the attention projections, the MLP and the
lm_head, at M = the tokens of one micro-batch (B·T). This module finds those shapes in the
model (its nn.Linear layers, weighted by the FLOPs each shape carries) and times one product
of each shape in every dtype the device offers — fp32, bf16, fp16 on a CPU; fp32 (TF32 off),
TF32 (compute capability ≥ 8.0), bf16 and fp16 on CUDA — within a time budget. The result per
dtype is the FLOP-weighted rate over those shapes (total FLOPs ÷ total time), so the ratio of two
dtypes predicts how much faster the step's matmuls would run in the other one.

Nothing here is a datasheet figure: a CPU without native bf16 (no AVX512-BF16/AMX) emulates it,
and a V100 or T4 emulates bf16 too (torch 2.13's is_bf16_supported() still says yes); the
measurement shows it. fp8 is not probed: training in fp8 needs a scaling recipe (torchao,
Transformer Engine), not a dtype switch, so its rate would promise a change no config makes.
"""

from __future__ import annotations

import contextlib
import time

from gpuprof.hardware import FULL_PRECISIONS, TRAIN_DTYPES, torch_dtype

MAX_SHAPES = 3
MIN_CELL_S = 0.02  # below this per (shape, dtype) a rate is mostly call overhead
# A half precision is decided slower once the shapes timed so far take this many times the run's
# dtype's time at all the shapes (a margin over 1 for the rates' noise).
SLOWER_CUT = 1.5
RUN_CALLS = 4  # time_steps_paired: each way's calls in a row per round, the first one untimed


def model_matmuls(model, example_args, max_shapes: int = MAX_SHAPES, example_kwargs=None) -> dict:
    """The model's dominant matmul shapes at one micro-batch: {m, shapes: [{k, n, count,
    flops_share}], covered_share} where m = tokens per micro-batch (B·T), each shape is an
    nn.Linear (in k, out n), and flops_share its part of all nn.Linear forward FLOPs."""
    import torch

    x = next((a for a in (*(example_args or ()), *(example_kwargs or {}).values())
              if isinstance(a, torch.Tensor)), None)
    if x is None or x.dim() == 0:
        raise ValueError("no example input to size the matmuls")
    if x.is_floating_point():
        m = max(1, x.numel() // max(1, x.shape[-1]))
    else:
        m = x.numel()  # token ids: one row per token
    counts: dict[tuple[int, int], int] = {}
    seen = set()
    for mod in model.modules():
        if id(mod) in seen:
            continue
        if isinstance(mod, torch.nn.Linear):
            key = (mod.in_features, mod.out_features)
        elif type(mod).__name__ == "Conv1D" and getattr(mod, "weight", None) is not None and mod.weight.dim() == 2:
            key = tuple(mod.weight.shape)  # HF GPT-2's projections: x @ W with W (in, out)
        else:
            continue
        seen.add(id(mod))
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        raise ValueError("the model has no nn.Linear layers to measure")
    flops = {k: 2.0 * m * k[0] * k[1] * c for k, c in counts.items()}
    total = sum(flops.values())
    top = sorted(flops, key=flops.get, reverse=True)[:max_shapes]
    shapes = [{"k": k, "n": n, "count": counts[(k, n)], "flops_share": flops[(k, n)] / total}
              for k, n in top]
    return {"m": m, "shapes": shapes, "covered_share": sum(s["flops_share"] for s in shapes)}


def offered_dtypes(device: str) -> tuple[list[str], dict]:
    """(dtypes to probe on this device, {dtype: why it is not probed})."""
    from gpuprof.measure.cuda import cuda_device, is_cuda

    skipped = {"fp8": "not probed: fp8 training needs a scaling recipe, not a dtype switch"}
    if not is_cuda(device):
        return list(TRAIN_DTYPES), skipped
    import torch

    major, _ = torch.cuda.get_device_capability(cuda_device(device))
    dtypes = list(TRAIN_DTYPES)
    if major >= 8:
        dtypes.insert(1, "tf32")
    else:
        skipped["tf32"] = "no TF32 below compute capability 8.0"
    return dtypes, skipped


def measure_precisions(device: str, matmuls: dict, dtypes: list[str], seconds: float,
                       clock=time.perf_counter, reference: str | None = None) -> dict:
    """FLOP-weighted matmul TFLOP/s per dtype at the model's shapes, within `seconds`.

    Each (shape, dtype) cell gets an equal slice of the budget; the product is timed at up to m
    rows, fewer when m rows would not fit the slice (rows start at 64 and double), which keeps
    the rate honest for compute-bound shapes. A dtype whose cells could not all be timed is left out,
    with the reason in `skipped`.

    With `reference` (the run's dtype, timed first), a half precision whose shapes timed so far
    already take SLOWER_CUT times the reference's time at all the shapes is decided slower: its
    other shapes cannot make it faster (their time only adds), so they are not timed; `slower`
    holds that lower bound on its time ÷ the reference's, and `skipped` says so. An emulated bf16
    (a CPU without AVX512-BF16 or AMX: ~20x slower) spent its whole slices on every shape."""
    import torch

    from gpuprof.measure.cuda import cuda_device, is_cuda
    from gpuprof.measure.precision import tf32_matmul

    on_cuda = is_cuda(device)
    dev = cuda_device(device) if on_cuda else torch.device(str(device))
    shapes = matmuls["shapes"]
    cell = max(MIN_CELL_S, float(seconds) / max(1, len(shapes) * len(dtypes)))
    t0 = clock()
    rates: dict[str, float] = {}
    by_shape: dict[str, list] = {}
    skipped: dict[str, str] = {}
    slower: dict[str, float] = {}
    if reference in dtypes:
        dtypes = [reference] + [d for d in dtypes if d != reference]
    for dt in dtypes:
        ctx = tf32_matmul(dt == "tf32") if on_cuda and dt in ("fp32", "tf32") else contextlib.nullcontext()
        cells = []
        # the reference's time at all the shapes (∝ Σ share/rate): a bound to decide `dt` slower
        ref_time = (sum(s["flops_share"] / c["tflops"] for s, c in zip(shapes, by_shape[reference]))
                    if dt != reference and reference in rates and dt not in FULL_PRECISIONS else None)
        try:
            with ctx, torch.no_grad():
                for s in shapes:
                    c = _time_shape(torch, dev, on_cuda, torch_dtype(dt), matmuls["m"], s["k"], s["n"], cell, clock)
                    cells.append(c)
                    if c is None or ref_time is None or len(cells) == len(shapes):
                        continue
                    so_far = sum(sh["flops_share"] / x["tflops"] for sh, x in zip(shapes, cells))
                    if so_far >= SLOWER_CUT * ref_time:
                        slower[dt] = so_far / ref_time
                        break
        except Exception as exc:  # noqa: BLE001 - e.g. a dtype this build cannot multiply
            skipped[dt] = f"{exc.__class__.__name__}: {exc}"
            continue
        if any(c is None for c in cells):
            skipped[dt] = f"one product did not fit its {cell:.2f} s slice even at 64 rows"
            continue
        if dt in slower:
            by_shape[dt] = cells
            skipped[dt] = (f"decided slower after {len(cells)} of {len(shapes)} shapes: these alone take "
                           f"{slower[dt]:.1f}x the time {reference} takes at all of them (the rest not timed)")
            continue
        # FLOP-weighted over the shapes: the step's matmul time in this dtype ∝ Σ share/rate.
        weight = sum(s["flops_share"] for s in shapes)
        inv = sum(s["flops_share"] / c["tflops"] for s, c in zip(shapes, cells))
        rates[dt] = weight / inv
        by_shape[dt] = cells
    return {"method": ("best of repeated products per model shape, FLOP-weighted over the shapes; "
                       + ("CUDA events" if on_cuda else "wall time")),
            "m": matmuls["m"], "shapes": shapes, "covered_share": matmuls["covered_share"],
            "tflops": rates, "by_shape": by_shape, "skipped": skipped, "slower": slower,
            "reference": reference if reference in rates else None, "seconds": clock() - t0}


class _class_forward:
    """Runs the model's own class forward: an instance-level forward wrapper (accelerate wraps an
    HF model's forward in autocast that way) would otherwise impose the run's dtype on a timing
    meant for another one."""

    def __init__(self, model):
        self.model = model
        self.saved = None

    def __enter__(self):
        if "forward" in vars(self.model):
            self.saved = vars(self.model).pop("forward")
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            self.model.forward = self.saved
        return False


def _time_shape(torch, dev, on_cuda: bool, tdtype, m: int, k: int, n: int, budget_s: float, clock):
    """Best TFLOP/s of (rows×k)·(k×n) in `tdtype` within budget_s, rows ≤ m. Rows start small and
    double (up to m) while one product takes under a third of the slice, so a dtype that is
    emulated and 20× slower costs no more time than a fast one; then the best of repeats."""
    deadline = clock() + budget_s
    rows = min(m, 64)
    b = torch.randn(n, k, dtype=tdtype, device=dev)  # an nn.Linear weight: (out, in), used transposed
    while True:
        a = torch.randn(rows, k, dtype=tdtype, device=dev)
        _one(torch, a, b, on_cuda, clock)  # warm-up at this size
        one = _one(torch, a, b, on_cuda, clock)
        # The model's own m when it fits: an emulated dtype's fixed per-call cost (converting the
        # weight) weighs less at more rows, so fewer rows would understate its rate.
        if rows >= m or one * 2 > budget_s / 3 or clock() + 4 * one > deadline:
            break
        rows = min(m, rows * 2)
    if one > budget_s:
        return None
    best, reps = one, 1
    while reps < 50 and (clock() + best < deadline or reps < 3):
        best = min(best, _one(torch, a, b, on_cuda, clock))
        reps += 1
    return {"k": k, "n": n, "m": rows, "tflops": 2.0 * rows * k * n / best / 1e12, "reps": reps}


def _one(torch, a, b, on_cuda: bool, clock) -> float:
    """Seconds of one product as nn.Linear computes it (F.linear: a · bᵀ, the layout and kernel the
    model uses; a contiguous (k, n) matmul can take another, much slower path, e.g. emulated
    bf16 on a CPU): CUDA events on the tensors' stream, else wall time."""
    linear = torch.nn.functional.linear
    if on_cuda:
        stream = torch.cuda.current_stream(a.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        linear(a, b)
        end.record(stream)
        end.synchronize()
        return max(start.elapsed_time(end) / 1000.0, 1e-9)
    t = clock()
    linear(a, b)
    return max(clock() - t, 1e-9)


def fwd_bwd_in(model, args: tuple, kwargs: dict, device: str, dtype: str):
    """One forward+backward of the eager model in `dtype` (bf16/fp16 by autocast; fp32/tf32
    without, TF32 off/on on CUDA), its gradients added into the ones there, as a gradient-
    accumulation loop's micro-steps after the first do: a variant for pairs' rounds (the caller
    drops the gradients after them). Setting them to None before each call timed a fresh
    allocation of every gradient, which the loop's micro-steps mostly do not pay: on the
    advice_repeat precision scenario (8 micro-steps, fp32 ~9 ms each) the rounds' fp32/bf16 ratio
    read 0.164 where the plain script's was ~0.150, and the promise sat 1-2 points of the step under
    what the fix achieved in 3 of 5 quiet runs."""
    from gpuprof.measure.cuda import is_cuda
    from gpuprof.measure.microbatch import loss_of
    from gpuprof.measure.pairs import autocast_for
    from gpuprof.measure.precision import tf32_matmul

    tf32 = is_cuda(device) and dtype in ("fp32", "tf32")

    def run():
        with tf32_matmul(dtype == "tf32") if tf32 else contextlib.nullcontext(), autocast_for(device, dtype):
            out = model(*args, **kwargs)
        loss = loss_of(out)
        if loss is None:
            raise RuntimeError("the model returned no loss tensor")
        loss.float().mean().backward()

    run.__name__ = f"fwd_bwd_{dtype}"
    return run


def time_steps_paired(model, example_args, device: str, current: str, other: str, seconds: float,
                      example_kwargs=None, *, min_rounds: int = 2, clock=None, now=time.perf_counter) -> dict:
    """The model's forward+backward on the run's micro-batch in the run's dtype (`current`) and
    in `other`, eagerly, in paired rounds (pairs.alternate_rounds: a warm-up of each, then rounds
    of one of each in ABBA order within `seconds`, at least `min_rounds`, up to 16, stopping
    early once the interval is `high`). In each round a way runs RUN_CALLS calls in a row, as the
    loop's micro-steps run, and the calls after the first are timed (their seconds per call):
    timed straight after the other way, a call runs cold. On this project's EPYC VM (the fixture's
    GPT, one thread; benchmarks/alternation_bias.py) an fp32 forward+backward after a bf16 one took
    9.04 ms, then 8.53, 8.23, 8.13, 8.13, 8.01 ms as the 2nd-6th in a row (batch 1 x 64: 3.62, then
    3.27, 3.15, 3.08 ms); one call of each way per round had put the promise under the achieved
    saving in 9 of 10 quiet runs, and one untimed call before a timed one still in 4 of 10
    (docs/measurements/2026-12-03-advice-repeat.md). Returns the interval of other/current
    (measure/paired.py, the sign-test interval) as a dict, the rounds, each round's seconds per
    call per dtype, the median seconds of each, and a round's planned seconds (`round_s`, its
    untimed calls included). Raises TimeoutError when the warm-up leaves no room
    for 2 rounds. Gradients it creates are dropped."""
    from gpuprof.measure.paired import confidence, interval_from_rounds
    from gpuprof.measure.pairs import Clock, alternate_rounds, rng_kept, round_seconds
    from gpuprof.stats import median

    args, kwargs = tuple(example_args or ()), dict(example_kwargs or {})
    variants = {d: [fwd_bwd_in(model, args, kwargs, device, d)] * RUN_CALLS for d in (current, other)}
    timed = RUN_CALLS - 1

    def decided(res):
        return confidence(interval_from_rounds(res, current, other)) == "high"

    was_training = model.training
    model.train()
    try:
        with _class_forward(model), rng_kept(device):
            res = alternate_rounds(clock or Clock(device), variants, seconds, now,
                                   min_rounds=min_rounds, until=decided, lead_in=1)
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    iv = interval_from_rounds(res, current, other)
    secs = {d: [s / timed for s in round_seconds(res, d)] for d in (current, other)}  # per call
    return {"interval": iv.as_dict(), "rounds": res["rounds"], "round_seconds": secs, "ratio": iv.estimate,
            "calls_per_round": RUN_CALLS, "round_s": RUN_CALLS * sum(median(v) for v in secs.values()),
            "median_s": {d: median(v) for d, v in secs.items()}}
