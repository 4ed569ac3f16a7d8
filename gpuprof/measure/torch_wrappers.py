"""Wrappers that put torch's own calls into phases: backward, the optimizer's helpers, h2d copies
and DataLoader iteration.

- backward: torch.autograd.backward (Tensor.backward calls it).
- optimizer: Optimizer.zero_grad, Module.zero_grad, clip_grad_norm_ and GradScaler.unscale_/update
  (the optimizer step itself is gpuprof.measure.optimizer_hooks; a zero_grad may also end a step,
  gpuprof.measure.step_rules), so the phase means what it means in the built-in loop.
- h2d: Tensor.to/.cuda from a CPU tensor to an accelerator, and Tensor.pin_memory.
- data: DataLoader.__iter__ / _BaseDataLoaderIter.__next__.

TorchWrappers is a part of gpuprof.measure.hooks.TrainingHooks and works on its state; its
_patch() records how to restore each attribute it replaces.
"""

from __future__ import annotations

import functools
import threading

import torch

from gpuprof.measure.hook_calls import _is_compiling, _non_blocking, _to_target_is_accelerator

_get_ident = threading.get_ident


class TorchWrappers:
    """The wrappers of torch functions of TrainingHooks (install() says what each one wraps)."""

    def _patch(self, owner, attr: str, wrapper) -> None:
        if attr in vars(owner):  # restore exactly what the owner itself held
            original = vars(owner)[attr]
            self._undo.append(lambda: setattr(owner, attr, original))
        else:  # inherited (e.g. Tensor.to from the C base): delete ours to uncover it again
            self._undo.append(lambda: delattr(owner, attr))
        setattr(owner, attr, wrapper)

    # The wrappers below (and DataHooks._wrap_user_data) run on every call of what they wrap (a
    # backward, zero_grad, a user's get_batch, ...): _active() and _enter() are written out in
    # them, and what they need is bound once, so a call costs a few attribute reads and two
    # timer switches.

    def _wrap(self, fn, name: str, counter: str):
        hooks, counts = self, self.counts
        backward = name == "backward"
        training = name in ("backward", "optimizer")  # work a data function never does
        stays_eval = name in ("data", "h2d")  # under no_grad in eval mode: still eval (_enter)
        grad_enabled = torch.is_grad_enabled

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if _is_compiling():
                return fn(*args, **kwargs)
            t = hooks.timer
            if t is None:  # nothing seen yet: a backward may start the run (_first_event)
                if not (backward and hooks._first_event()):
                    return fn(*args, **kwargs)
                t = hooks.timer
            elif hooks._off or hooks.suspended or _get_ident() != hooks._tid:
                return fn(*args, **kwargs)
            current = t.current
            if not backward:
                counts[counter] += 1
            elif current != "backward":  # not a backward inside a backward
                counts[counter] += 1
                hooks._step.backwards += 1
                if not hooks.steps_done and hooks.stop_after is not None:
                    hooks._check_first_step()
            if training and hooks._in_data:
                hooks._not_data()
            if stays_eval and current == "eval" and not grad_enabled():
                return fn(*args, **kwargs)
            prev = t.switch(name)
            try:
                return fn(*args, **kwargs)
            finally:
                t.switch("other" if prev == "eval" else prev)

        wrapper.__gpuprof_wrapped__ = fn
        return wrapper

    def _wrap_copy(self, fn, method: str):
        """Tensor.to / Tensor.cuda: the `h2d` phase when a CPU tensor goes to an accelerator."""
        hooks = self
        always = method == "cuda"

        @functools.wraps(fn)
        def wrapper(tensor, *args, **kwargs):
            if (_is_compiling() or hooks._off or not tensor.is_cpu
                    or not (always or _to_target_is_accelerator(args, kwargs)) or not hooks._active()):
                return fn(tensor, *args, **kwargs)
            nbytes = tensor.numel() * tensor.element_size()
            c, s = hooks.counts, hooks._step
            c["h2d_copies"] += 1
            c["h2d_bytes"] += nbytes
            s.h2d_copies += 1
            s.h2d_bytes += nbytes
            # A copy from pageable memory is staged by the driver and blocks the host; only a
            # pinned source with non_blocking=True overlaps compute (the h2d-pageable rule).
            if not tensor.is_pinned():
                c["h2d_pageable"] += 1
                s.h2d_pageable += 1
                s.h2d_pageable_bytes += nbytes
            if not _non_blocking(method, args, kwargs):
                c["h2d_blocking"] += 1
                s.h2d_blocking += 1
            prev = hooks._enter("h2d")
            try:
                return fn(tensor, *args, **kwargs)
            finally:
                if prev is not None:
                    hooks.timer.switch(prev)

        wrapper.__gpuprof_wrapped__ = fn
        return wrapper
