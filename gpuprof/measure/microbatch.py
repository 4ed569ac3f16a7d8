"""Micro-batch efficiency curve: forward+backward time at a few micro-batch sizes.

After the measured steps, time one forward+backward of the eager model at sizes around the
run's micro-batch B (1, B/2, B, 2B, and 4 when B is smaller; larger ones only while they fit) and fit
    t(b) = fixed + per_sample * b
by a robust line fit (Theil-Sen). `fixed` is the cost every micro-step pays whatever its size (Python, kernel
launches, small-op overhead); it is what fewer, larger micro-steps save. Runs after the loop,
so it never disturbs the measured steps; gradients it creates are dropped.
"""

from __future__ import annotations

import contextlib
import time

import torch

from gpuprof.measure.budget import per_micro_s
from gpuprof.measure.cuda import is_cuda, synchronize as sync
from gpuprof.measure.sharding import refusal


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Theil-Sen (intercept, slope) of ys on xs: medians of pairwise slopes and of
    intercepts, so one disturbed timing on a noisy machine cannot swing the fit."""
    from gpuprof.stats import median

    pairs = [(i, j) for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[j] != xs[i]]
    if not pairs:
        raise ValueError("need at least two distinct sizes")
    slope = median((ys[j] - ys[i]) / (xs[j] - xs[i]) for i, j in pairs)
    intercept = median(y - slope * x for x, y in zip(xs, ys))
    return intercept, slope


def _sizes(batch: int, max_batch: int | None) -> list[int]:
    # Up to 2B (4 for tiny batches): enough to see the fixed cost and whether larger runs faster.
    sizes = sorted({1, max(1, batch // 2), batch, 2 * batch, max(4, batch)})
    if max_batch:
        sizes = [s for s in sizes if s <= max_batch]
    return sizes


class MicroBatchProbe:
    """Instrument: stop() measures t(b) and returns the fitted curve."""

    name = "microbatch"

    def __init__(self, reps: int = 2, budget_s: float = 4.0):
        self.reps = reps
        self.budget_s = budget_s

    def start(self, ctx) -> None:
        pass

    def stop(self, ctx) -> dict | None:
        args, kwargs = tuple(ctx.example_args or ()), dict(ctx.example_kwargs or {})
        batch = batch_size_of(args, kwargs)
        if ctx.model is None or batch is None:
            return None
        budget = getattr(ctx, "budget", None)
        sharded = refusal(getattr(ctx, "sharding", None))
        if sharded:  # timing it here would time the collectives and the waiting for peers
            if budget is not None:
                budget.done(self.name, ["the whole curve"])
            return {"not_measured": sharded, "batch_size": batch, "points": []}
        if budget is None:
            return measure_curve_inputs(ctx.model, args, kwargs, ctx.device, ctx.autocast_dtype,
                                        reps=self.reps, budget_s=self.budget_s)
        allotted = budget.allot(self.name)
        t_b = per_micro_s(ctx)
        sizes, left_out = plan_sizes(batch, t_b, allotted, self.reps)
        if len(sizes) < 2:
            why = (f"one forward+backward at micro-batch {batch} takes ~{t_b:.2f} s: two sizes "
                   f"do not fit the {allotted:.1f} s left for the curve")
            budget.done(self.name, ["the whole curve"])
            return {"not_measured": why, "batch_size": batch, "points": []}
        out = measure_curve_inputs(ctx.model, args, kwargs, ctx.device, ctx.autocast_dtype, reps=self.reps,
                                   budget_s=allotted, sizes=sizes)
        skipped = [f"micro-batch {b} (over budget)" for b in left_out]
        if out.get("stopped"):
            skipped.append(out["stopped"])
        out["skipped_sizes"] = left_out
        budget.done(self.name, skipped)
        return out


def plan_sizes(batch: int, t_batch_s: float, seconds: float, reps: int) -> tuple[list[int], list[int]]:
    """(sizes to time, sizes left out) within `seconds`, from the run's own forward+backward time
    at `batch`: the run's size and 1 first (they fix the line), then B/2, then 2B. A size's cost is
    (1 warm-up + up to 2·reps repeats) × t(b), t(b) ≈ t(B)·max(b/B, 1/4) (small sizes still pay
    the fixed cost)."""
    wanted = _sizes(batch, None)
    order = sorted(wanted, key=lambda b: (b != batch, b != 1, b != max(1, batch // 2), b))
    chosen, used = [], 0.0
    for b in order:
        cost = (1 + 2 * reps) * t_batch_s * max(b / batch, 0.25)
        if used + cost <= seconds:
            chosen.append(b)
            used += cost
        elif b == batch:  # without the run's own size the curve says nothing about the run
            return [], sorted(wanted)
    return sorted(chosen), sorted(set(wanted) - set(chosen))


def measure_curve(model, x, y, device: str, autocast_dtype=None, reps: int = 2,
                  budget_s: float = 4.0, clock=time.perf_counter, sizes: list[int] | None = None) -> dict:
    """t(b) for a model called as model(x, y) (nanoGPT's shape); see measure_curve_inputs."""
    args = (x,) if y is None else (x, y)
    return measure_curve_inputs(model, args, {}, device, autocast_dtype, reps, budget_s, clock, sizes)


def batch_size_of(args: tuple, kwargs: dict) -> int | None:
    """The micro-batch size: the leading dimension of the first tensor input."""
    t = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.dim() >= 1), None)
    return int(t.shape[0]) if t is not None else None


def loss_of(out) -> torch.Tensor | None:
    """The loss in a model's output: a scalar tensor, `.loss` (HF ModelOutput), out['loss'], or the
    first 0-dim tensor of a tuple (nanoGPT returns (logits, loss)); else a tensor output itself."""
    if isinstance(out, torch.Tensor):
        return out
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(out, (tuple, list)):
        scalars = [o for o in out if isinstance(o, torch.Tensor) and o.dim() == 0]
        if scalars:
            return scalars[0]
        return next((o for o in out if isinstance(o, torch.Tensor)), None)
    return None


def measure_curve_inputs(model, args: tuple, kwargs: dict, device: str, autocast_dtype=None, reps: int = 2,
                         budget_s: float = 4.0, clock=time.perf_counter, sizes: list[int] | None = None) -> dict:
    """Forward+backward seconds t(b) of `model(*args, **kwargs)` at micro-batch sizes b: every
    tensor input whose leading dimension is the batch is cut or repeated to b rows."""
    on_cuda = is_cuda(device)
    batch = batch_size_of(args, kwargs)
    if batch is None:
        return {"error": "no tensor input to size the micro-batch"}
    first = next(a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.dim() >= 1)
    on = first.device if first.is_cuda else device  # where the model's work runs
    ctx = (torch.autocast("cuda" if on_cuda else "cpu", dtype=autocast_dtype)
           if autocast_dtype is not None else contextlib.nullcontext())

    def cut(v, size):
        return _resize(v, size) if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == batch else v

    was_training = model.training
    model.train()
    points: list[tuple[int, float]] = []
    stopped = None
    t_start = clock()
    for size in (sizes or _sizes(batch, None)):
        a_b = tuple(cut(a, size) for a in args)
        kw_b = {k: cut(v, size) for k, v in kwargs.items()}
        try:
            times: list[float] = []
            for r in range(1 + _max_reps(reps)):
                if on_cuda:
                    sync(on)  # the measured device, never the current one
                t0 = clock()
                with ctx:
                    out = model(*a_b, **kw_b)
                loss = loss_of(out)
                if loss is None:
                    model.train(was_training)
                    return {"error": "model returned no loss tensor"}
                loss = loss.float().mean()
                loss.backward()
                if on_cuda:
                    sync(on)
                dt = clock() - t0
                if r > 0:  # the first call at a new shape is a warm-up
                    times.append(dt)
                    if len(times) >= reps and _settled(times):
                        break
            points.append((size, min(times)))
        except torch.cuda.OutOfMemoryError:
            stopped = f"micro-batch {size} does not fit in GPU memory"
            torch.cuda.empty_cache()
            break
        finally:
            model.zero_grad(set_to_none=True)
        if clock() - t_start > budget_s and size >= batch:
            stopped = f"time budget {budget_s:.0f} s reached"
            break
    model.train(was_training)
    result = {
        "method": ("min of %d-%d timed forward+backward per size (until the two fastest agree "
                   "within 10%%) after one warm-up, %s" % (
                       reps, 2 * reps, "CUDA-synchronized wall time" if on_cuda else "wall time")),
        "batch_size": batch,
        "points": [{"batch_size": b, "seconds": s} for b, s in points],
        "stopped": stopped,
    }
    if len(points) >= 2:
        fixed, per_sample = fit_line([float(b) for b, _ in points], [s for _, s in points])
        result["fixed_s"] = max(fixed, 0.0)
        result["per_sample_s"] = per_sample
        at_b = dict(points).get(batch)
        if at_b:
            result["fixed_share_at_batch"] = max(fixed, 0.0) / at_b
    return result


def _max_reps(reps: int) -> int:
    """Timed repetitions allowed per size: `reps`, and up to twice that while they disagree."""
    return 2 * reps


def _settled(times: list[float], within: float = 0.10) -> bool:
    """True when the two fastest timings agree within 10%: the minimum is then trustworthy on a
    machine where other processes only ever add time."""
    if len(times) < 2:
        return False
    a, b = sorted(times)[:2]
    return b <= a * (1 + within)


def _resize(t: torch.Tensor, size: int) -> torch.Tensor:
    """The first `size` rows of t, repeating rows when size exceeds t's batch."""
    if size <= t.shape[0]:
        return t[:size]
    reps = -(-size // t.shape[0])
    return t.repeat(reps, *([1] * (t.dim() - 1)))[:size]
