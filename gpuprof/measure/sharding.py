"""Whether the model's forward and backward communicate: FSDP2 units, DTensor (tensor-parallel)
parameters, and what they hold. Read once, at the first forward, from the model's modules and
parameters (torch's public FSDPModule and DTensor types; FSDP2's parameter groups for
reshard_after_forward and the mixed-precision policy, guarded: a field this torch lacks is None).

A model that communicates cannot be run by one rank alone after the run: every forward and
backward of an FSDP2 model all-gathers, and a peer that does not run the same forward leaves it
waiting for ever. The post-run parts that run the model (FLOP count, micro-batch curve,
precision timing, compile timing, need_weights timing, the optimizer copy) skip such a model and
say why (`refusal`); DDP is not here: its forward communicates only through its reducer, which
the post-run parts avoid by running `ddp.module`.
"""

from __future__ import annotations


def _types():
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        FSDPModule = None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        DTensor = None
    return FSDPModule, DTensor


def _param_group(module):
    state = getattr(module, "_get_fsdp_state", None)
    try:
        return getattr(state(), "_fsdp_param_group", None) if state is not None else None
    except Exception:  # noqa: BLE001 - private API: read what is there
        return None


def _dtype(v) -> str | None:
    return str(v).replace("torch.", "") if v is not None else None


def _local(t, dtensor):
    return t.to_local() if dtensor is not None and isinstance(t, dtensor) else t


def _bytes(t) -> int:
    return int(t.numel()) * int(t.element_size())


def rank_memory(model, optimizer, dtensor) -> dict:
    """What this rank holds of the model's training state, in bytes, read from the tensors: the
    parameters whole (a DTensor's numel is the full one) and its local shards; the gradients it
    holds now (None when every gradient is unset, as after zero_grad(set_to_none=True)); the
    optimizer's state tensors (AdamW's exp_avg, exp_avg_sq, step), local shards, and the whole."""
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    state = [v for st in (getattr(optimizer, "state", None) or {}).values() if isinstance(st, dict)
             for v in st.values() if hasattr(v, "numel") and hasattr(v, "element_size")]
    return {
        "param_bytes_total": sum(_bytes(p) for p in params),
        "param_bytes_local": sum(_bytes(_local(p, dtensor)) for p in params),
        "grad_bytes_local": sum(_bytes(_local(g, dtensor)) for g in grads) if grads else None,
        "optimizer_state_bytes_local": sum(_bytes(_local(v, dtensor)) for v in state) if state else None,
        "optimizer_state_bytes_total": sum(_bytes(v) for v in state) if state else None,
        "optimizer": type(optimizer).__name__ if optimizer is not None else None,
    }


def describe_sharding(model, optimizer=None) -> dict | None:
    """{"kind": "fsdp2" | "tensor_parallel", units, params_total, params_local, mesh_dims, memory,
    …} for a model that communicates in its forward and backward, None for one that does not.
    optimizer: the run's (its state's bytes go into `memory`)."""
    fsdp_module, dtensor = _types()
    if fsdp_module is None and dtensor is None:
        return None
    units = []
    for name, m in model.named_modules():
        if fsdp_module is not None and isinstance(m, fsdp_module):
            group = _param_group(m)
            params = list(getattr(group, "fsdp_params", None) or [])
            mp = getattr(group, "mp_policy", None)
            units.append({
                "module": name or "(root)",
                "params": sum(int(getattr(fp, "_orig_size", None).numel()) for fp in params
                              if getattr(fp, "_orig_size", None) is not None) if params else 0,
                # FSDP2 keeps a post-forward mesh only when it reshards after forward
                "reshard_after_forward": (getattr(group, "post_forward_mesh_info", None) is not None
                                          if group is not None else None),
                "param_dtype": _dtype(getattr(mp, "param_dtype", None)),
                "reduce_dtype": _dtype(getattr(mp, "reduce_dtype", None)),
            })
    params = list(model.parameters())
    dparams = [p for p in params if dtensor is not None and isinstance(p, dtensor)]
    if not units and not dparams:
        return None
    local = sum(int(p.to_local().numel()) if dtensor is not None and isinstance(p, dtensor) else int(p.numel())
                for p in params)
    meshes = {id(p.device_mesh): p.device_mesh for p in dparams}
    dims = max((int(m.ndim) for m in meshes.values()), default=0)
    placements = sorted({str(tuple(str(x) for x in p.placements)) for p in dparams})
    return {
        "kind": "fsdp2" if units else "tensor_parallel",
        "units": units,
        "params_total": int(sum(int(p.numel()) for p in params)),  # a DTensor's numel is the full one
        "params_local": local,
        "mesh_dims": dims,
        "mesh_shape": list(next(iter(meshes.values())).shape) if meshes else None,
        "placements": placements[:8],
        "memory": rank_memory(model, optimizer, dtensor),
    }


def is_sharded(model) -> bool:
    """An FSDP2 module or a DTensor parameter in the model (cheap: no description)."""
    fsdp_module, dtensor = _types()
    if model is None:
        return False
    if fsdp_module is not None and any(isinstance(m, fsdp_module) for m in model.modules()):
        return True
    return dtensor is not None and any(isinstance(p, dtensor) for p in model.parameters())


def refusal(sharding: dict | None) -> str | None:
    """Why a post-run part does not run a sharded model (None: it may)."""
    if not sharding:
        return None
    what = "FSDP2" if sharding.get("kind") == "fsdp2" else "tensor parallel (DTensor)"
    return (f"the model is sharded ({what}): its forward and backward are collectives, so one rank "
            f"running it after the run would wait for peers that do not (or time their waiting)")
