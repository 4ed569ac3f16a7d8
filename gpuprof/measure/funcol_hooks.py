"""The functional collectives of DTensor (tensor parallelism, and the norms of sharded gradients),
timed where they run: the `comm` phase, beside FSDP2's (gpuprof.measure.collective_hooks).

A DTensor op whose placements must change (a RowwiseParallel output's Partial → Replicate, a
sequence-parallel all-gather, `clip_grad_norm_`'s norm over sharded gradients) redistributes
through `torch.distributed._functional_collectives` (funcol): `placement_types.py` and
`_collective_utils.py` call `funcol.all_reduce`, `funcol.all_gather_single`,
`funcol.reduce_scatter_single`, … by module attribute, in the forward and, through DTensor's own
autograd Function, in the backward. Each of those returns at issue (an AsyncCollectiveTensor) and
the host blocks later, in `funcol.wait_tensor`, at the result's first use. Both are wrapped in
the funcol module for the run (restored at remove()):

- the issue and the wait are the `comm` phase while they run on the script's thread: what the
  host is blocked on a collective, the wait for a slower peer included, is never compute; a
  functional collective called inside one of FSDP2's wrapped collectives, or inside another
  funcol call, is counted there, not again;
- per step and kind (`funcol_all_reduce`, `funcol_all_gather`, `funcol_reduce_scatter`,
  `funcol_all_to_all`, `funcol_broadcast`): calls, bytes (the all-gather's output, every other
  kind's input), host `seconds` (issue + wait: exposed), `in_flight_seconds` (from the issue to the
  end of its wait: how long the collective was outstanding), and how many came in the backward.
  A wait whose issue was not seen (an op's registered autograd formula issues from C++) counts
  as `funcol_wait`.

Inside torch.compile the collectives are graph ops and are not seen. Calls from another thread
(CUDA's autograd device thread) are counted, not timed as a phase, as for FSDP2.
"""

from __future__ import annotations

import functools
import threading
import time

from gpuprof.measure.hook_calls import _is_compiling

_get_ident = threading.get_ident
# funcol's issuing functions (torch 2.4-2.13) -> the kind they count as. An *_autograd or
# *_coalesced variant and all_gather_tensor call another of these: only the outermost call counts.
FUNCOL_KINDS = {
    "all_reduce": "funcol_all_reduce", "all_reduce_coalesced": "funcol_all_reduce",
    "all_gather_single": "funcol_all_gather", "all_gather_single_autograd": "funcol_all_gather",
    "all_gather_tensor": "funcol_all_gather", "all_gather_tensor_autograd": "funcol_all_gather",
    "all_gather_single_coalesced": "funcol_all_gather", "all_gather_into_tensor_coalesced": "funcol_all_gather",
    "reduce_scatter_single": "funcol_reduce_scatter", "reduce_scatter_single_autograd": "funcol_reduce_scatter",
    "reduce_scatter_tensor": "funcol_reduce_scatter", "reduce_scatter_tensor_autograd": "funcol_reduce_scatter",
    "reduce_scatter_single_coalesced": "funcol_reduce_scatter",
    "reduce_scatter_tensor_coalesced": "funcol_reduce_scatter",
    "all_to_all_single": "funcol_all_to_all", "all_to_all_single_autograd": "funcol_all_to_all",
    "broadcast": "funcol_broadcast", "permute_tensor": "funcol_permute",
}
UNMATCHED_WAIT = "funcol_wait"
# issued, not yet waited: a bound, so results never waited on are forgotten (matched by their
# storage's address, which a freed result's memory could be given again)
_MAX_PENDING = 4096


def funcol_module():
    try:
        from torch.distributed import _functional_collectives
    except ImportError:  # a torch without torch.distributed
        return None
    return _functional_collectives


def count_call(per: dict, nbytes: int, seconds: float, own: bool, backward: bool) -> None:
    """One collective call into its kind's counts for the step (FSDP2's and funcol's alike): host
    seconds only on the script's thread (another thread's are not a phase of it)."""
    per["calls"] += 1
    per["bytes"] += nbytes
    if own:
        per["seconds"] += seconds
    else:
        per["other_thread"] += 1
    if backward:
        per["backward_calls"] += 1
        per["backward_seconds"] += seconds if own else 0.0


def _tensors(x):
    if isinstance(x, (list, tuple)):
        for v in x:
            yield from _tensors(v)
    elif hasattr(x, "numel") and hasattr(x, "element_size"):
        yield x


def _nbytes(x) -> int:
    try:
        return sum(int(t.numel() * t.element_size()) for t in _tensors(x))
    except Exception:  # noqa: BLE001 - not a tensor: no bytes
        return 0


def _storage(t) -> int:
    """The address of a tensor's storage: what an issued result and the tensor its wait is called
    with share (the wait gets a view of the result when DTensor reshapes it before first use)."""
    try:
        return int(t.untyped_storage().data_ptr())
    except Exception:  # noqa: BLE001 - a tensor without storage (meta, a subclass): not matched
        return 0


def _results(out):
    """The storages of an issue's results (an AsyncCollectiveTensor's `elem`, what its wait gets)."""
    for t in _tensors(out):
        key = _storage(getattr(t, "elem", t))
        if key:
            yield key


class FunctionalCollectiveHooks:
    """The funcol wrappers of TrainingHooks (CollectiveHooks._install_collectives calls
    _install_funcol); counts go into the step's `collectives`, as FSDP2's do."""

    def _install_funcol(self) -> None:
        module = funcol_module()
        if module is None:
            return
        self._funcol_local = threading.local()
        self._funcol_pending: dict = {}  # result's storage -> (kind, issue time ns, backward)
        wrapped = False
        for name, kind in FUNCOL_KINDS.items():
            fn = getattr(module, name, None)
            if callable(fn):
                self._patch(module, name, self._wrap_funcol_issue(fn, kind))
                wrapped = True
        wait = getattr(module, "wait_tensor", None)
        if wrapped and callable(wait):
            self._patch(module, "wait_tensor", self._wrap_funcol_wait(wait))
            self.collective_kinds.append("funcol")

    def _funcol_skip(self) -> bool:
        return _is_compiling() or self.timer is None or self._off or self.suspended

    def _wrap_funcol_issue(self, fn, kind: str):
        hooks = self
        clock = time.perf_counter_ns

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            local = hooks._funcol_local
            if hooks._funcol_skip() or getattr(local, "depth", 0):
                return fn(*args, **kwargs)
            t = hooks.timer
            own = _get_ident() == hooks._tid
            prev = t.switch("comm") if own else None
            backward = (prev or t.current) == "backward" or not own
            local.depth = 1
            t0 = clock()
            try:
                out = fn(*args, **kwargs)
            finally:
                t1 = clock()
                local.depth = 0  # (it was 0: a call inside FSDP's or another issue returned above)
                if prev is not None:
                    t.switch(prev)
            try:
                moved = _nbytes(out) if kind == "funcol_all_gather" else _nbytes(args[0] if args else None)
                hooks._count_funcol(kind, args, kwargs, moved, (t1 - t0) / 1e9, own, backward)
                pending = hooks._funcol_pending
                if len(pending) >= _MAX_PENDING:  # results never waited on: forget them
                    pending.clear()
                for key in _results(out):
                    pending[key] = (kind, t0, backward)
            except Exception as exc:  # noqa: BLE001 - a count must never fail the user's step
                hooks.collective_errors.append(f"{kind}: {exc.__class__.__name__}: {exc}")
            return out

        wrapper.__gpuprof_wrapped__ = fn
        return wrapper

    def _wrap_funcol_wait(self, fn):
        hooks = self
        clock = time.perf_counter_ns

        @functools.wraps(fn)
        def wrapper(tensor, *args, **kwargs):
            local = hooks._funcol_local
            if hooks._funcol_skip() or getattr(local, "depth", 0):
                # inside an issuing call (all_gather_single waits there for gather_dim != 0): that
                # call's time holds the wait
                if not hooks._funcol_skip():
                    hooks._funcol_pending.pop(_storage(tensor), None)
                return fn(tensor, *args, **kwargs)
            t = hooks.timer
            own = _get_ident() == hooks._tid
            prev = t.switch("comm") if own else None
            t0 = clock()
            try:
                return fn(tensor, *args, **kwargs)
            finally:
                t1 = clock()
                if prev is not None:
                    t.switch(prev)
                try:
                    hooks._count_funcol_wait(tensor, t1, (t1 - t0) / 1e9, own, prev)
                except Exception as exc:  # noqa: BLE001 - a count must never fail the user's step
                    hooks.collective_errors.append(f"wait_tensor: {exc.__class__.__name__}: {exc}")

        wrapper.__gpuprof_wrapped__ = fn
        return wrapper

    def _funcol_entry(self, kind: str) -> dict:
        return self._step.collectives.setdefault(kind, {
            "calls": 0, "bytes": 0, "seconds": 0.0, "other_thread": 0, "backward_calls": 0,
            "backward_seconds": 0.0, "wait_seconds": 0.0, "in_flight_seconds": 0.0})

    def _count_funcol(self, kind: str, args, kwargs, nbytes: int, seconds: float, own: bool,
                      backward: bool) -> None:
        """One issue into the step's counts (its wait adds to the same kind when it comes)."""
        if not self.collective_group:
            self.collective_group = _group_info(args[2:] if len(args) > 2 else (), kwargs)
        count_call(self._funcol_entry(kind), nbytes, seconds, own, backward)

    def _count_funcol_wait(self, tensor, end_ns: int, seconds: float, own: bool, prev) -> None:
        """A wait: its host time to the kind it waited for, and that collective's time in flight
        (issue to the end of this wait)."""
        found = self._funcol_pending.pop(_storage(tensor), None)
        if found is not None:
            kind, issued, backward = found
            per = self._funcol_entry(kind)
            per["in_flight_seconds"] += (end_ns - issued) / 1e9
        else:
            kind, backward = UNMATCHED_WAIT, (prev or self.timer.current) == "backward" or not own
            per = self._funcol_entry(kind)
            per["calls"] += 1
            if backward:
                per["backward_calls"] += 1
        if own:
            per["seconds"] += seconds
            per["wait_seconds"] += seconds
            if backward:
                per["backward_seconds"] += seconds
        else:
            per["other_thread"] += 1


def _group_info(rest, kwargs) -> dict:
    """Size and backend of a funcol call's group (a ProcessGroup, a group name, a DeviceMesh or
    (mesh, dim)); {} when it cannot be read."""
    import torch.distributed as dist

    group = kwargs.get("group")
    if group is None:
        group = next((a for a in rest if not isinstance(a, (bool, int, float))), None)  # the group comes before the tag
    try:
        from torch.distributed import distributed_c10d as c10d

        module = funcol_module()
        name = module._resolve_group_name(group)
        pg = c10d._resolve_process_group(name)
        return {"size": int(pg.size()), "backend": str(dist.get_backend(pg))}
    except Exception:  # noqa: BLE001 - private API: the default group stands for it
        try:
            return {"size": int(dist.get_world_size()), "backend": str(dist.get_backend())}
        except Exception:  # noqa: BLE001
            return {}
