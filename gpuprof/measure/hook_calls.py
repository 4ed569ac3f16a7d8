"""What the training hooks read from a hooked call, without side effects.

Whether dynamo is tracing (every hook returns at once inside a compiled region), the tokens a
forward takes in, the keyword arguments of the module call being pre-hooked, whether a
Tensor.to / Tensor.cuda call goes to an accelerator and whether it blocks, and whether torch
sees an accelerator at all.
"""

from __future__ import annotations

import os
import sys

import torch
from torch.nn.modules import module as _nn_module

try:
    from torch.compiler import is_compiling as _is_compiling
except ImportError:  # torch < 2.3
    def _is_compiling() -> bool:
        return False

_Tensor = torch.Tensor
_GraphModule = torch.fx.GraphModule
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_MODULE_PY = _nn_module.__file__
_HOOKS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # gpuprof/measure/


def _compiled_graph_call(module) -> bool:
    """Whether this module call is torch.compile's generated code running a captured graph, not a
    model forward of the script's: the eager and aot_eager backends run what dynamo captured as an
    fx.GraphModule (dynamo's carries its compile id in `meta`; aot_autograd's forward and backward
    graphs are called from torch's own runtime wrappers), so a compiled optimizer step under
    no_grad would otherwise read as an evaluation forward, and a compiled backward as activation
    checkpointing. Only fx.GraphModule calls are looked at (an isinstance check for the others)."""
    if not isinstance(module, _GraphModule):
        return False
    meta = getattr(module, "meta", None)
    if isinstance(meta, dict) and meta.get("dynamo_compile_id") is not None:
        return True
    try:
        f = sys._getframe(1)
    except ValueError:
        return False
    while f is not None and (f.f_code.co_filename == _MODULE_PY or f.f_code.co_filename.startswith(_HOOKS_DIR)):
        f = f.f_back  # past the hook itself and Module.__call__
    return f is not None and os.path.abspath(f.f_code.co_filename).startswith(_TORCH_DIR)


def _first_tensor(args, kwargs):
    for a in args:
        if isinstance(a, _Tensor):
            return a
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, _Tensor):
                return a
    return None


# Integer dtypes a token-id tensor can have (not bool, float or complex).
_ID_DTYPES = frozenset(getattr(torch, n) for n in ("int64", "int32", "int16", "int8", "uint8", "uint16",
                                                   "uint32", "uint64") if hasattr(torch, n))


def _tokens_of(args, kwargs) -> int:
    """Tokens in one forward: the element count of its first tensor input when it holds integer
    ids (a language model's idx); 0 when the first input is not token ids."""
    t = args[0] if args else None
    if type(t) is not _Tensor:  # not a plain tensor first (an nn.Parameter, a kwarg, ...)
        t = _first_tensor(args, kwargs)
    if t is None or t.dtype not in _ID_DTYPES:
        return 0
    return t.numel()


def _caller_kwargs() -> dict:
    """The keyword arguments of the module call being pre-hooked. A global forward pre-hook gets
    only positional args; Module._call_impl holds the kwargs in the frame that calls the hooks
    (this function <- _fwd_pre <- that frame). {} if the layout differs."""
    try:
        kw = sys._getframe(2).f_locals.get("kwargs")
    except ValueError:
        return {}
    return dict(kw) if isinstance(kw, dict) else {}


def accelerator_available() -> bool:
    """True when torch can reach a device other than the CPU (CUDA, MPS, XPU, ...)."""
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "is_available"):
        return bool(acc.is_available())
    mps = getattr(torch.backends, "mps", None)
    return torch.cuda.is_available() or bool(mps is not None and mps.is_available())


def _is_accelerator(dev) -> bool:
    if isinstance(dev, torch.device):
        return dev.type not in ("cpu", "meta")
    if isinstance(dev, str):
        return not (dev.startswith("cpu") or dev.startswith("meta"))
    if isinstance(dev, int) and not isinstance(dev, bool):
        return True  # a bare index means cuda:N
    return False


def _non_blocking(method: str, args, kwargs) -> bool:
    """The non_blocking flag of a Tensor.cuda / Tensor.to call, keyword or positional:
    cuda(device, non_blocking); to(dtype, non_blocking), to(tensor, non_blocking),
    to(device, dtype, non_blocking)."""
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    if method == "cuda":
        pos = 1
    elif args and isinstance(args[0], (torch.dtype, torch.Tensor)):
        pos = 1
    else:
        pos = 2
    return bool(args[pos]) if len(args) > pos and isinstance(args[pos], bool) else False


def _to_target_is_accelerator(args, kwargs) -> bool:
    dev = kwargs.get("device")
    if dev is None and args:
        a = args[0]
        if isinstance(a, torch.Tensor):
            dev = a.device
        elif not isinstance(a, torch.dtype):
            dev = a
    return dev is not None and _is_accelerator(dev)
