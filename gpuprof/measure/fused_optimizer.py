"""Adam/AdamW as the run configured it and with fused=True, timed on a copy of its parameters
(measure/kernels.py's optimizer part): how it steps (for-loop, foreach, fused), whether torch has
a fused kernel for its parameters, whether two copies fit in memory, and the pair timed in paired
rounds (measure/pair_rounds.py: the medians, with the interval of fused ÷ as configured)."""

from __future__ import annotations

import time

from gpuprof.measure.pair_rounds import rounds_words, timed_pair
from gpuprof.measure.pairs import Clock, how


def optimizer_mode(opt) -> str | None:
    """How an Adam/AdamW steps: 'fused', 'foreach' or 'for-loop' (torch's default resolved the
    way step() resolves it); None for another optimizer."""
    import torch

    if type(opt) not in (torch.optim.Adam, torch.optim.AdamW):
        return None
    d = opt.defaults
    if d.get("fused"):
        return "fused"
    if d.get("foreach") is not None:
        return "foreach" if d["foreach"] else "for-loop"
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = [p for g in opt.param_groups for p in g["params"]]
    _, foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)
    return "foreach" if foreach else "for-loop"


def fused_available(opt) -> str | None:
    """Why fused=True is not available for this optimizer's parameters (None: it is)."""
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    devices = set(_get_fused_kernels_supported_devices())
    for g in opt.param_groups:
        for p in g["params"]:
            if p.device.type not in devices:
                return f"no fused kernel for {p.device.type} parameters in this torch"
            if not p.is_floating_point():
                return "non-floating-point parameters"
    if opt.defaults.get("differentiable"):
        return "differentiable=True"
    return None


COPIES = 8  # tensors of the parameters' size the timing holds: grads, and per copy params + 2 states (+2 amsgrad)


def optimizer_memory(opt) -> tuple[int, int | None]:
    """(bytes the timing needs, bytes free where the parameters are: CUDA mem_get_info, else the
    host's available memory; None when unknown)."""
    import psutil
    import torch

    params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
    need = COPIES * sum(p.numel() * p.element_size() for p in params)
    dev = params[0].device if params else torch.device("cpu")
    try:
        free = torch.cuda.mem_get_info(dev)[0] if dev.type == "cuda" else psutil.virtual_memory().available
    except Exception:  # noqa: BLE001
        free = None
    return need, free


def time_optimizer(opt, device, seconds: float, *, clock=None, now=time.perf_counter) -> dict:
    """One step of a copy of `opt`'s parameters as configured and with fused=True: the medians of
    paired rounds (pair_rounds.timed_pair), with the interval of fused ÷ current."""
    import torch

    cls = type(opt)
    groups = [g for g in opt.param_groups if any(p.requires_grad for p in g["params"])]
    params = [[p for p in g["params"] if p.requires_grad] for g in groups]
    grads = [[torch.randn_like(p) * 1e-3 for p in ps] for ps in params]

    def build(fused: bool):
        copy = []
        for g, ps, gs in zip(groups, params, grads):
            hyper = {k: v for k, v in g.items() if k != "params"}
            if fused:
                hyper.update(fused=True, foreach=False)
            clones = []
            for p, gr in zip(ps, gs):
                c = p.detach().clone().requires_grad_(True)
                c.grad = gr  # shared by both copies: Adam/AdamW never write to a gradient
                clones.append(c)
            copy.append({**hyper, "params": clones})
        return cls(copy)

    def stepper(o, name: str):
        def run():
            o.step()
        run.__name__ = f"{name}_step"
        return run

    variants = {}
    for name, fused in (("current", False), ("fused", True)):
        o = build(fused)
        o.step()  # the first step creates the state (exp_avg, exp_avg_sq): not timed
        variants[name] = [stepper(o, name)]
    out = timed_pair(clock or Clock(device), variants, "current", "fused", seconds, now)
    count = sum(p.numel() for ps in params for p in ps)
    return {"current_s": out["median_parts"]["current"][0], "fused_s": out["median_parts"]["fused"][0],
            "rounds": out["rounds"], "interval": out["interval"], "round_seconds": out["round_seconds"],
            "parameters": count}


def optimizer_part(ctx, seconds: float, skipped: list[str]) -> dict | None:
    opt = getattr(ctx, "optimizer", None)
    if opt is None:
        return None
    try:
        return _optimizer_timed(ctx, opt, seconds, skipped)
    except Exception as exc:  # noqa: BLE001 - an optimizer torch's private helpers do not know
        return {"class": type(opt).__name__, "not_measured": f"{exc.__class__.__name__}: {exc}"}


def _optimizer_timed(ctx, opt, seconds: float, skipped: list[str]) -> dict:
    from gpuprof.units import gib

    mode = optimizer_mode(opt)
    out = {"class": type(opt).__name__, "mode": mode}
    if mode is None or mode == "fused":
        return out
    why = fused_available(opt)
    if why:
        out["fused_unavailable"] = why
        return out
    mem_need, mem_free = optimizer_memory(opt)
    if mem_free is not None and mem_need > 0.8 * mem_free:
        out["timing"] = {"not_measured": (f"two copies of the parameters with their state need {gib(mem_need)}, "
                                          f"{gib(mem_free)} is free")}
        return out
    need = optimizer_need(ctx)
    if seconds < 0.05 or need > seconds:
        skipped.append("optimizer timed fused")
        out["timing"] = {"not_measured": (f"~{need:.1f} s needed, {seconds:.1f} s left in the post-run budget"
                                          if need else f"no time left in the post-run budget ({seconds:.2f} s)")}
        return out
    try:
        out["timing"] = time_optimizer(opt, ctx.device, seconds)
        out["timing"]["method"] = ("one step of a copy of the parameters (fresh gradients) with the run's optimizer "
                                   "settings and with fused=True, after a state-creating step each, "
                                   + rounds_words(out["timing"], "fused ÷ as configured") + "; " + how(ctx.device))
    except TimeoutError as exc:
        skipped.append("optimizer timed fused")
        out["timing"] = {"not_measured": str(exc)}
    except Exception as exc:  # noqa: BLE001 - e.g. no memory for a copy of the parameters
        out["timing"] = {"not_measured": f"{exc.__class__.__name__}: {exc}"}
    return out


def optimizer_need(ctx, rounds: int = 2) -> float:
    """Seconds timing the optimizer both ways takes: 2 variants × (a state-creating step, a
    warm-up, `rounds` timed rounds: 2, the least, by default) of the run's own optimizer phase; 0
    when it will not be timed."""
    opt = getattr(ctx, "optimizer", None)
    profile = getattr(ctx, "profile", None)
    if opt is None or profile is None or optimizer_mode(opt) in (None, "fused"):
        return 0.0
    return 2 * (2 + rounds) * profile.stats.seconds("optimizer")
