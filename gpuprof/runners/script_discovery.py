"""What the runner finds in the script's own objects at the first forward.

The run's configuration: the script's settings from its globals and the locals of its frames
(nanoGPT's names), then what the model and the first forward's inputs show, each value with where
it came from; the model under its torch.compile / DDP wrappers (or, when no forward was seen, the
largest module among the globals); and the get_batch-like functions of the script, wrapped as the
`data` phase.
"""

from __future__ import annotations

import argparse
import os
import sys
import types

import torch
from torch.utils.data import Dataset

from gpuprof.hardware import normalize_dtype
from gpuprof.measure.data_names import data_like_name
from gpuprof.measure.stacks import is_user_file

DIMS = ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")
# Scalar nanoGPT config names kept verbatim (for a corrected config written back later).
SCRIPT_KEYS = ("batch_size", "block_size", "gradient_accumulation_steps", "dtype", "compile", "device",
               "n_layer", "n_head", "n_embd", "vocab_size", "bias", "dropout", "learning_rate",
               "max_iters", "eval_interval", "eval_iters", "log_interval", "dataset", "data_dir", "init_from")


def _namespaces(module, file: str) -> list[tuple[str, dict]]:
    """Where the run's settings live: the script's globals, then the locals of its frames
    on the stack (a `main()` holding them), innermost last."""
    spaces = [("script global", module.__dict__)]
    f = sys._getframe()
    frames = []
    while f is not None:
        if os.path.realpath(f.f_code.co_filename) == file and f.f_locals is not module.__dict__:
            frames.append(f)
        f = f.f_back
    for fr in reversed(frames):
        spaces.append((f"local of {fr.f_code.co_name}()", dict(fr.f_locals)))
    # an argparse script's settings: the parsed Namespace (`args.batch_size`) in any of those
    for where, ns in list(spaces):
        for key, value in ns.items():
            if isinstance(value, argparse.Namespace):
                spaces.append((f"{where} `{key}`:", vars(value)))
    return spaces


def _lookup(spaces, name):
    for where, ns in spaces:
        v = ns.get(name)
        if isinstance(v, (bool, int, float, str, torch.dtype)):
            return v, f"{where} `{name}`"
        if isinstance(v, torch.device):
            return str(v), f"{where} `{name}`"
    for where, ns in spaces:
        args = ns.get("model_args")
        if isinstance(args, dict) and isinstance(args.get(name), (int, float, bool)):
            return args[name], f"{where} `model_args['{name}']`"
    return None, None


def read_config(run, eager, compiled: bool, first) -> None:
    """Fill run.config, and run.source with where each value came from: the settings from the
    script's globals and frame locals, then what the model (`eager`, whether it was `compiled`)
    and the first forward's input tensor (`first`, or None) show. run is the script run's state
    (gpuprof.runners.script_state._Run)."""
    spaces = _namespaces(run.module, run.file)
    cfg, src = run.config, run.source
    cfg["model"] = f"{_class_name(eager)} (script)"

    def put(key, value, where):
        if value is not None and cfg.get(key) is None:
            cfg[key] = value
            src[key] = where

    for key, name in (("batch_size", "batch_size"), ("block_size", "block_size"),
                      ("grad_accum", "gradient_accumulation_steps"), ("device", "device"),
                      ("compile", "compile")):
        put(key, *_lookup(spaces, name))
    raw_dtype, where = _lookup(spaces, "dtype")
    if raw_dtype is not None:
        name = str(raw_dtype).replace("torch.", "")
        try:
            name = normalize_dtype(name)
        except ValueError:
            pass  # a name gpuprof does not know is kept as the script wrote it
        put("dtype", name, where)
    if compiled:
        cfg["compile"], src["compile"] = True, "observed: the model is compiled (torch.compile)"
    put("compile", False, "observed: the model is not a torch.compile wrapper")
    put("device", run.device, "observed: device of the first forward's input" if first is not None
        else "observed: device of the model's parameters")
    if first is not None and first.dim() == 2 and not first.is_floating_point():
        rows, cols = (int(n) for n in first.shape)
        if cfg.get("batch_size") == cols != rows:  # (T, B): nn.Transformer's default layout
            put("block_size", rows, "observed: first forward's input shape (T, B), B being the batch_size setting")
        put("batch_size", rows, "observed: first forward's input shape (B, T)")
        put("block_size", cols, "observed: first forward's input shape (B, T)")

    dims, dim_src = {}, {}
    mcfg = getattr(eager, "config", None)
    for d in DIMS:
        v = getattr(mcfg, d, None) if mcfg is not None and not isinstance(mcfg, dict) else \
            (mcfg.get(d) if isinstance(mcfg, dict) else None)
        if isinstance(v, int):
            dims[d], dim_src[d] = v, "model.config"
            continue
        for name in (d, "meta_vocab_size") if d == "vocab_size" else (d,):
            v, where = _lookup(spaces, name)
            if isinstance(v, int) and not isinstance(v, bool):
                dims[d], dim_src[d] = v, where
                break
    emb = _embeddings(eager)
    if "vocab_size" not in dims and "wte" in emb:
        dims["vocab_size"], dim_src["vocab_size"] = emb["wte"].num_embeddings, "model: wte embedding rows"
    if "block_size" not in dims and cfg.get("block_size"):
        dims["block_size"], dim_src["block_size"] = cfg["block_size"], src["block_size"]
    if dims:
        cfg["model_dims"] = dims
        src["model_dims"] = dim_src
    params = {id(p): p.numel() for p in eager.parameters()}
    n = sum(params.values())
    note = "model parameters (unique tensors)"
    if "wpe" in emb and id(emb["wpe"].weight) in params:
        n -= emb["wpe"].weight.numel()
        note += ", without position embeddings as nanoGPT's estimate_mfu"
    cfg["param_count"], src["param_count"] = n, note
    cfg["script_globals"] = {k: v for k in SCRIPT_KEYS
                             for v in [run.module.__dict__.get(k)]
                             if isinstance(v, (bool, int, float, str))}
    data_dir = run.module.__dict__.get("data_dir")
    if isinstance(data_dir, str) and os.path.isfile(os.path.join(data_dir, "train.bin")):
        cfg["data_path"] = os.path.join(data_dir, "train.bin")


def wrap_data_functions(hooks, g: dict) -> None:
    """Wrap the script's get_batch-like functions (and methods of its own classes) as `data`:
    g is the script's globals, hooks its TrainingHooks."""
    seen_classes = set()
    for name, obj in list(g.items()):
        if isinstance(obj, types.FunctionType):
            if data_like_name(name) and is_user_file(obj.__code__.co_filename):
                hooks.wrap_attr(g, name, f"{name} ({_where(obj)})")
            continue
        cls = obj if isinstance(obj, type) else type(obj)
        if cls in seen_classes or cls.__module__ in ("builtins",):
            continue
        seen_classes.add(cls)
        # Dunders (__getitem__, __next__, __iter__) only of a Dataset or a data-named class:
        # a config class's __getitem__ is not data loading.
        loader = issubclass(cls, Dataset) or data_like_name(cls.__name__)
        for attr, fn in list(vars(cls).items()):
            dunder = attr.startswith("__")
            if (isinstance(fn, types.FunctionType) and is_user_file(fn.__code__.co_filename)
                    and (loader if dunder and attr in ("__getitem__", "__next__", "__iter__")
                         else not dunder and data_like_name(attr))):
                hooks.wrap_attr(cls, attr, f"{cls.__name__}.{attr} ({_where(fn)})")


def _where(fn) -> str:
    code = fn.__code__
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"


def _class_name(module) -> str:
    """The model's class name; for an FSDP2 module (fully_shard makes a class `FSDP<Name>` from
    FSDPModule and the model's own class) the model's own."""
    cls = type(module)
    bases = [b for b in cls.__bases__ if b.__name__ != "FSDPModule"]
    if cls.__name__.startswith("FSDP") and len(bases) < len(cls.__bases__) and bases:
        return bases[0].__name__
    return cls.__name__


def _unwrap(module) -> tuple[torch.nn.Module, bool]:
    """The eager module under torch.compile / DDP wrappers, and whether it was compiled."""
    compiled = getattr(module, "_compiled_call_impl", None) is not None  # Module.compile()
    for _ in range(4):
        inner = getattr(module, "_orig_mod", None)
        if isinstance(inner, torch.nn.Module):
            module, compiled = inner, True
            continue
        inner = getattr(module, "module", None)
        if isinstance(inner, torch.nn.Module) and type(module).__name__ in (
                "DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"):
            module = inner
            continue
        break
    return module, compiled


def _find_ddp(module):
    """The DistributedDataParallel wrapper in the chain the forward was called through
    (nanoGPT: DDP(torch.compile(model)); also compile(DDP(model))), or None."""
    for _ in range(4):
        if type(module).__name__ == "DistributedDataParallel":
            return module
        inner = getattr(module, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return None
        module = inner
    return None


def _find_model(namespace: dict) -> torch.nn.Module:
    """The module with the most parameters among the script's globals (an empty Module if none)."""
    mods = [v for v in namespace.values() if isinstance(v, torch.nn.Module)]
    if not mods:
        return torch.nn.Module()
    return max(mods, key=lambda m: sum(p.numel() for p in _unwrap(m)[0].parameters()))


def _embeddings(model: torch.nn.Module) -> dict:
    out = {}
    for name, mod in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("wte", "wpe") and isinstance(mod, torch.nn.Embedding):
            out.setdefault(leaf, mod)
    return out


def _gpt_config(cfg: dict):
    dims = cfg.get("model_dims") or {}
    if not all(isinstance(dims.get(d), int) for d in DIMS):
        return None
    from gpuprof.dims import GPTConfig

    return GPTConfig(**{d: dims[d] for d in DIMS})

