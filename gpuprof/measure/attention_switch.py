"""Attention by hand computed through F.scaled_dot_product_attention in the script's own loop: an
experiment step's switch (gpuprof.measure.experiments), so the SDPA saving is the paired
difference of the script's own steps, not a timing after the run carried to its step (issue #41).

The change itself is a code change for the user (q·kᵀ, mask, softmax, dropout, ·v → one SDPA
call), but attention_rewrite.SdpaRewrite makes it switchable from outside: a TorchFunctionMode,
entered around each training forward while the switch is on (the forward hooks' watchers, as
autocast is), folds the by-hand ops into one SDPA call. Before it is offered to the loop, the
model's forward is traced once (measure/optrace.py: where is the attention by hand, at which
(B·H, T, D)) and the rewrite is checked on the run's micro-batch in eval mode: the loss both ways
must agree (attention_model.check_rewrite); then one training forward under it and its backward
must run (check_training: scores used only in training, activation checkpointing recomputing the
forward without the mode); else the switch is Unavailable with the reason and the post-run timing
stands. Those forwards run between two of the script's steps with gpuprof's
training hooks suspended, the RNG, gradients, buffers and mode put back.

The mode's Python dispatch runs for every torch call of the forward (a few µs each: on a 2-ms
step of a tiny model it made the step 28% slower, the attention through SDPA or not), so the
steps as the script runs (`a`) run under the same mode with nothing to match: both ways pay it,
and the ratio compares the attention alone. The saving is then that ratio on the script's own step
(without the mode): it errs low by the dispatch's share of the step.
"""

from __future__ import annotations

import contextlib

from gpuprof.measure.switches import Switch, Unavailable

ID = "attention:sdpa"


class SdpaSwitch(Switch):
    """The user's attention by hand at `shapes` ((B·H, T, D) each) through SDPA, per forward."""

    id = ID
    per_forward = True
    both_ways = True  # entered around every forward of its experiment: off, the mode matches nothing
    phases = ("forward", "backward")  # the attention inside the model's forward, and its backward
    settings: dict = {}

    def __init__(self, shapes, calls: list[dict], check_loss: tuple[float, float], layers: int):
        self.shapes = set(shapes)
        self.calls = calls
        self.check_loss = check_loss
        self.layers = layers
        first = calls[0]
        args = ["q, k, v"]
        if first.get("masked") and first.get("causal") is not False:
            args.append("is_causal=True")
        elif first.get("masked"):
            args.append("attn_mask=mask")
        if first.get("dropout_p"):
            args.append("dropout_p=... if self.training else 0.0")
        self.fix = f"F.scaled_dot_product_attention({', '.join(args)}) in place of the attention by hand"
        self.rewritten = 0
        self.forwards_on = 0  # training forwards entered with the fix on (warm-up steps' included)
        self.short_on = 0  # of them, those that rewrote fewer calls than the traced layers
        self.errors: list[str] = []
        self._mode = None
        self._rewrite = False
        self._causal: dict = {}  # the rewrite's mask readings, shared by its forwards (no sync after the first)

    def on(self) -> None:
        self._rewrite = True

    def enter(self) -> None:
        from gpuprof.measure.attention_rewrite import SdpaRewrite

        if self._mode is None:
            # off, the same mode with no shapes to match: every torch call pays the same dispatch
            self._mode = SdpaRewrite(self.shapes if self._rewrite else set(), causal_cache=self._causal)
            self._mode.__enter__()

    def leave(self) -> None:
        from gpuprof.measure.attention_rewrite import Unrewritable

        mode, self._mode = self._mode, None
        if mode is None:
            return
        try:
            mode.__exit__(None, None, None)
        except Unrewritable as exc:  # scores computed and never used: nothing of them reached the output
            self.errors.append(str(exc))
        self.rewritten += mode.rewritten
        if mode.shapes:  # on: every traced layer's attention should have gone through SDPA
            self.forwards_on += 1
            self.short_on += mode.rewritten < self.layers

    def off(self) -> None:
        self.leave()
        self._rewrite = False

    def ineffective(self) -> str | None:
        """Why the steps with it on did not compute the attention through SDPA, if they did not."""
        if self.rewritten == 0:
            return "no attention by hand was rewritten in the steps with the fix on"
        if self.short_on:  # a batch of another length (T) than the traced one: its attention ran by hand
            return (f"{self.short_on} of {self.forwards_on} forwards with the fix on rewrote fewer than the "
                    f"{self.layers} attention layers traced (their shapes differ from the traced ones'): "
                    f"those steps did not compare SDPA with the attention by hand")
        return None

    def describe(self) -> dict:
        out = {**super().describe(), "layers": self.layers, "check_loss": list(self.check_loss),
               "rewritten": self.rewritten, "forwards_on": self.forwards_on, "calls": self.calls}
        if self.errors:
            out["errors"] = self.errors[:3]
        return out


def check_training(model, args: tuple, kwargs: dict, device, autocast_dtype, shapes) -> None:
    """One training forward under the rewrite and its backward, as a step runs them (the mode
    around the forward only), the model's modes, gradients and buffers put back: what the eval-mode
    loss check cannot see (scores used only in training, activation checkpointing recomputing the
    forward in backward without the mode) raises here, not in the user's step."""
    import torch

    from gpuprof.measure.attention_model import model_autocast, model_kept
    from gpuprof.measure.attention_rewrite import SdpaRewrite, Unrewritable
    from gpuprof.measure.microbatch import loss_of

    ac = model_autocast(device, autocast_dtype)
    with model_kept(model), torch.enable_grad():
        mode = SdpaRewrite(shapes)
        with ac, mode:
            loss = loss_of(model(*args, **kwargs))
        if loss is None:
            raise Unrewritable("the model returned no loss tensor")
        if not mode.rewritten:
            raise Unrewritable("no attention by hand was met in a training forward")
        loss.float().sum().backward()


def attention_switch(model, args: tuple, kwargs: dict, device, autocast_dtype, *, compiled: bool,
                     suspended=contextlib.nullcontext) -> Switch | None:
    """The SDPA switch for a model whose forward computes attention by hand in the user's own code
    (not torch's nn.MultiheadAttention), checked on the run's micro-batch; Unavailable (why) when
    the rewrite does not hold; None when there is no attention by hand or the model is compiled.
    `suspended()`: a context in which gpuprof's training hooks ignore these forwards."""
    from gpuprof.measure.attention_model import check_rewrite, model_kept
    from gpuprof.measure.attention_rewrite import Unrewritable
    from gpuprof.measure.kernels import trace_forward
    from gpuprof.measure.pairs import rng_kept

    if model is None or args is None or compiled:
        return None  # compiled: not rewritten inside a compiled graph (the post-run timing measures it)
    eager = getattr(model, "_orig_mod", model)
    try:
        with suspended(), rng_kept(device), model_kept(eager):  # a train-mode forward: norms' buffers kept
            trace = trace_forward(eager, args, kwargs, autocast_dtype)
    except Exception:  # noqa: BLE001 - an odd model: the post-run timing decides
        return None
    own = [c for c in trace.get("by_hand") or [] if not c.get("torch_module")]
    if not own:
        return None
    shapes = {(c["shape"][0] * c["shape"][1], c["shape"][2], c["shape"][3]) for c in own}
    try:
        with suspended(), rng_kept(device):
            a, b, layers = check_rewrite(eager, tuple(args), dict(kwargs or {}), device, autocast_dtype, shapes)
            check_training(eager, tuple(args), dict(kwargs or {}), device, autocast_dtype, shapes)
    except Unrewritable as exc:
        return Unavailable(ID, f"the attention could not be computed through SDPA in the model: {exc}")
    except Exception as exc:  # noqa: BLE001 - out of memory, a model that refuses
        return Unavailable(ID, f"the model's forward through SDPA failed: {exc.__class__.__name__}: {exc}")
    return SdpaSwitch(shapes, own, (a, b), layers)
