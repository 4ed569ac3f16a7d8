"""What one forward computes, op by op: attention written by hand, and the SDPA backend.

The FLOP count's forward (measure/flops.py) runs under this trace too, so it costs no extra
forward. Two torch modes see it:
- a TorchFunctionMode sees each `F.scaled_dot_product_attention` call before torch picks a
  kernel (its shapes, dtype, mask, dropout, is_causal);
- a TorchDispatchMode sees the aten ops that ran, inside or outside those calls: inside, the op
  names the backend torch chose (aten._scaled_dot_product_flash_attention → flash, ...; none of
  them → the math fallback, decomposed into matmuls and a softmax); outside, a softmax over a
  (…, T, T) tensor that a batched matmul produced, then multiplied by a (…, T, D) tensor, is
  attention computed by hand (minGPT, early build-nanogpt): q·kᵀ, a mask, softmax, dropout, ·v.
The module each op ran in comes from global forward hooks (the innermost module running).

torch's own attention is not the user's code. `nn.MultiheadAttention` (inside
`nn.TransformerEncoderLayer`/`DecoderLayer` and `nn.Transformer` too) calls
`F.multi_head_attention_forward`, which the function mode sees with its arguments; what it runs
inside is hidden from that mode (a mode is off while it handles a call), and its aten ops are
torch's: with `need_weights=False` (what the encoder/decoder layers pass) it is an SDPA call, kept
with the kernel the dispatch mode saw; with `need_weights=True` (nn.MultiheadAttention's default
when a user calls it) torch computes softmax(q·kᵀ)·v by hand, kept as by-hand attention of
`torch_module` with the user's call site (file:line), whose fix is `need_weights=False`. (The
encoder layer's inference fast path, which bypasses nn.MultiheadAttention, is not taken while a
function mode is active: torch sees a tensor with a torch function override.)

On CUDA, for an SDPA call that did not get the flash kernel, torch's own checker
(`torch.backends.cuda.can_use_flash_attention(params, debug=True)`) says why: its warnings are
kept as the reasons it was refused (dtype, head dim, mask, dropout).
"""

from __future__ import annotations

import math
import os
import sys
import warnings
import weakref

BACKENDS = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "_scaled_dot_product_efficient_attention": "memory-efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_scaled_dot_product_fused_attention_overrideable": "fused (device)",
}
_MATMULS = ("bmm", "mm", "matmul", "baddbmm")
_DTYPE_MATMULS = ("mm", "addmm", "bmm", "baddbmm")  # the aten matmuls a forward's layers dispatch to
_SOFTMAX = ("_softmax", "_safe_softmax")
_MASKS = ("masked_fill", "where", "add", "masked_fill_", "add_")
_DROPOUT = ("native_dropout", "bernoulli_")
MAX_CALLS = 256  # attention occurrences kept (a 96-layer model has 96)


def _call_site() -> str | None:
    """file:line of the innermost user frame on the stack (the user's call into torch's module)."""
    from gpuprof.measure.stacks import is_user_file

    f = sys._getframe(1)
    while f is not None:
        if is_user_file(f.f_code.co_filename):
            return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"
        f = f.f_back
    return None


def _name(func) -> str:
    """aten.bmm.default -> 'bmm'."""
    packet = getattr(func, "overloadpacket", None)
    return getattr(packet, "__name__", None) or str(func).split(".")[1]


def _dtype_name(t) -> str:
    from gpuprof.hardware import normalize_dtype

    return normalize_dtype(str(t.dtype).replace("torch.", ""))


def _is_upper_mask(mask, value_masks: bool) -> bool | None:
    """Is the (…, T, T) mask causal? value_masks: True where the score is masked out (masked_fill);
    False: True where kept (where(cond, scores, -inf)). None when it cannot be read."""
    import torch

    try:
        m = mask.detach()
        if m.dim() < 2 or m.shape[-1] != m.shape[-2]:
            return None
        while m.dim() > 2:
            m = m[0]
        m = m.to("cpu").bool()
        t = m.shape[-1]
        upper = torch.ones(t, t, dtype=torch.bool).triu(1)
        return bool(torch.equal(m, upper if value_masks else ~upper))
    except Exception:  # noqa: BLE001 - a mask we cannot read: unknown
        return None


class OpTrace:
    """Context manager over one forward: `summary()` afterwards gives the attention facts."""

    def __init__(self, model):
        self.model = model
        self.names = {id(m): n or type(m).__name__ for n, m in model.named_modules()}
        self.stack: list[str] = []
        self.sdpa: list[dict] = []
        self.by_hand: list[dict] = []
        self._in_sdpa: dict | None = None  # an SDPA call (the user's, or inside torch's MHA)
        # id(tensor) -> (weak reference to it, the open by-hand candidate it belongs to): weak, so the
        # trace keeps no (B, H, T, T) score tensor alive that the forward would have freed
        self._pending: dict[int, tuple] = {}
        self._handles = []
        self._modes = []
        self.error: str | None = None
        self.matmul_flops: dict[str, float] = {}  # dtype -> FLOPs of the forward's matmuls in it

    # -- module stack --------------------------------------------------------------------------
    def _pre(self, module, args):
        name = self.names.get(id(module))
        if name is not None:
            self.stack.append(name)

    def _post(self, module, args, out):
        if self.names.get(id(module)) is not None and self.stack:
            self.stack.pop()

    def module(self) -> str | None:
        return self.stack[-1] if self.stack else None

    # -- modes ---------------------------------------------------------------------------------
    def __enter__(self):
        import torch
        from torch.nn.modules import module as nn_module

        trace = self
        self._handles = [nn_module.register_module_forward_pre_hook(self._pre),
                         nn_module.register_module_forward_hook(self._post)]

        sdpa_fn = torch.nn.functional.scaled_dot_product_attention
        mha_fn = torch.nn.functional.multi_head_attention_forward

        class _Functions(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if (func is sdpa_fn or func is mha_fn) and trace._in_sdpa is None:
                    try:
                        call = (trace._sdpa_call(args, kwargs) if func is sdpa_fn
                                else trace._mha_call(args, kwargs))
                    except Exception as exc:  # noqa: BLE001 - a trace problem never fails the count
                        trace.error = trace.error or f"{exc.__class__.__name__}: {exc}"
                        return func(*args, **kwargs)
                    trace._in_sdpa = call
                    try:
                        return func(*args, **kwargs)
                    finally:
                        trace._in_sdpa = None
                        trace._keep(call)
                return func(*args, **kwargs)

        class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                try:
                    trace._op(_name(func), args, out)
                except Exception as exc:  # noqa: BLE001 - a trace problem never fails the count
                    trace.error = trace.error or f"{exc.__class__.__name__}: {exc}"
                return out

        self._modes = [_Functions(), _Ops()]
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc):
        for m in reversed(self._modes):
            m.__exit__(*exc)
        for h in self._handles:
            h.remove()
        self._modes, self._handles = [], []
        return False

    # -- what the ops say ----------------------------------------------------------------------
    def _sdpa_call(self, args, kwargs) -> dict:
        import torch

        def arg(i, name, default=None):
            return args[i] if len(args) > i else kwargs.get(name, default)

        q, k, v = arg(0, "query"), arg(1, "key"), arg(2, "value")
        mask, dropout, causal = arg(3, "attn_mask"), arg(4, "dropout_p", 0.0), arg(5, "is_causal", False)
        gqa = bool(kwargs.get("enable_gqa", False))
        call = {"module": self.module(), "shape": list(q.shape), "kv_shape": list(k.shape),
                "dtype": _dtype_name(q), "mask": mask is not None, "dropout_p": float(dropout or 0.0),
                "is_causal": bool(causal), "device": str(q.device)}
        if torch.is_autocast_enabled(q.device.type) and q.is_floating_point():
            call["dtype"] = _dtype_name(torch.empty(0, dtype=torch.get_autocast_dtype(q.device.type)))
        if q.is_cuda:
            call["refused"] = flash_refusals(q, k, v, mask, float(dropout or 0.0), bool(causal), gqa)
        return call

    def _mha_call(self, args, kwargs) -> dict:
        """F.multi_head_attention_forward(query, key, value, embed_dim, num_heads, …): query is
        (T, B, E) there (nn.MultiheadAttention transposes batch_first inputs) or unbatched (T, E)."""
        import torch

        def arg(i, name, default=None):
            return args[i] if len(args) > i else kwargs.get(name, default)

        q, k, heads = arg(0, "query"), arg(1, "key"), int(arg(4, "num_heads"))
        t, s_ = int(q.shape[0]), int(k.shape[0])
        b = int(q.shape[1]) if q.dim() == 3 else 1
        d = int(q.shape[-1]) // heads
        mask, causal = arg(16, "attn_mask"), bool(arg(24, "is_causal", False))
        need = bool(arg(15, "need_weights", True))
        training = bool(arg(13, "training", True))
        dropout = float(arg(10, "dropout_p", 0.0) or 0.0) if training else 0.0
        upper = None
        if mask is not None and t == s_:
            m = mask.detach()
            upper = _is_upper_mask(torch.isinf(m) if m.is_floating_point() else m, value_masks=True)
        dtype = _dtype_name(q)
        if torch.is_autocast_enabled(q.device.type) and q.is_floating_point():
            dtype = _dtype_name(torch.empty(0, dtype=torch.get_autocast_dtype(q.device.type)))
        call = {"module": self.module(), "torch_module": "nn.MultiheadAttention", "need_weights": need,
                "call_site": _call_site(), "shape": [b, heads, t, d], "kv_shape": [b, heads, s_, d],
                "dtype": dtype, "device": str(q.device), "dropout_p": dropout}
        if need:  # torch computes it by hand: the by-hand record's fields
            call.update(masked=mask is not None or causal, causal=True if causal else upper, by_hand=True)
        else:
            call.update(mask=mask is not None, is_causal=causal or bool(upper))
        return call

    def _keep(self, call: dict) -> None:
        """An SDPA call (the user's, or torch's MHA with need_weights=False), or torch's MHA
        computing by hand (need_weights=True), when its call has ended."""
        backend = call.pop("_backend", None)
        if call.pop("by_hand", False):
            if len(self.by_hand) < MAX_CALLS:
                self.by_hand.append(call)
            return
        call["backend"] = backend or "math"
        if len(self.sdpa) < MAX_CALLS:
            self.sdpa.append(call)

    def _op(self, name: str, args, out) -> None:
        import torch

        if name in _DTYPE_MATMULS and isinstance(out, torch.Tensor) and out.is_floating_point():
            # what the matmuls compute in, whatever cast or autocast put them there (a model that
            # casts its weights to the activations' dtype inside forward, with no autocast)
            b = args[-1] if isinstance(args[-1], torch.Tensor) and args[-1].dim() >= 2 else None
            flops = 2.0 * out.numel() * (int(b.shape[-2]) if b is not None else 1)
            key = str(out.dtype).replace("torch.", "")  # 'bfloat16', as MatmulDtypeWatch reads it
            self.matmul_flops[key] = self.matmul_flops.get(key, 0.0) + flops
        if self._in_sdpa is not None:
            if name in BACKENDS and "_backend" not in self._in_sdpa:
                self._in_sdpa["_backend"] = BACKENDS[name]
            return
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        cand = self._follow(tensors)
        if cand is None and name in _MATMULS and isinstance(out, torch.Tensor) and out.dim() >= 3 \
                and out.shape[-1] == out.shape[-2] and out.shape[-1] > 1 and len(tensors) >= 2:
            # q·kᵀ: (…, T, D)·(…, D, T) -> (…, T, T)
            self._advance({"module": self.module(), "t": int(out.shape[-1]), "d": int(tensors[-1].shape[-2]),
                           "masked": False, "causal": None, "dtype": _dtype_name(out), "stage": "scores"}, out)
            return
        if cand is None:
            return
        if name in _MASKS and cand["stage"] == "scores":
            cand["masked"] = True
            mask = next((t for t in tensors[1:] if t.dim() >= 2), None)
            if mask is not None:
                if name.startswith("masked_fill"):
                    cand["causal"] = _is_upper_mask(mask, value_masks=True)
                elif name == "where":
                    cand["causal"] = _is_upper_mask(args[0], value_masks=False)
                elif mask.is_floating_point():  # an additive mask: -inf, or HF's finfo.min, where masked
                    out_mask = torch.isinf(mask) | (mask <= torch.finfo(mask.dtype).min / 2)
                    cand["causal"] = _is_upper_mask(out_mask, value_masks=True)
            self._advance(cand, out)
        elif name in _SOFTMAX and cand["stage"] == "scores":
            cand["stage"] = "probs"
            cand["shape"] = list(out.shape)
            self._advance(cand, out)
        elif name in _DROPOUT and cand["stage"] == "probs":
            p = next((a for a in args[1:] if isinstance(a, float)), None)
            if p is not None:
                cand["dropout_p"] = round(1.0 - p if name == "bernoulli_" else p, 6)
            self._advance(cand, out[0] if isinstance(out, tuple) else out)
        elif name in ("mul", "div", "div_", "mul_", "_to_copy", "expand", "view", "_unsafe_view", "clone",
                      "contiguous", "alias", "empty_like", "permute", "unsqueeze", "squeeze", "transpose", "t",
                      "_reshape_alias", "reshape") and isinstance(out, torch.Tensor):
            self._advance(cand, out)  # scaling, casts and reshapes on the way
        elif name in _MATMULS and cand["stage"] == "probs" and len(tensors) >= 2:
            cand["d"] = int(tensors[-1].shape[-1])
            cand.pop("stage", None)
            self._close(cand)

    def _follow(self, tensors) -> dict | None:
        for t in tensors:
            ref, cand = self._pending.get(id(t), (None, None))
            if ref is not None and ref() is t:
                return cand
        return None

    def _advance(self, cand: dict, out) -> None:
        import torch

        if isinstance(out, torch.Tensor):
            self._pending[id(out)] = (weakref.ref(out), cand)

    def _close(self, cand: dict) -> None:
        for key in [k for k, (_, c) in self._pending.items() if c is cand]:
            del self._pending[key]
        shape = cand.pop("shape", None) or []
        b_h = shape[:-2]
        if len(b_h) >= 2:  # (B, H) or GQA's (B, H_kv, group): every head counts
            b, h = int(b_h[0]), math.prod(int(x) for x in b_h[1:])
        else:
            b, h = int(b_h[0]) if b_h else 1, 1
        if len(self.by_hand) < MAX_CALLS:
            self.by_hand.append({"module": cand["module"], "shape": [b, h, cand["t"], cand["d"]],
                                 "dtype": cand["dtype"], "masked": cand["masked"], "causal": cand["causal"],
                                 "dropout_p": cand.get("dropout_p", 0.0)})

    def summary(self) -> dict:
        out = {"by_hand": self.by_hand, "sdpa": self.sdpa,
               "method": ("one forward traced with torch's function and dispatch modes: "
                          "F.scaled_dot_product_attention calls and the kernel each ran; a softmax over a "
                          "batched q·kᵀ (…, T, T) then ·v outside it is attention by hand")}
        if self.matmul_flops:
            out["matmul_flops_by_dtype"] = dict(self.matmul_flops)
            out["matmul_dtype"] = max(self.matmul_flops, key=self.matmul_flops.get)
        if self.error:
            out["error"] = self.error
        return out


def flash_refusals(q, k, v, mask, dropout_p: float, is_causal: bool, enable_gqa: bool = False) -> list[str]:
    """Why torch would not run the flash kernel for these inputs (CUDA): the warnings its
    checker gives with debug=True; [] when flash is allowed. Unverified on a GPU: whether those
    C++ warnings reach Python's warnings there (else the reason is "torch gave no reason")."""
    import torch

    try:
        params = torch.backends.cuda.SDPAParams(q, k, v, mask, dropout_p, is_causal, enable_gqa)
    except TypeError:  # older signature without enable_gqa
        params = torch.backends.cuda.SDPAParams(q, k, v, mask, dropout_p, is_causal)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = torch.backends.cuda.can_use_flash_attention(params, debug=True)
    if ok:
        return []
    return [str(w.message).strip() for w in caught][:4] or ["refused (torch gave no reason)"]
