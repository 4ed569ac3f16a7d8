"""What torch.compile would save on an eager run, measured when the user allows the time a
compile takes (`diagnose --measure-compile`).

After the run, the run's own eager model is compiled (`torch.compile(model)`, the default
inductor backend and mode, as nanoGPT's `compile = True` does), one forward+backward at the
run's micro-batch compiles it (that time is the compile's cost, reported), then eager and
compiled forward+backward are timed alternately (best of each, CUDA events on a GPU, else wall
time). `rules/gpu.py`'s compile-missing applies the ratio to the run's own forward+backward.

It runs after the budgeted post-run parts and outside their budget: compiling GPT-2 takes about
a minute on a GPU (nanoGPT's README) and longer on a CPU, which is why it is asked for, never
automatic. The compiled wrapper shares the model's parameters; the gradients it leaves are
dropped, as the micro-batch curve's are. dynamo's records of the run (measure/dynamo.py) were
closed before: this compile is not counted as the run's.
"""

from __future__ import annotations

import contextlib
import time

from gpuprof.measure.pairs import Clock, alternate, how, rng_kept
from gpuprof.measure.sharding import refusal

ROUNDS_S = 10.0  # the timed rounds after the compile: at most this, at least 2 rounds


def time_compiled(model, args: tuple, kwargs: dict, device: str, autocast_dtype, *, backend="inductor",
                  mode=None, seconds: float = ROUNDS_S) -> dict:
    """{eager_s, compiled_s, compile_s, rounds}: forward+backward of the model eager and compiled."""
    import torch

    from gpuprof.measure.cuda import is_cuda
    from gpuprof.measure.microbatch import loss_of

    clock = Clock(device)
    ac = (torch.autocast("cuda" if is_cuda(device) else "cpu", dtype=autocast_dtype)
          if autocast_dtype is not None else contextlib.nullcontext())
    compiled = torch.compile(model, backend=backend, mode=mode)
    was_training = model.training
    model.train()

    def step(fn):
        def run():
            with ac:
                loss = loss_of(fn(*args, **kwargs))
            if loss is None:
                raise RuntimeError("the model returned no loss tensor")
            loss.float().mean().backward()
            model.zero_grad(set_to_none=True)
        return run

    try:
        t0 = time.perf_counter()
        step(compiled)()  # compiles the forward and, at its backward, the backward
        clock.sync()
        compile_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        step(model)()  # one eager call sizes the rounds: never waste the compile on too short a slice
        clock.sync()
        seconds = max(seconds, 8 * (time.perf_counter() - t1))
        res = alternate(clock, {"eager": [step(model)], "compiled": [step(compiled)]}, seconds)
    finally:
        model.train(was_training)
        model.zero_grad(set_to_none=True)
    return {"eager_s": res["best"]["eager"][0], "compiled_s": res["best"]["compiled"][0], "compile_s": compile_s,
            "rounds": res["rounds"], "backend": backend, "mode": mode}


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
                         "micro-batch, timed alternately after one compiling call, best of each; " + how(ctx.device))
        return out
