"""Phases of an unmodified training script, from torch's public hooks and a few wrappers.

`TrainingHooks.install()` drives a PhaseTimer from the script's own calls. Each phase's hooks are
a part of TrainingHooks kept in a module of its own:

- forward / eval (gpuprof.measure.forward_hooks): a global module forward pre-hook catches each
  outermost module call, a forward hook on that module ends it.
- optimizer (gpuprof.measure.optimizer_hooks): optimizer step pre/post hooks and GradScaler.step.
- the step boundary (gpuprof.measure.step_rules): the first optimizer seen stepping ends each
  step; in a loop without one, a gradient reset after a backward (`model.zero_grad()`) or the
  next loop iteration does; a script that shows no step at all is stopped, not run blind.
- backward, the optimizer's helpers, h2d, DataLoader iteration (gpuprof.measure.torch_wrappers):
  wrappers of torch.autograd.backward, Optimizer.zero_grad, Module.zero_grad, clip_grad_norm_,
  GradScaler.unscale_/update, Tensor.to/.cuda/.pin_memory and the DataLoader iterator. The h2d
  wrappers are not installed at all when torch sees no accelerator (no copy is possible, and
  clip_grad_norm_ alone calls Tensor.to once per parameter).
- data (gpuprof.measure.data_hooks): user functions the runner wraps with `wrap_attr`
  (get_batch-like functions of the script).
- comm (gpuprof.measure.collective_hooks): FSDP2's all-gathers and reduce-scatters, wrapped in
  torch's FSDP2 module, and DTensor's functional collectives (tensor parallelism, the norm of
  sharded gradients; gpuprof.measure.funcol_hooks), from the first event of a torch.distributed
  run on.

This module holds what they share: the run's state and counters, install() and remove(), the
phase switching, and the start of the run at the first event. A model compiled in place
(Module.compile()) runs the forward hooks inside dynamo's trace, so no forward is seen: the first
backward or optimizer step then starts the run, and forward time falls into `other`.

Every hook and wrapper is removed by `remove()`; a wrapper the script still holds a reference to
afterwards just calls the original. Only torch's classes and global hook registries are touched
for the whole run: a hook on one of the script's own modules lives for one forward call (a
forward hook on the outermost module, gpuprof.measure.forward_hooks; a watcher's hook on a layer),
so the script's objects pickle, copy and compile as they would without gpuprof. Hooks ignore other threads, forked DataLoader workers, and
calls made while `suspended` (an instrument running the model itself).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Callable

import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

from gpuprof.measure.collective_hooks import CollectiveHooks
from gpuprof.measure.data_hooks import DataHooks
from gpuprof.measure.data_names import data_like_name
from gpuprof.measure.forward_hooks import ForwardHooks
from gpuprof.measure.hook_calls import accelerator_available
from gpuprof.measure.optimizer_hooks import OptimizerHooks
from gpuprof.measure.step_rules import NoStepLimits, StepRules, StopScript, _StepCounts
from gpuprof.measure.timer import PhaseTimer
from gpuprof.measure.torch_wrappers import TorchWrappers

# What the runner and the benchmarks import from here.
__all__ = ["NoStepLimits", "StopScript", "TrainingHooks", "data_like_name"]

_get_ident = threading.get_ident
_ACTIVE: "weakref.WeakSet[TrainingHooks]" = weakref.WeakSet()
_FORK_HANDLER = False


def _after_fork_in_child() -> None:
    # A forked DataLoader worker inherits the patched functions; make them inert there.
    for hooks in list(_ACTIVE):
        hooks._off = True


class TrainingHooks(ForwardHooks, OptimizerHooks, StepRules, TorchWrappers, DataHooks, CollectiveHooks):
    """Installs the hooks; keeps the phase state and the counters of one script run.

    on_first_forward(module, args, kwargs) -> PhaseTimer: called once, at the first outermost
    forward (with hooks suspended); the returned timer is then driven by the hooks.
    on_step(done): called after each closed step. stop_after: raise StopScript once that many
    steps are closed (None: never); then a script that shows no step is stopped at the
    `no_step_limits` too. clock: seconds, for those limits.
    """

    def __init__(self, on_first_forward: Callable, on_step: Callable[[int], None] | None = None,
                 stop_after: int | None = None, no_step_limits: NoStepLimits = NoStepLimits(),
                 clock: Callable[[], float] = time.monotonic):
        self._on_first_forward = on_first_forward
        self._on_step = on_step
        self.stop_after = stop_after
        self.no_step_limits = no_step_limits
        self._clock = clock
        self._t0 = 0.0  # the clock at the first event
        self.step_rule: str | None = None  # gpuprof.sections.script.STEP_RULES, once a step closed
        self.step_marker: str | None = None  # the call that closed the first step, in words
        self.no_step: str | None = None  # why the script was stopped with no step seen
        self.optimizers_alive: int | None = None  # counted once, when the `backward` rule is weighed
        self.collective_kinds: list[str] = []  # collectives wrapped (collective_hooks, funcol_hooks)
        self.collective_group: dict = {}  # size and backend of the first group seen
        self.collective_errors: list[str] = []
        self.collective_events = None  # CUDA: events on FSDP2's streams (collective_events)
        self.timer: PhaseTimer | None = None
        self.steps_done = 0
        self.stopped = False
        self.suspended = False
        self._off = True
        self._tid = _get_ident()
        self._pre_handle = None  # the global forward pre-hook's handle, from install() to remove()
        self._pre_id = None  # its key in torch's dict of global forward pre-hooks
        self._pre_fn = None  # the bound method stored there (made once, not per forward)
        self._outer = None  # the outermost module whose forward is running
        self._outer_handle = None  # its forward hook, for this call only
        self._stale = None  # the hook of an outermost forward that raised, removed at the next one
        # Objects whose hooks go on the model only during a training forward: arm() at its
        # start, disarm() at its end (gpuprof.measure.precision.MatmulDtypeWatch).
        self.forward_watchers: list = []
        # After the measured steps, before the stop: gpuprof.measure.experiments.Experiments (or None)
        self.experiments = None
        self._fwd_prev = "other"
        self._fwd_training = False
        self._opt_prev: list[str] = []
        self._primary_opt = None
        self._step = _StepCounts()
        self._handles: list = []
        self._undo: list[Callable[[], None]] = []  # restores patched attributes, newest last
        self.counts = dict(forward=0, eval_forward=0, backward=0, optimizer_step=0,
                           other_optimizer_step=0, h2d_copies=0, h2d_bytes=0, pin_memory=0,
                           h2d_pageable=0, h2d_blocking=0,
                           dataloader_iter=0, dataloader_next=0, data_calls=0, optimizer_aux=0,
                           module_zero_grad=0,
                           skipped_optimizer_step=0, forward_in_backward=0)
        self.accelerator = False  # set by install(): whether h2d copies are wrapped at all
        self.wrapped: list[str] = []  # names of user functions wrapped as `data`
        self.disqualified: set[str] = set()  # ... of those found running the model
        self._in_data: list[str] = []

    # -- install / remove --------------------------------------------------------------------

    def install(self) -> None:
        global _FORK_HANDLER
        self._tid = _get_ident()
        self._off = False
        _ACTIVE.add(self)
        if not _FORK_HANDLER and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _FORK_HANDLER = True
        try:
            # Dynamo builds its rule map of torch functions when it is first imported (a script's
            # first optimizer imports it): import it before our wrappers replace torch functions,
            # or the map keeps them -- and through them this run and the script's objects -- for good.
            import torch._dynamo  # noqa: F401
        except Exception:  # noqa: BLE001 - a torch without dynamo
            pass
        self._pre_fn = self._fwd_pre
        self._pre_handle = nn_module.register_module_forward_pre_hook(self._pre_fn)
        self._pre_id = self._pre_handle.id
        self._handles.append(optim_module.register_optimizer_step_pre_hook(self._opt_pre))
        self._handles.append(optim_module.register_optimizer_step_post_hook(self._opt_post))

        # Tensor.backward() calls torch.autograd.backward(): one wrapper sees both entry points.
        self._patch(torch.autograd, "backward", self._wrap(torch.autograd.backward, "backward", "backward"))
        self._patch(torch.optim.Optimizer, "zero_grad",
                    self._wrap_reset(torch.optim.Optimizer.zero_grad, "optimizer_aux"))
        self._patch(torch.nn.Module, "zero_grad", self._wrap_reset(torch.nn.Module.zero_grad, "module_zero_grad"))
        clip = self._wrap(torch.nn.utils.clip_grad_norm_, "optimizer", "optimizer_aux")
        self._patch(torch.nn.utils, "clip_grad_norm_", clip)
        if hasattr(torch.nn.utils, "clip_grad"):
            self._patch(torch.nn.utils.clip_grad, "clip_grad_norm_", clip)
        self._patch(torch.amp.GradScaler, "step", self._wrap_scaler_step(torch.amp.GradScaler.step))
        for name in ("unscale_", "update"):
            self._patch(torch.amp.GradScaler, name, self._wrap(getattr(torch.amp.GradScaler, name),
                                                               "optimizer", "optimizer_aux"))
        self.accelerator = accelerator_available()
        if self.accelerator:  # with no accelerator there is no host-to-device copy to time
            self._patch(torch.Tensor, "to", self._wrap_copy(torch.Tensor.to, "to"))
            self._patch(torch.Tensor, "cuda", self._wrap_copy(torch.Tensor.cuda, "cuda"))
            self._patch(torch.Tensor, "pin_memory", self._wrap(torch.Tensor.pin_memory, "h2d", "pin_memory"))
        from torch.utils.data import dataloader as dl

        self._patch(dl.DataLoader, "__iter__", self._wrap(dl.DataLoader.__iter__, "data", "dataloader_iter"))
        self._patch(dl._BaseDataLoaderIter, "__next__",
                    self._wrap(dl._BaseDataLoaderIter.__next__, "data", "dataloader_next"))

    def remove(self) -> None:
        """Remove every hook and restore every patched attribute (idempotent)."""
        self._off = True
        if self._pre_handle is not None:
            self._pre_handle.remove()  # also when a forward had it stepped aside: a no-op then
            self._pre_handle = None
        for h in (*self._handles, self._outer_handle, self._stale):
            if h is not None:
                h.remove()
        self._handles.clear()
        self._outer_handle = self._stale = None
        for watcher in self.forward_watchers:
            watcher.disarm()
        while self._undo:
            self._undo.pop()()
        _ACTIVE.discard(self)

    # -- phase switching ---------------------------------------------------------------------

    def _active(self) -> bool:
        return not self._off and not self.suspended and self.timer is not None and _get_ident() == self._tid

    def _enter(self, name: str) -> str | None:
        """Switch to `name`; returns the label to restore, or None when nothing was switched.

        Data and h2d under no_grad inside eval mode stay `eval`; any other event ends eval mode
        (the label it returns to is then `other`)."""
        t = self.timer
        if t.current == "eval" and name in ("data", "h2d") and not torch.is_grad_enabled():
            return None
        prev = t.switch(name)
        return "other" if prev == "eval" else prev

    # -- the start of the run --------------------------------------------------------------------

    def _start(self, module, args, kwargs) -> bool:
        """The first event: get the timer from on_first_forward and open step 0. module is None
        when the first event is a backward or optimizer step (a model compiled in place with
        Module.compile() runs its hooks inside dynamo's trace, so its forwards are not seen)."""
        self.suspended = True
        try:
            self.timer = self._on_first_forward(module, args, kwargs)
        finally:
            self.suspended = False
        if self.timer is None:
            return False
        self._t0 = self._clock()
        # A sharded model's collectives (FSDP2 shards at wrap time, before the first forward):
        # wrapped only in a process that runs torch.distributed, whose FSDP modules are loaded.
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            self._install_collectives()
        self.timer.start_step()
        return True

    def _first_event(self) -> bool:
        """For backward/optimizer wrappers: True when measuring, starting if nothing was seen yet."""
        if self.timer is None and not (self._off or self.suspended or _get_ident() != self._tid):
            self.counts["no_forward_start"] = 1
            self._start(None, (), {})
        return self._active()
