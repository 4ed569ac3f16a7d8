"""The `data` phase of the script's own functions: which names read like data loading, and the
wrapper that times such a function (a get_batch) as `data` until it is seen running the model.

DataHooks is a part of gpuprof.measure.hooks.TrainingHooks and works on its state; the runner
picks the functions (gpuprof.runners.script_discovery) and the stack sampler marks their frames.
"""

from __future__ import annotations

import functools
import threading

import torch

from gpuprof.measure.hook_calls import _is_compiling

_get_ident = threading.get_ident

class DataHooks:
    """The user data-function wrappers of TrainingHooks."""

    def wrap_attr(self, owner, attr: str, label: str) -> None:
        """Wrap owner.attr (a user function or method) so its calls are the `data` phase."""
        fn = owner[attr] if isinstance(owner, dict) else getattr(owner, attr)
        if getattr(fn, "__gpuprof_wrapped__", None) is not None:
            return
        wrapped = self._wrap_user_data(fn, label)
        if isinstance(owner, dict):
            owner[attr] = wrapped
            self._undo.append(lambda: owner.__setitem__(attr, fn))
        else:
            self._patch(owner, attr, wrapped)
        self.wrapped.append(label)

    def _wrap_user_data(self, fn, label: str):
        """A user's data function: the `data` phase, unless it turns out to run the model (a
        forward, backward or optimizer step inside it); then it is dropped for later calls."""
        hooks, counts, in_data, disqualified = self, self.counts, self._in_data, self.disqualified
        grad_enabled = torch.is_grad_enabled

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if _is_compiling() or label in disqualified:
                return fn(*args, **kwargs)
            t = hooks.timer
            if t is None or hooks._off or hooks.suspended or _get_ident() != hooks._tid:
                return fn(*args, **kwargs)
            counts["data_calls"] += 1
            prev = None if t.current == "eval" and not grad_enabled() else t.switch("data")  # _enter
            in_data.append(label)
            try:
                return fn(*args, **kwargs)
            finally:
                in_data.pop()
                if prev is not None:
                    t.switch("other" if prev == "eval" else prev)

        wrapper.__gpuprof_wrapped__ = fn
        return wrapper

    def _not_data(self) -> None:
        # Training work inside a wrapped "data" function: it was misnamed, stop wrapping it.
        self.disqualified.update(self._in_data)
