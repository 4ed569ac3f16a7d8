"""The user's attention by hand computed through F.scaled_dot_product_attention inside the model
itself, for the post-run timing only (issue #41): the model's forward+backward as it runs against
the same model with its by-hand attention swapped for SDPA, so the saving is timed on the model's
own layers, layouts and memory, not on fresh tensors beside it.

Measured on tests/fixtures/mingpt_train.py (2 layers, T 128, C 64, batch 8, this project's 2-core
EPYC VM): its layers timed alone on fresh contiguous q, k, v gave SDPA 9-12% of the step, where
the plain script with SDPA ran 20.8% faster; the same model rewritten here ran within noise of the
script's own SDPA version in the same process (63.0 and 74.6 ms against 72.3 and 71.4 ms, by hand
79.5 and 89.5 ms), and its loss was bit-for-bit the by-hand one.

How: a TorchFunctionMode, entered only around the timed forward. A matmul whose operands are
(..., T, D) and (..., D, T) at a by-hand call's (B·H, T, D) (the op trace's, measure/optrace.py)
returns a placeholder for the scores (a zero-stride tensor of their shape: no memory, no compute)
and remembers q and k. The ops the op trace follows on the scores are folded into the SDPA call's
arguments instead of run: a scale (× or ÷ a number; a one-value tensor, HF's `torch.full([], ...)`,
is applied to q instead, so that its value is never read: a host sync on CUDA), a mask (masked_fill
with -inf or the dtype's lowest value, torch.where with such a value, or an added float mask),
softmax over the last dim,
dropout (its p when training), casts; the matmul of the placeholder with v returns
F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale). A lower-triangular
mask the same for every batch and head is is_causal. Reading the placeholder's shape, dtype and the
like is allowed; any other use of it (the weights returned, logged, another op) raises
Unrewritable and the caller falls back to timing the layers alone. Nothing is changed outside the
`with`: the model, its modules and torch are as before.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


class Unrewritable(Exception):
    """The model's attention could not be computed through SDPA as written (said why)."""


# Reading these from the placeholder is harmless: it has the scores' shape, dtype and device.
_META = {"size", "dim", "numel", "__get__", "is_floating_point", "__len__", "stride", "is_contiguous",
         "get_device", "element_size", "is_complex", "has_names"}
_MATMULS = {"__matmul__", "matmul", "bmm"}
_SCALES_MUL = {"__mul__", "__rmul__", "mul", "mul_", "__imul__"}
_SCALES_DIV = {"__truediv__", "div", "div_", "__itruediv__"}
_ADDS = {"__add__", "__radd__", "add", "add_", "__iadd__"}
_CASTS = {"float", "half", "bfloat16", "type_as", "contiguous", "to"}


def _number(x) -> float | None:
    """A Python number (not a bool) as a float; None otherwise."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x)


def _one_value(x) -> bool:
    """A floating tensor of one value (HF's `torch.full([], ...)` divisor or mask value)."""
    return isinstance(x, torch.Tensor) and x.numel() == 1 and x.is_floating_point()


_LOWEST = torch.finfo(torch.float32).min / 2  # at or below: a masking value (HF's finfo(dtype).min)


def _masking_number(v: float) -> bool:
    """-inf, or a value at or below half the float32 range's lowest."""
    return v == float("-inf") or v <= _LOWEST


class _Scores:
    def __init__(self, placeholder, q, k):
        self.p, self.q, self.k = placeholder, q, k
        self.scale = 1.0  # the Python numbers it was multiplied by (÷: their inverse)
        self.q_ops: list = []  # ("mul" | "div", one-value tensor): folded into q, read by no one
        self.keep = None  # bool, True where attended
        self.additive = None  # float, added to the scores
        self.softmaxed = False
        self.dropout_p = 0.0


class SdpaRewrite(TorchFunctionMode):
    """Within `with SdpaRewrite(shapes):`, the by-hand attention at `shapes` ((B·H, T, D) each) runs
    as F.scaled_dot_product_attention (see the module doc). `rewritten`: how many calls were."""

    def __init__(self, shapes, causal_cache: dict | None = None):
        super().__init__()
        self.shapes = {tuple(int(x) for x in s) for s in shapes}
        # (the attention call's place in the forward, what is read) -> its reading: a mask's values
        # (lower-triangular?) and a one-value tensor fill's (a masking value?) are host syncs on CUDA,
        # and the loop switch (attention_switch) shares this across forwards so that only its first
        # forward reads them. It assumes what nanoGPT's, minGPT's and HF's are: a (T, T) mask shared by
        # batch and heads (the only kind read here) and a fill value that keep from one step to the
        # next. None: read every time.
        self.causal_cache = causal_cache
        self.rewritten = 0
        self.calls = 0  # by-hand attention calls met (rewritten or not) in this forward
        self._live: dict[int, _Scores] = {}
        self._spent: dict[int, object] = {}  # placeholders already multiplied by v (held: ids stay unique)

    def __exit__(self, exc_type, exc, tb):
        left = len(self._live)
        self._live.clear()
        self._spent.clear()
        out = super().__exit__(exc_type, exc, tb)
        if exc_type is None and left:
            raise Unrewritable(f"{left} attention score tensor{'s' if left > 1 else ''} not multiplied by v")
        return out

    def _scores_of(self, args, kwargs) -> _Scores | None:
        for t in (*args, *kwargs.values()):
            if isinstance(t, torch.Tensor):
                s = self._live.get(id(t))
                if s is not None and s.p is t:
                    return s
        return None

    def _is_qk(self, name: str, args) -> bool:
        if name not in _MATMULS or len(args) != 2:
            return False
        a, b = args
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() < 3 or b.dim() < 3:
            return False
        t, d = int(a.shape[-2]), int(a.shape[-1])
        return (int(b.shape[-2]), int(b.shape[-1])) == (d, t) and (a.numel() // (t * d), t, d) in self.shapes

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        s = self._scores_of(args, kwargs)
        if s is None and name not in _META and self._spent and any(
                isinstance(t, torch.Tensor) and self._spent.get(id(t)) is t for t in (*args, *kwargs.values())):
            raise Unrewritable(f"the attention weights are used after · v ({name or func!r})")
        if s is None:
            if self._is_qk(name, args):
                q, kt = args
                dtype = (torch.get_autocast_dtype(q.device.type)
                         if torch.is_autocast_enabled(q.device.type) and q.is_floating_point() else q.dtype)
                shape = (*torch.broadcast_shapes(q.shape[:-2], kt.shape[:-2]), q.shape[-2], kt.shape[-1])
                placeholder = torch.empty((), dtype=dtype, device=q.device).expand(shape)
                self.calls += 1
                self._live[id(placeholder)] = _Scores(placeholder, q, kt.transpose(-2, -1))
                return placeholder
            return func(*args, **kwargs)
        if name in _META:
            return func(*args, **kwargs)
        p = s.p
        others = [a for a in args if a is not p]
        if not s.softmaxed and name in _SCALES_MUL and len(others) == 1 and _number(others[0]) is not None:
            s.scale *= _number(others[0])
            return p
        if not s.softmaxed and name in _SCALES_MUL and len(others) == 1 and _one_value(others[0]):
            # a tensor's value read here would be a host sync on CUDA in every forward: q takes it
            # instead ((q·t)·kᵀ = t·(q·kᵀ)), an elementwise op on q, no read
            s.q_ops.append(("mul", others[0]))
            return p
        if not s.softmaxed and name in _SCALES_DIV and args[0] is p and len(args) == 2 and _number(args[1]):
            s.scale /= _number(args[1])
            return p
        if not s.softmaxed and name in _SCALES_DIV and args[0] is p and len(args) == 2 and _one_value(args[1]):
            s.q_ops.append(("div", args[1]))
            return p
        if not s.softmaxed and name in ("masked_fill", "masked_fill_") and args[0] is p:
            mask = args[1] if len(args) > 1 else kwargs.get("mask")
            value = args[2] if len(args) > 2 else kwargs.get("value")
            if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or not self._masking(value, name):
                raise Unrewritable("masked_fill with a value other than -inf")
            self._keep(s, ~mask)
            return p
        if not s.softmaxed and name == "where" and len(args) == 3 and args[1] is p and self._masking(args[2], name):
            cond = args[0]
            if not isinstance(cond, torch.Tensor) or cond.dtype != torch.bool:
                raise Unrewritable("torch.where on the scores with a non-bool condition")
            self._keep(s, cond)
            return p
        if not s.softmaxed and name in _ADDS and len(others) == 1 and isinstance(others[0], torch.Tensor) \
                and others[0].is_floating_point():
            s.additive = others[0] if s.additive is None else s.additive + others[0]
            return p
        if not s.softmaxed and name == "softmax":
            dim = args[1] if len(args) > 1 else kwargs.get("dim")
            if dim not in (-1, p.dim() - 1):
                raise Unrewritable(f"softmax over dim {dim}, not the last")
            s.softmaxed = True
            return p
        if s.softmaxed and name == "dropout" and args[0] is p:
            prob = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
            training = args[2] if len(args) > 2 else kwargs.get("training", True)
            s.dropout_p = float(prob) if training else 0.0
            return p
        if name in _CASTS and args[0] is p and all(not isinstance(a, torch.Tensor) or name == "type_as" for a in args[1:]):
            if name == "to" and any(isinstance(a, (torch.device, str)) for a in (*args[1:], *kwargs.values())):
                raise Unrewritable("the scores moved to another device")
            return p
        if s.softmaxed and name in _MATMULS and len(args) == 2 and args[0] is p and isinstance(args[1], torch.Tensor):
            del self._live[id(p)]
            self._spent[id(p)] = p
            self.rewritten += 1
            return self._sdpa(s, args[1])
        raise Unrewritable(f"{name or func!r} on the attention scores")

    @staticmethod
    def _keep(s: _Scores, keep) -> None:
        s.keep = keep if s.keep is None else s.keep & keep

    def _read_once(self, key: tuple, read):
        """read() once per causal_cache (a host sync on CUDA), keyed by the call's place in the
        forward: the switch's later forwards reuse it."""
        key = (self.calls, *key)
        if self.causal_cache is not None and key in self.causal_cache:
            return self.causal_cache[key]
        value = read()
        if self.causal_cache is not None:
            self.causal_cache[key] = value
        return value

    def _masking(self, value, op: str) -> bool:
        """A masking fill value: a number, or a one-value tensor (its value read once, as a mask's)."""
        if _number(value) is not None:
            return _masking_number(_number(value))
        if _one_value(value):
            return self._read_once(("fill", op, str(value.device)),
                                   lambda: _masking_number(float(value.detach().reshape(()).item())))
        return False

    def _lower_triangular(self, keep, t: int) -> bool:
        return self._read_once((tuple(keep.shape), str(keep.device)), lambda: torch.equal(
            keep.reshape(t, t), torch.ones(t, t, dtype=torch.bool, device=keep.device).tril()))

    def _sdpa(self, s: _Scores, v):
        """SDPA with what the scores' ops said: a lower-triangular keep-mask alone is is_causal; a
        float mask is added (where the keep-mask drops, -inf)."""
        mask, causal = None, False
        t = s.p.shape[-1]
        keep = s.keep
        if keep is not None and s.additive is None and s.p.shape[-2] == t and keep.dim() >= 2 \
                and tuple(keep.shape[-2:]) == (t, t) and math.prod(keep.shape[:-2]) == 1 \
                and self._lower_triangular(keep, t):
            causal = True
        elif s.additive is not None:
            mask = s.additive if keep is None else s.additive.masked_fill(~keep, float("-inf"))
        else:
            mask = keep
        q = s.q
        for op, t in s.q_ops:
            t = t.reshape(())
            q = q * t if op == "mul" else q / t
        return F.scaled_dot_product_attention(q, s.k, v, attn_mask=mask, dropout_p=s.dropout_p,
                                              is_causal=causal, scale=s.scale)
