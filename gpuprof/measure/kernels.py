"""The compute fixes, each timed after the run on the run's device at the run's own shapes.

Three changes GPT trainers make once data no longer limits the step (build-nanogpt's order),
measured the way `precision-slow` is: what the run does now and the changed version, timed
one after the other on the same device, within the post-run budget's `kernels` part:

- attention: a model that computes attention by hand (seen by the op trace of the FLOP count's
  forward, measure/optrace.py) timed whole, forward and backward on the run's micro-batch, as it
  runs and with that attention computed through `F.scaled_dot_product_attention` inside it
  (measure/attention_rewrite.py; issue #41: its layers timed alone on fresh tensors claimed 9-12%
  of a step that SDPA made 20.8% faster); where it cannot be rewritten, one layer timed alone as
  written — q·kᵀ, scale, mask, softmax, dropout, ·v — and through SDPA at the layer's (B, H, T,
  head dim), dtype (the run's autocast), mask and dropout; the model around torch's own nn.MultiheadAttention
  called with need_weights=True is timed as it runs and with need_weights=False (that flag is the fix);
- vocabulary: the output projection and the loss (F.linear to V logits, cross-entropy, forward
  and backward) at the model's V and at V padded to a multiple of 64, at the micro-batch's tokens;
- optimizer: one Adam/AdamW step on a copy of the parameters (fresh gradients) as the run's
  optimizer is configured and with fused=True, when torch has a fused kernel for the device
  (measure/fused_optimizer.py).

Each pair is timed in paired rounds after a warm-up of each (measure/pair_rounds.py: A B, B A, …,
at least 8 rounds when they fit the slice, stopping once the interval is decided), so a drift in
the machine's speed hits both; each way's seconds are the medians of the rounds, stored with the
interval of the changed way ÷ the run's (`interval`), the rounds and each round's seconds
(`round_seconds`). On CUDA the times are CUDA events on the current stream; elsewhere wall time. Nothing here touches the user's optimizer or data; the whole-model
timings (measure/attention_model.py) put the model's gradients and buffers back; the other tensors
are new ones of the same shapes. `rules/compute.py` turns the figures into findings
through their interval (rules/intervals.py); a difference under 5% of the step is reported without a saving.
"""

from __future__ import annotations

import contextlib
import math
import os
import time

from gpuprof.measure.attention_model import time_model, time_need_weights  # noqa: F401 - time_need_weights: kernels' API
from gpuprof.measure.fused_optimizer import optimizer_need, optimizer_part
from gpuprof.measure.paired import ADVISED_ROUNDS
from gpuprof.measure.pair_rounds import device_of, rounds_words, timed_pair
from gpuprof.measure.pairs import Clock, autocast_for, how, rng_kept
from gpuprof.measure.sharding import refusal

PAD_MULTIPLE = 64  # GPT-2's 50257 -> 50304 (nanoGPT, build-nanogpt)
SLICES = {"attention": 0.4, "vocab": 0.3, "optimizer": 0.3}
# Set to 1, the user's attention by hand is timed one layer alone, never in the whole model: for the
# benchmark that compares the two ways against the truth (benchmarks/loop_experiments.py).
LAYERS_ONLY_ENV = "GPUPROF_ATTENTION_LAYERS_ONLY"


def time_attention(device, shape, dtype: str, *, causal: bool, masked: bool, dropout_p: float,
                   seconds: float, layers: int = 1, clock=None, now=time.perf_counter) -> dict:
    """Forward and backward seconds per attention layer by hand and through SDPA at shape
    (B, H, T, D), in `dtype` (bf16/fp16 under autocast, as the run computes it): the medians of
    paired rounds (pair_rounds.timed_pair), with the interval of sdpa ÷ by_hand, forward+backward.

    `layers` layers run one after another and their backward after all of them, as in the model:
    every layer's saved (B, H, T, T) tensors are alive at once. One layer alone reuses its freed
    memory at once and runs faster by hand than it does in the model (on this project's CPU, 2
    layers together: 27.5 ms more per layer by hand than SDPA, 1 layer alone: 20.8 ms)."""
    import torch
    import torch.nn.functional as F

    from gpuprof.hardware import torch_dtype

    dev = device_of(device)
    b, h, t, d = (int(x) for x in shape)
    n = max(1, int(layers))
    tdtype = torch_dtype(dtype) if dtype in ("bf16", "fp16", "fp32") else torch.float32
    qkv = [tuple(torch.randn(b, h, t, d, dtype=tdtype, device=dev, requires_grad=True) for _ in range(3))
           for _ in range(n)]
    grad = torch.randn(b, h, t, d, dtype=tdtype, device=dev)
    keep = torch.ones(t, t, dtype=torch.bool, device=dev).tril().view(1, 1, t, t)
    mask_out = ~keep
    scale = 1.0 / math.sqrt(d)
    ac = autocast_for(device, dtype)
    state: dict = {}

    def by_hand():
        ys = []
        with ac:
            for q, k, v in qkv:
                att = (q @ k.transpose(-2, -1)) * scale
                if masked:
                    att = att.masked_fill(mask_out, float("-inf"))
                att = F.softmax(att, dim=-1)
                if dropout_p:
                    att = F.dropout(att, dropout_p, True)
                ys.append(att @ v)
        state["y"] = ys

    def sdpa():
        with ac:
            state["y"] = [F.scaled_dot_product_attention(
                q, k, v, attn_mask=keep if masked and not causal else None, dropout_p=dropout_p,
                is_causal=bool(masked and causal)) for q, k, v in qkv]

    def backward(way: str):
        def run():
            torch.autograd.backward(state.pop("y"), [grad] * n)
            for x in (x for trio in qkv for x in trio):
                x.grad = None
        run.__name__ = f"{way}_backward"
        return run

    out = timed_pair(clock or Clock(device), {"by_hand": [by_hand, backward("by_hand")],
                                              "sdpa": [sdpa, backward("sdpa")]}, "by_hand", "sdpa", seconds, now, per=n)
    hand, fused = out["median_parts"]["by_hand"], out["median_parts"]["sdpa"]
    return {"by_hand_forward_s": hand[0], "by_hand_backward_s": hand[1],
            "sdpa_forward_s": fused[0], "sdpa_backward_s": fused[1], "rounds": out["rounds"], "layers_timed": n,
            "interval": out["interval"], "round_seconds": out["round_seconds"],
            "shape": [b, h, t, d], "dtype": dtype, "causal": bool(masked and causal), "masked": masked,
            "dropout_p": dropout_p}


def _attention(ctx, trace: dict | None, seconds: float, skipped: list[str]) -> dict:
    out = dict(trace or {})
    hand = out.get("by_hand") or []
    own = [c for c in hand if not c.get("torch_module")]
    if not hand:
        return out
    out["layers"] = len(hand)
    if own and "attention:sdpa" in getattr(ctx, "experimented", ()):  # timed on the script's own loop
        out["timed_layers"] = len(own)
        out["timing"] = {"not_measured": "measured on your loop (experiment steps: measurements.experiments)"}
    elif own:  # the user's attention by hand: the model timed both ways, else its layers of one shape
        t0 = time.perf_counter()
        first = own[0]
        same = [c for c in own if c["shape"] == first["shape"] and c["dtype"] == first["dtype"]]
        share = seconds / 2 if len(own) < len(hand) else seconds
        timing = (time_model(ctx, own, share) if os.environ.get(LAYERS_ONLY_ENV) != "1" else
                  {"not_measured": f"{LAYERS_ONLY_ENV}=1 (benchmarks/loop_experiments.py's comparison)"})
        if timing.get("not_measured") is None:
            out["timed_layers"] = len(own)
        else:
            out["timed_layers"] = len(same)  # the others (another shape) are not scaled from this timing
            why = timing["not_measured"]
            timing = _time_group(ctx, first, len(same), share - (time.perf_counter() - t0), skipped)
            timing["model_not_timed"] = why
        out["timing"] = timing
        seconds -= time.perf_counter() - t0
    if len(own) < len(hand):  # torch's nn.MultiheadAttention with need_weights=True
        if seconds < 0.05:
            skipped.append("nn.MultiheadAttention timed with need_weights=False")
            out["mha_timing"] = {"not_measured": f"no time left in the post-run budget ({seconds:.2f} s)"}
            return out
        try:
            timing = time_need_weights(ctx.model, tuple(ctx.example_args or ()), dict(ctx.example_kwargs or {}),
                                       ctx.device, ctx.autocast_dtype, seconds)
            timing["method"] = ("the model's forward+backward on the run's micro-batch as it runs and with "
                                "need_weights=False on every nn.MultiheadAttention, "
                                + rounds_words(timing, "without ÷ with the weights") + "; " + how(ctx.device))
            out["mha_timing"] = timing
        except TimeoutError as exc:
            skipped.append("nn.MultiheadAttention timed with need_weights=False")
            out["mha_timing"] = {"not_measured": f"{exc}"}
        except Exception as exc:  # noqa: BLE001 - e.g. the model uses the weights it asked for
            out["mha_timing"] = {"not_measured": f"the model with need_weights=False failed: "
                                                 f"{exc.__class__.__name__}: {exc}"}
    return out


def _time_group(ctx, first: dict, layers: int, seconds: float, skipped: list[str]) -> dict:
    """The user's by-hand attention timed both ways (time_attention), the layers of the first
    one's shape together, else one alone; {"not_measured": why} when it cannot be."""
    if seconds < 0.05:
        skipped.append("attention timed both ways")
        return {"not_measured": f"no time left in the post-run budget ({seconds:.2f} s)"}
    t0 = time.perf_counter()
    kw = dict(causal=first["causal"] is not False, masked=bool(first["masked"]),
              dropout_p=float(first.get("dropout_p") or 0.0))
    try:
        try:  # the model's layers of that shape together, as their activations live in the model
            timing = time_attention(ctx.device, first["shape"], first["dtype"], seconds=seconds, layers=layers, **kw)
        except (TimeoutError, MemoryError, RuntimeError) as exc:  # RuntimeError: torch.cuda.OutOfMemoryError
            left = seconds - (time.perf_counter() - t0)
            if layers == 1 or left < 0.05:
                raise
            timing = time_attention(ctx.device, first["shape"], first["dtype"], seconds=left, layers=1, **kw)
            timing["layers_not_timed_together"] = f"{exc.__class__.__name__}: {exc}"
        timing["method"] = ("the model's attention layers of one (B, H, T, head dim), dtype, mask and dropout, run "
                            "together (forward through every layer, then backward), by hand and through "
                            "F.scaled_dot_product_attention, per layer, " + rounds_words(timing, "SDPA ÷ by hand")
                            + "; " + how(ctx.device))
        return timing
    except TimeoutError as exc:
        skipped.append("attention timed both ways")
        return {"not_measured": f"{exc}"}
    except Exception as exc:  # noqa: BLE001 - e.g. OOM at the model's shapes
        return {"not_measured": f"{exc.__class__.__name__}: {exc}"}


# -- vocabulary ------------------------------------------------------------------------------------

def output_head(model) -> dict | None:
    """The model's projection to a vocabulary: the nn.Linear whose out_features is the largest
    nn.Embedding's num_embeddings (GPT's lm_head, tied or not). {vocab, width, module}."""
    import torch

    embeddings = [m for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    if not embeddings:
        return None
    vocab = max(e.num_embeddings for e in embeddings)
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and m.out_features == vocab:
            return {"vocab": vocab, "width": m.in_features, "module": name}
    return None


def padded(vocab: int, multiple: int = PAD_MULTIPLE) -> int:
    return -(-int(vocab) // multiple) * multiple


def time_vocab(device, tokens: int, width: int, vocab: int, vocab_to: int, dtype: str, param_dtype,
               seconds: float, *, clock=None, now=time.perf_counter) -> dict:
    """Forward+backward seconds of the output projection and cross-entropy at V and V padded: the
    medians of paired rounds (pair_rounds.timed_pair), with the interval of padded ÷ V."""
    import torch
    import torch.nn.functional as F

    dev = device_of(device)
    x = torch.randn(tokens, width, dtype=param_dtype, device=dev, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,), device=dev)
    ac = autocast_for(device, dtype)
    weights = {v: (torch.randn(v, width, dtype=param_dtype, device=dev) * 0.02).requires_grad_(True)
               for v in (vocab, vocab_to)}

    def step(v):
        def run():
            with ac:
                logits = F.linear(x, weights[v])
                loss = F.cross_entropy(logits, targets)
            loss.backward()
            x.grad = None
            weights[v].grad = None
        run.__name__ = f"vocab_{v}"
        return run

    out = timed_pair(clock or Clock(device), {"vocab": [step(vocab)], "padded": [step(vocab_to)]},
                     "vocab", "padded", seconds, now)
    return {"vocab_s": out["median_parts"]["vocab"][0], "padded_s": out["median_parts"]["padded"][0],
            "rounds": out["rounds"], "interval": out["interval"], "round_seconds": out["round_seconds"]}


def _vocab(ctx, seconds: float, skipped: list[str]) -> dict | None:
    try:
        return _vocab_timed(ctx, seconds, skipped)
    except Exception as exc:  # noqa: BLE001 - an odd model: the other parts stand
        return {"not_measured": f"{exc.__class__.__name__}: {exc}"}


def _vocab_timed(ctx, seconds: float, skipped: list[str]) -> dict | None:
    import torch

    head = output_head(ctx.model)
    if head is None:
        return None
    out = {**head, "multiple": PAD_MULTIPLE, "padded_vocab": padded(head["vocab"])}
    if head["vocab"] % PAD_MULTIPLE == 0:
        return out
    ids = next((a for a in (*(ctx.example_args or ()), *(ctx.example_kwargs or {}).values())
                if isinstance(a, torch.Tensor) and not a.is_floating_point() and a.dim() >= 1), None)
    if ids is None:
        out["timing"] = {"not_measured": "no token-id input to size the logits"}
        return out
    if seconds < 0.05:
        skipped.append("vocabulary timed padded")
        out["timing"] = {"not_measured": f"no time left in the post-run budget ({seconds:.2f} s)"}
        return out
    param = next(ctx.model.parameters())
    dtype = (getattr(ctx, "precision", None) or {}).get("compute_dtype") or "fp32"
    try:
        out["timing"] = time_vocab(ctx.device, ids.numel(), head["width"], head["vocab"], out["padded_vocab"],
                                   dtype, param.dtype, seconds)
        out["timing"]["tokens"] = ids.numel()
        out["timing"]["method"] = ("the output projection (F.linear to V logits) and cross-entropy, forward+backward, "
                                   "at the micro-batch's tokens, at V and padded V, "
                                   + rounds_words(out["timing"], "padded ÷ V") + "; " + how(ctx.device))
    except TimeoutError as exc:
        skipped.append("vocabulary timed padded")
        out["timing"] = {"not_measured": str(exc)}
    except Exception as exc:  # noqa: BLE001
        out["timing"] = {"not_measured": f"{exc.__class__.__name__}: {exc}"}
    return out


# -- optimizer -------------------------------------------------------------------------------------

def trace_forward(model, args, kwargs, autocast_dtype) -> dict:
    """The op trace of one forward under no_grad, the RNG restored (when the FLOP count did not
    run one)."""
    from gpuprof.measure.flops import count_flops
    from gpuprof.measure.optrace import OpTrace

    eager = getattr(model, "_orig_mod", model)
    trace = OpTrace(eager)
    count_flops(eager, tuple(args or ()), dict(kwargs or {}), autocast_dtype=autocast_dtype, extra_modes=(trace,),
                counter=False)
    return trace.summary()


class ComputeFixesProbe:
    """After the measured steps: attention, vocabulary and optimizer timed as the run has them
    and changed → measurements['kernels']. Shares the post-run budget's 'kernels' part."""

    name = "kernels"

    def __init__(self, seconds: float = 6.0):
        self.seconds = seconds

    def start(self, ctx) -> None:
        return None

    def stop(self, ctx) -> dict | None:
        if getattr(ctx, "model", None) is None:
            return None
        with rng_kept(ctx.device):  # the random inputs and dropout draw nothing from the run's stream
            return self._measure(ctx)

    def _measure(self, ctx) -> dict:
        budget = getattr(ctx, "budget", None)
        allotted = budget.allot(self.name) if budget is not None else self.seconds
        t0 = time.perf_counter()
        skipped: list[str] = []

        def left() -> float:
            return max(0.0, allotted - (time.perf_counter() - t0))

        out: dict = {}
        trace = getattr(ctx, "op_trace", None)
        sharded = refusal(getattr(ctx, "sharding", None))
        if sharded:  # neither the op trace's forward nor the optimizer's copy of sharded parameters
            trace = {"not_measured": sharded}
        elif trace is None:
            from gpuprof.measure.budget import per_micro_s

            est = 2 * per_micro_s(ctx, ("forward",))
            if est < left() * 0.3:
                try:
                    trace = trace_forward(ctx.model, ctx.example_args, ctx.example_kwargs, ctx.autocast_dtype)
                except Exception as exc:  # noqa: BLE001
                    trace = {"not_measured": f"op trace failed: {exc.__class__.__name__}: {exc}"}
            else:
                skipped.append("the op trace of one forward")
                trace = {"not_measured": f"one forward (~{est / 2:.1f} s) does not fit the post-run budget"}
        out["attention"] = _attention(ctx, trace, left() * SLICES["attention"], skipped)
        rest = left()
        # The vocabulary gets what the optimizer's timing will not need (its ADVISED_ROUNDS paired
        # rounds: 20 of the run's optimizer phases when it is timed at all), and at least its
        # share of what is left.
        vocab = _vocab(ctx, max(rest * SLICES["vocab"] / (SLICES["vocab"] + SLICES["optimizer"]),
                                rest - optimizer_need(ctx, ADVISED_ROUNDS)), skipped)
        if vocab is not None:
            out["vocab"] = vocab
        looped = "optimizer:fused" in getattr(ctx, "experimented", ())  # timed on the script's own loop
        optimizer = optimizer_part(ctx, left(), skipped) if not sharded and not looped else None
        if optimizer is not None:
            out["optimizer"] = optimizer
        out["seconds"] = time.perf_counter() - t0
        if budget is not None:
            budget.done(self.name, skipped)
        return out
