"""The model's own forward+backward timed as it runs and with its attention changed, in paired
rounds after the run (measure/kernels.py's attention part): torch's nn.MultiheadAttention with
need_weights=False forced on its calls (attention-need-weights), and the user's attention by hand
computed through F.scaled_dot_product_attention inside the model (attention-by-hand,
measure/attention_rewrite.py; issue #41). The whole model, not the attention alone: the layers
timed alone on fresh tensors missed what the model's own layouts, masks and memory cost (4
nn.MultiheadAttention modules on this project's CPU differed by -0.4 to +1.1 ms alone, the model
around them by 3.9 ms; one by-hand layer alone claimed 9-12% of a step SDPA made 20.8% faster).

Both ways run on the run's micro-batch, under the run's autocast, in train mode; the model's
gradients, buffers (running statistics) and train/eval mode are put back as they were.
"""

from __future__ import annotations

import contextlib
import time

from gpuprof.measure.paired import ADVISED_ROUNDS
from gpuprof.measure.pair_rounds import device_of, rounds_words, timed_pair
from gpuprof.measure.pairs import Clock, how

MODEL_ROUNDS_COST = 2 + 2 * ADVISED_ROUNDS  # a warm-up of each way, then ADVISED_ROUNDS rounds of both


@contextlib.contextmanager
def model_kept(model):
    """The model's gradients (set to None inside), buffers and mode, put back on the way out."""
    import torch

    modes = [(m, m.training) for m in model.modules()]  # each its own: a frozen norm stays in eval
    grads = {p: p.grad for p in model.parameters()}
    buffers = [(buf, buf.detach().clone()) for buf in model.buffers()]
    try:
        for p in grads:
            p.grad = None
        yield
    finally:
        for m, training in modes:
            m.training = training
        with torch.no_grad():
            for p, g in grads.items():
                p.grad = g
            for buf, saved in buffers:
                buf.copy_(saved)


def model_autocast(device, autocast_dtype):
    """The run's autocast (a torch dtype, or None: none) on `device`, as its forward ran it."""
    import torch

    return (torch.autocast(device_of(device).type, dtype=autocast_dtype) if autocast_dtype is not None
            else contextlib.nullcontext())


def time_model_ways(model, args: tuple, kwargs: dict, device, autocast_dtype, changed, changed_name: str,
                    seconds: float, *, clock=None, now=time.perf_counter) -> dict:
    """The model's forward+backward as it runs (`by_hand_*`, forward "as_run_forward") and with
    the forward inside `changed()`, a context manager (`sdpa_*`, forward `changed_name`), in paired
    rounds (pair_rounds.timed_pair: the medians, and the interval of sdpa ÷ by_hand)."""
    from gpuprof.measure.microbatch import loss_of

    ac = model_autocast(device, autocast_dtype)
    state: dict = {}

    def forward(change: bool):
        def run():
            with ac, (changed() if change else contextlib.nullcontext()):
                state["loss"] = loss_of(model(*args, **kwargs)).float().mean()
        run.__name__ = changed_name if change else "as_run_forward"
        return run

    def backward(way: str):
        def run():
            state.pop("loss").backward()
            model.zero_grad(set_to_none=True)
        run.__name__ = f"{way}_backward"
        return run

    with model_kept(model):
        model.train()
        out = timed_pair(clock or Clock(device), {"by_hand": [forward(False), backward("by_hand")],
                                                  "sdpa": [forward(True), backward("sdpa")]},
                         "by_hand", "sdpa", seconds, now)
    hand, fused = out["median_parts"]["by_hand"], out["median_parts"]["sdpa"]
    return {"by_hand_forward_s": hand[0], "by_hand_backward_s": hand[1], "sdpa_forward_s": fused[0],
            "sdpa_backward_s": fused[1], "rounds": out["rounds"], "interval": out["interval"],
            "round_seconds": out["round_seconds"], "per": "model"}


def time_need_weights(model, args: tuple, kwargs: dict, device, autocast_dtype, seconds: float, *,
                      clock=None, now=time.perf_counter) -> dict:
    """The model's forward+backward with its nn.MultiheadAttention calls as they run (need_weights
    =True: `by_hand_*`) and with need_weights=False forced on every one of them (`sdpa_*`: a forward
    pre-hook that rewrites the argument, on the modules only while that forward runs). Raises when
    the model fails without the weights (it uses them)."""
    import torch

    mods = [m for m in model.modules() if isinstance(m, torch.nn.MultiheadAttention)]

    def no_weights(module, a, kw):
        if len(a) > 4:  # forward(query, key, value, key_padding_mask, need_weights, ...)
            return (*a[:4], False, *a[5:]), kw
        return a, {**kw, "need_weights": False}

    @contextlib.contextmanager
    def without_weights():
        handles = [m.register_forward_pre_hook(no_weights, with_kwargs=True) for m in mods]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    out = time_model_ways(model, args, kwargs, device, autocast_dtype, without_weights, "no_weights_forward",
                          seconds, clock=clock, now=now)
    return {**out, "modules": len(mods)}


def _output_tensors(out, depth: int = 0) -> list:
    """The floating tensors of a model's output, in order: a tensor, a tuple/list, a dict or an HF
    ModelOutput (a dict), nested a few levels."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out] if out.is_floating_point() else []
    if depth > 3:
        return []
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _output_tensors(o, depth + 1)]
    return []


def _outputs_agree(a: list, b: list, tol: float) -> str | None:
    """None when every output tensor through SDPA is the model's own within `tol` (relative, and
    absolute on the tensor's largest value); else what differs."""
    if len(a) != len(b):
        return f"{len(b)} output tensors through SDPA, {len(a)} as it runs"
    for i, (x, y) in enumerate(zip(a, b)):
        if x.shape != y.shape:
            return f"output {i}: shape {tuple(y.shape)} through SDPA, {tuple(x.shape)} as it runs"
        x, y = x.detach().float(), y.detach().float()
        scale = max(1.0, float(x.abs().max())) if x.numel() else 1.0
        if x.numel() and not bool(((x - y).abs() <= tol * scale + tol * x.abs()).all()):
            worst = float((x - y).abs().max())
            return f"output {i} {tuple(x.shape)}: differs by up to {worst:.3g} (largest value {scale:.3g})"
    return None


def check_rewrite(model, args: tuple, kwargs: dict, device, autocast_dtype, shapes) -> tuple[float, float, int]:
    """The model's output as it runs and with its by-hand attention at `shapes` through SDPA
    (attention_rewrite.SdpaRewrite), in eval mode (no dropout) under no_grad, the model's gradients,
    buffers and mode put back: (loss as it runs, loss through SDPA, calls rewritten). Every floating
    tensor of the output (the logits too, element by element, not only the loss they average to) must
    agree within 1e-4 in fp32, 2e-2 under autocast (relative, and absolute on the tensor's largest
    value), else Unrewritable."""
    import torch

    from gpuprof.measure.attention_rewrite import SdpaRewrite, Unrewritable
    from gpuprof.measure.microbatch import loss_of

    ac = model_autocast(device, autocast_dtype)

    def run(rewrite: bool) -> tuple[float, list, int]:
        mode = SdpaRewrite(shapes) if rewrite else contextlib.nullcontext()
        with ac, mode:
            out = model(*args, **kwargs)
        value = loss_of(out)
        if value is None:
            raise Unrewritable("the model returned no loss tensor")
        return float(value.float().mean()), _output_tensors(out), (mode.rewritten if rewrite else 0)

    with model_kept(model), torch.no_grad():
        model.eval()
        a, out_a, _ = run(False)
        b, out_b, layers = run(True)
    if not layers:
        raise Unrewritable("no attention by hand was met in the model's forward")
    tol = 2e-2 if autocast_dtype is not None else 1e-4
    if not abs(a - b) <= tol * max(1.0, abs(a)):
        raise Unrewritable(f"the loss through SDPA ({b:.6g}) is not the model's ({a:.6g})")
    differs = _outputs_agree(out_a, out_b, tol)
    if differs:
        raise Unrewritable(f"the model's output through SDPA is not its own: {differs}")
    return a, b, layers


def time_model_sdpa(model, args: tuple, kwargs: dict, device, autocast_dtype, shapes, seconds: float, *,
                    clock=None, now=time.perf_counter) -> dict:
    """The model's forward+backward as it runs (`by_hand_*`) and with its by-hand attention at
    `shapes` ((B·H, T, D) each) computed through SDPA (`sdpa_*`, attention_rewrite.SdpaRewrite).
    First the rewrite is checked: in eval mode (no dropout) the loss both ways must agree (1e-4
    relative in fp32, 2e-2 under autocast), else Unrewritable. Raises Unrewritable, TimeoutError,
    or what the model raises."""
    from gpuprof.measure.attention_rewrite import SdpaRewrite

    a, b, layers = check_rewrite(model, args, kwargs, device, autocast_dtype, shapes)
    reads: dict = {}  # the mask's and fill value's readings (host syncs on CUDA): the first forward's, reused
    out = time_model_ways(model, args, kwargs, device, autocast_dtype, lambda: SdpaRewrite(shapes, causal_cache=reads),
                          "sdpa_forward", seconds, clock=clock, now=now)
    return {**out, "layers_rewritten": layers, "check_loss": [a, b]}


def time_model(ctx, own: list[dict], seconds: float) -> dict:
    """The model timed as it runs and with its attention by hand through SDPA (time_model_sdpa),
    for the op trace's by-hand calls `own`; {"not_measured": why} when its rounds do not fit
    `seconds` or the rewrite fails (the caller then times the layers alone)."""
    from gpuprof.measure.attention_rewrite import Unrewritable
    from gpuprof.measure.budget import per_micro_s

    t_micro = per_micro_s(ctx)
    if not t_micro or MODEL_ROUNDS_COST * t_micro > seconds:
        return {"not_measured": (f"{ADVISED_ROUNDS} paired rounds of the model's forward+backward (~{t_micro:.2f} s "
                                 f"each) do not fit the {seconds:.1f} s left") if t_micro else
                "the run's forward+backward was not measured"}
    shapes = {(c["shape"][0] * c["shape"][1], c["shape"][2], c["shape"][3]) for c in own}
    try:
        timing = time_model_sdpa(ctx.model, tuple(ctx.example_args or ()), dict(ctx.example_kwargs or {}),
                                 ctx.device, ctx.autocast_dtype, shapes, seconds)
    except Unrewritable as exc:
        return {"not_measured": f"the attention could not be computed through SDPA in the model: {exc}"}
    except Exception as exc:  # noqa: BLE001 - out of memory, a model that refuses: the layers alone are timed
        return {"not_measured": f"the model timed both ways failed: {exc.__class__.__name__}: {exc}"}
    timing["method"] = ("the model's forward+backward on the run's micro-batch as it runs and with its attention "
                        "by hand computed through F.scaled_dot_product_attention (the same q, k, v, mask, scale and "
                        "dropout; the loss both ways checked equal first), " + rounds_words(timing, "SDPA ÷ by hand")
                        + "; " + how(ctx.device))
    return timing
