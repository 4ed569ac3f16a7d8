"""Micro-batch efficiency curve: forward+backward time at a few micro-batch sizes.

After the measured steps, time one forward+backward of the eager model at sizes around the
run's micro-batch B (1, B/2, B, 2B, and 4 when B is smaller; larger ones only while they fit) and fit
    t(b) = fixed + per_sample * b
by a robust line fit (Theil-Sen). `fixed` is the cost every micro-step pays whatever its size (Python, kernel
launches, small-op overhead); it is what fewer, larger micro-steps save. Runs after the loop,
so it never disturbs the measured steps; gradients it creates are dropped.

The saving micro-batch-too-small claims (rules/batching.py) is timed on its own, in paired rounds
(`time_pair`): the run's micro-batch B, b2/B times, against one micro-batch of b2, the same
tokens, alternately (pairs.alternate_rounds, ABBA), with a sign-test interval for their ratio
(measure/paired.py). The curve fires the rule (its fixed cost); the rounds say what the change
saves and how sure that is.
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


CURVE_SHARE = 0.5  # of the part's seconds, the curve at most; the paired rounds get the rest
# The paired rounds are timed whatever the curve's fixed share: a gate on that one unpaired figure
# (5% of a micro-step until 2026-12-03) left a run just under it with "costs little" and no
# interval where its neighbours claimed a saving (issue #29: the fix vanished from one run of five);
# the rounds' interval decides, a saving or "within this machine's noise".
PAIR_MAX_FACTOR = 8  # the larger micro-batch timed at most 8 x B (memory: 8 x the activations)
PAIR_MARGIN = 1.25  # a paired round's seconds, planned from the run's own: room for a slower moment


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
        t0 = time.perf_counter()
        t_b = per_micro_s(ctx)
        sizes, left_out = plan_sizes(batch, t_b, allotted * CURVE_SHARE, self.reps)
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
        n = getattr(getattr(getattr(ctx, "profile", None), "stats", None), "micro_steps", None) or 1
        # The rounds are planned on the slower of the run's micro-step and the curve's own at the
        # run's size: the curve runs the eager model, which for a compiled run can take several
        # times the run's (a compiled GPT's 25 ms micro-step took 36-110 ms eager on this project's
        # VM, and rounds planned on 25 ms spent 19.5 s of the 10.8 s allotted).
        eager = next((pt.get("seconds") for pt in out.get("points") or [] if pt.get("batch_size") == batch), None)
        t_plan = max(t_b, eager or 0.0)
        out["pair"] = self._pair(ctx, args, kwargs, out, n, t_plan, allotted - (time.perf_counter() - t0), skipped)
        budget.done(self.name, skipped)
        return out

    def _pair(self, ctx, args, kwargs, curve: dict, micro_steps: int, t_b: float, seconds: float,
              skipped: list[str]) -> dict:
        """The run's micro-batch against the largest larger one that keeps the tokens exact and
        fits the seconds left, in paired rounds; or why not."""
        from gpuprof.measure.paired import ADVISED_ROUNDS

        batch = curve["batch_size"]
        if not pair_sizes(batch, micro_steps):
            return {"not_measured": "no larger micro-batch keeps the tokens per step exact"}
        b2, rounds = plan_pair(batch, micro_steps, t_b, seconds)
        if b2 is None:
            skipped.append("the paired rounds of a larger micro-batch")
            return {"not_measured": f"the paired rounds do not fit the {max(seconds, 0):.1f} s left"}
        try:
            out = time_pair(ctx.model, args, kwargs, ctx.device, ctx.autocast_dtype, b2, seconds,
                            min_rounds=min(rounds, ADVISED_ROUNDS))
            if out["rounds"] < ADVISED_ROUNDS:
                skipped.append(f"paired rounds of micro-batch {b2}: {out['rounds']} of {ADVISED_ROUNDS} fit")
            return out
        except Exception as exc:  # noqa: BLE001 - out of memory, or a model that refuses the size
            if on_cuda_oom(exc):
                torch.cuda.empty_cache()
            return {"new_batch_size": b2, "not_measured": f"{exc.__class__.__name__}: {exc}"}


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


def pair_sizes(batch: int, micro_steps: int) -> list[int]:
    """The larger micro-batches that keep the tokens per step exact: B·2^k dividing n·B (n
    micro-steps become n·B/b2), up to PAIR_MAX_FACTOR·B, smallest first."""
    out, b2 = [], batch * 2
    while b2 <= min(micro_steps, PAIR_MAX_FACTOR) * batch and micro_steps * batch % b2 == 0:
        out.append(b2)
        b2 *= 2
    return out


def plan_pair(batch: int, micro_steps: int, t_batch_s: float, seconds: float) -> tuple[int | None, int]:
    """(b2, rounds): the largest of pair_sizes whose warm-up and ADVISED_ROUNDS paired rounds fit
    `seconds` (a round: one untimed micro-step of B, then b2/B of them; one untimed of b2, then
    one: ≈ (3·(b2/B) + 1)·t(B)); else the smallest
    with what fits (at least 2 rounds, too few for an interval: the rule then says so); (None, 0)
    when not even that fits or t(B) is unknown."""
    from gpuprof.measure.paired import ADVISED_ROUNDS

    sizes = pair_sizes(batch, micro_steps)
    if not sizes or not t_batch_s:
        return None, 0
    def one_round(b2):
        return (3 * (b2 / batch) + 1) * t_batch_s * PAIR_MARGIN
    fit = [b2 for b2 in sizes if (1 + ADVISED_ROUNDS) * one_round(b2) <= seconds]
    if fit:
        return fit[-1], ADVISED_ROUNDS
    rounds = int(seconds / one_round(sizes[0])) - 1
    return (sizes[0], rounds) if rounds >= 2 else (None, 0)


def on_cuda_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError)


SETTLE_SHARE = 0.3  # at most this share of the pair's seconds goes to settling each way
SETTLE_AGREE = 0.10  # two consecutive calls within 10% of each other: settled
SETTLE_MAX_CALLS = 6


def settle(clock, fns, seconds: float, now, total: float | None = None) -> float:
    """Call each fn until two consecutive calls agree within SETTLE_AGREE (at most
    SETTLE_MAX_CALLS, and not past `seconds` in all); the seconds spent. With `total` (the
    seconds the rounds that follow share with it), it also stops while the rest still holds the
    warm-up and 2 rounds that pairs.alternate_rounds needs (3 rounds at the latest calls' pace)."""
    t0 = now()
    latest: dict = {}
    for fn in fns:
        prev = None
        for _ in range(SETTLE_MAX_CALLS):
            took = sum(clock.spans(fn))
            latest[fn] = took
            if prev is not None and abs(took - prev) <= SETTLE_AGREE * max(took, prev):
                break
            prev = took
            spent = now() - t0
            one_round = sum(latest.values()) + max(latest.values()) * (len(fns) - len(latest))
            if spent >= seconds or (total is not None and total - spent < 4 * one_round):
                return spent
    return now() - t0


def time_pair(model, args: tuple, kwargs: dict, device: str, autocast_dtype, b2: int, seconds: float, *,
              min_rounds: int = 2, clock=None, now=time.perf_counter) -> dict:
    """The run's micro-batch B, b2/B micro-steps (one optimizer step's worth of its
    accumulation), against one micro-step of b2: the same tokens, forward+backward each,
    gradients accumulated as the run does, in paired rounds (pairs.alternate_rounds, ABBA, up to
    16, at least `min_rounds`, stopping once the interval is `high`). In each round each way is
    timed after an untimed call of its own shape (a micro-step of B; one of b2), as the loop runs
    it after its own: timed straight after the other way, the larger call ran cold (benchmarks/
    alternation_bias.py, the fixture's GPT on this project's EPYC VM: batch 8 after the 4 x 2 way
    30.2 ms, after a batch-8 call 26.9 ms; the ratio 0.984 where each after its own gave 0.890).
    Returns the sizes, the interval of larger/run (Interval.as_dict), the rounds, each round's
    seconds, and a round's planned seconds (`round_s`, its untimed calls included)."""
    from gpuprof.measure.paired import confidence, interval_from_rounds
    from gpuprof.measure.pairs import Clock, alternate_rounds, how, rng_kept, round_seconds
    from gpuprof.stats import median

    batch = batch_size_of(args, kwargs)
    k = b2 // batch
    on_cuda = is_cuda(device)

    def cut(v, size):
        return _resize(v, size) if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == batch else v

    big = (tuple(cut(a, b2) for a in args), {n: cut(v, b2) for n, v in kwargs.items()})

    def fwd_bwd(a, kw):
        ctx = (torch.autocast("cuda" if on_cuda else "cpu", dtype=autocast_dtype)
               if autocast_dtype is not None else contextlib.nullcontext())
        with ctx:
            out = model(*a, **kw)
        loss = loss_of(out)
        if loss is None:
            raise RuntimeError("the model returned no loss tensor")
        loss.float().mean().backward()

    def run_way():
        model.zero_grad(set_to_none=True)
        for _ in range(k):
            fwd_bwd(args, kwargs)

    def one_micro_step():
        fwd_bwd(args, kwargs)

    def larger():
        model.zero_grad(set_to_none=True)
        fwd_bwd(*big)

    def decided(res):
        return confidence(interval_from_rounds(res, "run", "larger")) == "high"

    was_training = model.training
    model.train()
    clock = clock or Clock(device)
    try:
        with rng_kept(device):
            # The larger micro-batch's first calls pay for memory the run never needed at once (on
            # a CPU, fresh pages for every larger activation until the allocator keeps them: 378,
            # 245, 175 ms... against a steady 161 ms in one run); the script, many steps in, does
            # not. Each way is run until two calls agree, so the rounds time the steady state.
            spent = settle(clock, (larger, run_way), seconds * SETTLE_SHARE, now, total=seconds)
            res = alternate_rounds(clock, {"run": [one_micro_step, run_way], "larger": [larger, larger]},
                                   seconds - spent, now, min_rounds=min_rounds, until=decided, lead_in=1)
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)
    iv = interval_from_rounds(res, "run", "larger")
    secs = {"run": round_seconds(res, "run"), "larger": round_seconds(res, "larger")}
    run_s, larger_s = median(secs["run"]), median(secs["larger"])
    return {"batch_size": batch, "new_batch_size": b2, "micro_steps_each": k, "interval": iv.as_dict(),
            "ratio": iv.estimate, "rounds": res["rounds"], "round_seconds": secs,
            "round_s": run_s * (1 + 1 / k) + 2 * larger_s,
            "method": (f"{k} forward+backward of micro-batch {batch} against 1 of {b2} (the same tokens), "
                       f"{res['rounds']} paired rounds (ABBA) after a warm-up, each way after an untimed call of "
                       f"its own size, {how(device)}; the ratio is the median of the rounds' larger/run with its "
                       "sign-test interval")}


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
