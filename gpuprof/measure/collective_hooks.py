"""The collectives of sharded training (FSDP2), timed where they run: the `comm` phase.

FSDP2 (`torch.distributed.fsdp.fully_shard`) gathers each unit's parameters before its forward
(and again before its backward when `reshard_after_forward=True`) and reduce-scatters its
gradients after its backward. In torch 2.4-2.13 its parameter groups call three functions of
`torch.distributed.fsdp._fully_shard._fsdp_collectives` by their names in
`_fsdp_param_group`'s module namespace: `foreach_all_gather` (copy-in and the all-gather),
`foreach_all_gather_copy_out` (wait for it, copy the parameters out) and `foreach_reduce`
(the reduce-scatter, and HSDP's all-reduce). Each is wrapped there, for the run only (restored at
remove()), and each call is:

- the `comm` phase of the step while it runs on the script's thread: so forward and backward
  hold the rank's own compute, and the time a rank waits in a collective for a slower peer is
  `comm`, never compute. On gloo (CPU) the collectives are synchronous: the host time of a call
  is the collective itself, including any wait for the peers. On CUDA the calls enqueue work on
  FSDP's own streams and return; the compute stream's wait for an all-gather happens inside
  the copy-out, so its CUDA events on the current stream put that wait in `comm` on the GPU
  timeline. A call from another thread (CUDA's autograd device thread, in backward) is counted,
  not timed as a phase.
- counted per step: calls, bytes (the all-gather's output buffer; the reduce-scatter's unsharded
  gradients), seconds on the host, and on CUDA the seconds in flight on FSDP's own streams
  (gpuprof.measure.collective_events: CUDA events, read after the run).

The user's code is not changed: only torch's module attributes are, for the run. CollectiveHooks
is a part of gpuprof.measure.hooks.TrainingHooks and works on its state.
"""

from __future__ import annotations

import functools
import threading
import time

from gpuprof.measure.collective_events import CollectiveEvents
from gpuprof.measure.funcol_hooks import FunctionalCollectiveHooks, count_call
from gpuprof.measure.hook_calls import _is_compiling

_get_ident = threading.get_ident
# (function in FSDP2's parameter-group module, what it does, in the profile's words)
FSDP_COLLECTIVES = (("foreach_all_gather", "all_gather"), ("foreach_all_gather_copy_out", "all_gather_wait"),
                    ("foreach_reduce", "reduce_scatter"))


def _fsdp_param_group_module():
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param_group
    except ImportError:  # a torch without FSDP2 (or without torch.distributed)
        return None
    return _fsdp_param_group


def _nbytes(t) -> int:
    try:
        return int(t.numel() * t.element_size())
    except Exception:  # noqa: BLE001 - not a tensor: no bytes
        return 0


def _bytes_in(kind: str, args, kwargs) -> int:
    """The reduce-scatter's input, the unsharded gradients, read before the call (foreach_reduce
    clears the list to free them)."""
    if kind != "reduce_scatter":
        return 0
    grads = args[1] if len(args) > 1 else kwargs.get("unsharded_grads", ())
    return sum(_nbytes(g) for g in grads or ())


def _bytes_out(kind: str, out) -> int:
    """The all-gather's output buffer (every rank's shard); nothing for the copy-out (it waits and
    copies locally)."""
    if kind == "all_gather" and out is not None:
        return _nbytes(getattr(out, "all_gather_output", None))
    return 0


def _group_of(kind: str, args, kwargs):
    i, name = {"all_gather": (1, "group"), "all_gather_wait": (2, "group"),
               "reduce_scatter": (2, "reduce_scatter_group")}[kind]
    return args[i] if len(args) > i else kwargs.get(name)


class CollectiveHooks(FunctionalCollectiveHooks):
    """The FSDP2 collective wrappers of TrainingHooks (install() calls _install_collectives), and
    DTensor's functional collectives (FunctionalCollectiveHooks)."""

    def _install_collectives(self) -> None:
        self._install_funcol()  # DTensor's functional collectives (gpuprof.measure.funcol_hooks)
        module = _fsdp_param_group_module()
        if module is None:
            return
        device = getattr(getattr(self.timer, "_events", None), "device", None)
        if device is not None:  # a CUDA timeline: FSDP's streams get events of their own
            try:
                self.collective_events = CollectiveEvents(device)
            except Exception as exc:  # noqa: BLE001 - the host timing stands without them
                self.collective_errors.append(f"CUDA events for FSDP's streams: {exc.__class__.__name__}: {exc}")
        for name, kind in FSDP_COLLECTIVES:
            fn = getattr(module, name, None)
            if callable(fn):
                self._patch(module, name, self._wrap_collective(fn, kind))
                self.collective_kinds.append(kind)

    def _wrap_collective(self, fn, kind: str):
        hooks = self
        clock = time.perf_counter_ns

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            t = hooks.timer
            if _is_compiling() or t is None or hooks._off or hooks.suspended:
                return fn(*args, **kwargs)
            own = _get_ident() == hooks._tid
            try:
                moved = _bytes_in(kind, args, kwargs)
            except Exception:  # noqa: BLE001 - a count must never fail the user's step
                moved = 0
            prev = t.switch("comm") if own else None
            gpu = hooks.collective_events
            start = gpu.start(kind, args) if gpu is not None else None
            local = getattr(hooks, "_funcol_local", None)  # a functional collective inside FSDP's is FSDP's
            if local is not None:
                local.depth = getattr(local, "depth", 0) + 1
            t0 = clock()
            try:
                out = fn(*args, **kwargs)
            finally:
                t1 = clock()
                if local is not None:
                    local.depth -= 1
                if prev is not None:
                    t.switch(prev)
            try:
                backward = (prev or t.current) == "backward" or not own
                hooks._count_collective(kind, args, kwargs, moved + _bytes_out(kind, out), (t1 - t0) / 1e9,
                                        own, backward=backward)
                if start is not None:
                    gpu.end(kind, args, out, t.step_index, backward, start)
            except Exception as exc:  # noqa: BLE001 - a count must never fail the user's step
                hooks.collective_errors.append(f"{kind}: {exc.__class__.__name__}: {exc}")
            return out

        wrapper.__gpuprof_wrapped__ = fn
        return wrapper

    def _count_collective(self, kind: str, args, kwargs, nbytes: int, seconds: float, own: bool,
                          backward: bool) -> None:
        """One call into the step's counts: calls, bytes, host seconds (on the script's thread),
        and how many of them came in the backward (FSDP's re-gathers, its reduce-scatters)."""
        if not self.collective_group:
            group = _group_of(kind, args, kwargs)
            if group is not None:
                import torch.distributed as dist

                self.collective_group = {"size": int(group.size()), "backend": str(dist.get_backend(group))}
        per = self._step.collectives.setdefault(kind, {"calls": 0, "bytes": 0, "seconds": 0.0, "other_thread": 0,
                                                       "backward_calls": 0, "backward_seconds": 0.0})
        count_call(per, nbytes, seconds, own, backward)
