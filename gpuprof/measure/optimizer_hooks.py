"""The `optimizer` phase and the step boundary.

Optimizer step pre/post hooks time each optimizer step; a loss closure the step runs
(optimizer.step(closure): Lightning, LBFGS) keeps the phase it ran in. The post-hook of the
first optimizer seen stepping ends the training step, and so does the end of a GradScaler.step()
that skipped it (fp16 overflow). Ending a step hands the step's counters to the timer
(micro-steps = backward calls) and, after the requested steps, raises StopScript. OptimizerHooks
is a part of gpuprof.measure.hooks.TrainingHooks and works on its state.
"""

from __future__ import annotations

import functools
import threading
import weakref

from gpuprof.measure.hook_calls import _is_compiling
from gpuprof.sections.script import STEP_OPTIMIZER

_get_ident = threading.get_ident


class OptimizerHooks:
    """The optimizer hooks of TrainingHooks (install() registers them and wraps GradScaler.step)."""

    def _opt_pre(self, opt, args, kwargs):
        if not self._first_event():
            return None
        if self._outer is not None:  # a forward that never reported its end (it raised on a
            self._end_forward()  # torch without always_call hooks): end it, watch again
        if self._in_data:
            self._not_data()
        if self._primary_opt is None:
            self._primary_opt = weakref.ref(opt)
        prev = self._enter("optimizer")
        before = prev if prev is not None else self.timer.current
        self._opt_prev.append(before)
        return self._time_closure(args, kwargs, before)

    def _time_closure(self, args, kwargs, label: str):
        """optimizer.step(closure) (Lightning, LBFGS) runs the loss closure -- a training_step's
        forward, backward and bookkeeping -- inside the step: the closure's time is not the
        optimizer's. Returns the (args, kwargs) with the closure wrapped, or None."""
        # torch passes the step's own positional args to the hook: (optimizer, closure, ...)
        if "closure" in kwargs and callable(kwargs["closure"]):
            closure, where = kwargs["closure"], "kw"
        elif len(args) > 1 and callable(args[1]):
            closure, where = args[1], "pos"
        else:
            return None
        timer = self.timer

        def timed_closure(*a, **k):
            back = timer.switch(label)
            try:
                return closure(*a, **k)
            finally:
                timer.switch(back)

        if where == "kw":
            return args, dict(kwargs, closure=timed_closure)
        return (args[0], timed_closure, *args[2:]), kwargs

    def _opt_post(self, opt, args, kwargs):
        if self.stopped and _get_ident() == self._tid:  # a bare `except:` swallowed the first one
            self._raise_stop()
        if not self._active() or not self._opt_prev:
            return None
        self.timer.switch(self._opt_prev.pop())
        primary = self._primary_opt() if self._primary_opt is not None else None
        if opt is not primary or self._opt_prev or self.step_rule not in (None, STEP_OPTIMIZER):
            self.counts["other_optimizer_step"] += 1
            return None
        self.counts["optimizer_step"] += 1
        self._close_step(STEP_OPTIMIZER, f"{type(opt).__name__}.step()")
        return None

    def _wrap_scaler_step(self, fn):
        """GradScaler.step(optimizer) skips optimizer.step() when fp16 gradients overflowed (often
        in the first steps, while the scale calibrates): the step still ends there."""
        hooks = self

        @functools.wraps(fn)
        def wrapper(scaler, optimizer, *args, **kwargs):
            if _is_compiling() or not hooks._first_event():
                return fn(scaler, optimizer, *args, **kwargs)
            done = hooks.steps_done
            prev = hooks._enter("optimizer")
            try:
                result = fn(scaler, optimizer, *args, **kwargs)
            finally:
                hooks.timer.switch(prev)
            primary = hooks._primary_opt() if hooks._primary_opt is not None else None
            if (hooks.steps_done == done and primary in (None, optimizer) and not hooks._off
                    and hooks.step_rule in (None, STEP_OPTIMIZER)):
                hooks._primary_opt = hooks._primary_opt or weakref.ref(optimizer)
                hooks.counts["skipped_optimizer_step"] += 1
                hooks._close_step(STEP_OPTIMIZER, f"{type(optimizer).__name__}.step() (through GradScaler.step)")
            return result

        wrapper.__gpuprof_wrapped__ = fn
        return wrapper
