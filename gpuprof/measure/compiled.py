"""What torch.compile would save on an eager run, measured when the user allows the time a
compile takes (`diagnose --measure-compile`).

After the run, the run's own eager model is compiled (`torch.compile(model)`, the default
inductor backend and mode, as nanoGPT's `compile = True` does), one forward+backward at the
run's micro-batch compiles it (that time is the compile's cost, reported), then eager and
compiled forward+backward are timed in paired rounds (measure/pair_rounds.py: ABBA, at least 8
when they fit, stopping once the interval is decided; CUDA events on a GPU, else wall time): the
medians of each, and the interval of compiled ÷ eager. `rules/gpu.py`'s compile-missing applies
that ratio to the run's own forward+backward.

It runs after the budgeted post-run parts and outside their budget: compiling GPT-2 takes about
a minute on a GPU (nanoGPT's README) and longer on a CPU, which is why it is asked for, never
automatic. The compiled wrapper shares the model's parameters; the gradients it leaves are
dropped, as the micro-batch curve's are. dynamo's records of the run (measure/dynamo.py) were
closed before: this compile is not counted as the run's.
"""

from __future__ import annotations

import contextlib
import time

from gpuprof.measure.paired import ADVISED_ROUNDS
from gpuprof.measure.pair_rounds import rounds_words, timed_pair
from gpuprof.measure.pairs import Clock, how, rng_kept
from gpuprof.measure.sharding import refusal

ROUNDS_S = 10.0  # the timed rounds after the compile: this, or what ADVISED_ROUNDS rounds need
ROUND_MARGIN = 1.25  # a round (eager + compiled) taken as 2 eager calls, with this margin


def time_compiled(model, args: tuple, kwargs: dict, device: str, autocast_dtype, *, backend="inductor",
                  mode=None, seconds: float = ROUNDS_S, clock=None, now=time.perf_counter) -> dict:
    """{eager_s, compiled_s, compile_s, rounds, interval, round_seconds}: forward+backward of the
    model eager and compiled, the medians of paired rounds and the interval of compiled ÷ eager.
    The rounds get at least what a warm-up and ADVISED_ROUNDS rounds take (one eager call sizes
    them): never waste the compile on a slice too short for an interval."""
    import torch

    from gpuprof.measure.cuda import is_cuda
    from gpuprof.measure.microbatch import loss_of

    timer = Clock(device)
    ac = (torch.autocast("cuda" if is_cuda(device) else "cpu", dtype=autocast_dtype)
          if autocast_dtype is not None else contextlib.nullcontext())
    compiled = torch.compile(model, backend=backend, mode=mode)
    was_training = model.training
    model.train()

    def step(fn, name: str):
        def run():
            with ac:
                loss = loss_of(fn(*args, **kwargs))
            if loss is None:
                raise RuntimeError("the model returned no loss tensor")
            loss.float().mean().backward()
            model.zero_grad(set_to_none=True)
        run.__name__ = name
        return run

    try:
        t0 = time.perf_counter()
        step(compiled, "compiled")()  # compiles the forward and, at its backward, the backward
        timer.sync()
        compile_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        step(model, "eager")()  # one eager call sizes the rounds
        timer.sync()
        one_round = 2 * (time.perf_counter() - t1) * ROUND_MARGIN
        seconds = max(seconds, (1 + ADVISED_ROUNDS) * one_round)
        out = timed_pair(clock or timer, {"eager": [step(model, "eager")], "compiled": [step(compiled, "compiled")]},
                         "eager", "compiled", seconds, now)
    finally:
        model.train(was_training)
        model.zero_grad(set_to_none=True)
    return {"eager_s": out["median_parts"]["eager"][0], "compiled_s": out["median_parts"]["compiled"][0],
            "compile_s": compile_s, "rounds": out["rounds"], "interval": out["interval"],
            "round_seconds": out["round_seconds"], "backend": backend, "mode": mode}


class CompileProbe:
    """--measure-compile: the eager run's model compiled after the run → measurements['compile']."""

    name = "compile"

    def __init__(self, backend: str = "inductor", seconds: float = ROUNDS_S):
        self.backend = backend
        self.seconds = seconds

    def start(self, ctx) -> None:
        return None

    def stop(self, ctx) -> dict | None:
        cfg = ctx.config if isinstance(ctx.config, dict) else vars(ctx.config)
        if getattr(ctx, "model", None) is None:
            return {"not_measured": "no eager model"}
        if cfg.get("compile"):
            return {"not_measured": "the run is already compiled"}
        if "compile" in getattr(ctx, "experimented", ()):  # a second compile would time what the loop did
            return {"not_measured": "measured on the loop's own steps (experiment steps)"}
        sharded = refusal(getattr(ctx, "sharding", None))
        if sharded:
            return {"not_measured": sharded}
        budget = getattr(ctx, "budget", None)
        if budget is not None and budget.interrupted:
            return {"not_measured": "interrupted (Ctrl-C or the launcher) after the run"}
        if budget is not None:
            budget.say(f"compiling the model to time it (--measure-compile; outside the {budget.total_s:.0f} s budget)")
        try:
            with rng_kept(ctx.device):
                out = time_compiled(ctx.model, tuple(ctx.example_args or ()), dict(ctx.example_kwargs or {}),
                                    ctx.device, ctx.autocast_dtype, backend=self.backend, seconds=self.seconds)
        except Exception as exc:  # noqa: BLE001 - a model dynamo or inductor cannot compile
            return {"not_measured": f"compile failed: {exc.__class__.__name__}: {exc}"[:500]}
        out["method"] = ("the run's eager model and torch.compile(model) (default mode), forward+backward at the run's "
                         "micro-batch, after one compiling call, " + rounds_words(out, "compiled ÷ eager") + "; "
                         + how(ctx.device))
        return out
