"""What a training step is, for any training loop, and the bound on a loop that shows none.

A step is the unit the script's loop repeats. Three rules, the first that the run's own calls
show wins and holds for the rest of the run (gpuprof.sections.script.STEP_RULES):

- `optimizer`: an optimizer's step (its post-hook, or a GradScaler.step that skipped it) ends the
  step; the backward calls before it are its micro-steps (gradient accumulation).
- `zero_grad`: the gradients of a backward are reset -- `model.zero_grad()` (nn.Module's) or an
  optimizer's zero_grad -- with no optimizer step since that backward: they were consumed by an
  update the script makes by hand (`p.data.add_(p.grad, alpha=-lr)`, pytorch/examples'
  word_language_model). The reset opens the next step.
- `backward`: no optimizer exists in the process, and a forward with gradients enabled follows a
  backward with neither an optimizer step nor a reset in between: each loop iteration that holds
  one backward is a step; that forward opens the next one.

A script that shows none of them is stopped rather than run blind (only when gpuprof stops the
script after its steps, i.e. not under --no-stop): before the first step, after `forwards`
forwards with gradients enabled and no backward (an inference script that forgot no_grad),
`eval_forwards` no_grad forwards and nothing else, `backwards` backwards with no step, or
`seconds` since the first forward (a loop gpuprof cannot follow). StepRules is a part of
gpuprof.measure.hooks.TrainingHooks and works on its state.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field

from gpuprof.measure.hook_calls import _is_compiling
from gpuprof.sections.script import STEP_BACKWARD, STEP_ZERO_GRAD

_get_ident = threading.get_ident


class StopScript(BaseException):
    """Raised from a hook after the requested steps (or when no step can be seen). A
    BaseException, so a script's `except Exception:` cannot swallow it."""


@dataclass(frozen=True)
class NoStepLimits:
    """When a script that has not completed a training step is stopped (see the module doc).
    nanoGPT evaluates 2 × eval_iters = 400 no_grad batches before its first step by default, and
    a compiled 1.5B model with 64 micro-steps may take minutes to its first optimizer step."""

    forwards: int = 32
    eval_forwards: int = 5000
    backwards: int = 4096
    seconds: float = 600.0


@dataclass
class _StepCounts:
    collectives: dict = field(default_factory=dict)  # kind -> calls, bytes, seconds (collective_hooks)
    forwards: int = 0
    eval_forwards: int = 0
    backwards: int = 0
    tokens: int = 0
    h2d_copies: int = 0
    h2d_bytes: int = 0
    h2d_pageable: int = 0
    h2d_pageable_bytes: int = 0
    h2d_blocking: int = 0

    def extra(self) -> dict:
        d = {"forwards": self.forwards, "backwards": self.backwards, "eval_forwards": self.eval_forwards}
        if self.h2d_copies:
            d.update(h2d_copies=self.h2d_copies, h2d_bytes=self.h2d_bytes, h2d_pageable=self.h2d_pageable,
                     h2d_pageable_bytes=self.h2d_pageable_bytes, h2d_blocking=self.h2d_blocking)
        if self.collectives:
            d["collectives"] = self.collectives
        return d


class StepRules:
    """The step boundary and the no-step bound of TrainingHooks."""

    def _close_step(self, rule: str, marker: str) -> None:
        """End the open step by `rule` (what `marker` names: "AdamW.step()"); the first rule that
        closes a step is the run's."""
        if self.step_rule is None:
            self.step_rule, self.step_marker = rule, marker
        s = self._step
        self.timer.end_step(tokens=s.tokens, micro_steps=s.backwards or s.forwards, extra=s.extra())
        self._step = _StepCounts()
        self.steps_done += 1
        if self._on_step is not None and (self.stop_after is None or self.steps_done <= self.stop_after):
            self._on_step(self.steps_done)  # the run's steps (experiment steps after them are not)
        if self.stop_after is not None and self.steps_done >= self.stop_after:
            # After the measured steps: experiment steps in the script's own loop, if any, then the stop
            # (gpuprof.measure.experiments). Between two steps: outside both steps' timing.
            if self.experiments is not None and self.experiments.next_step(self):
                self.timer.start_step()
                return
            self.stopped = True
            self._off = True  # nothing after this point is measured
            self._raise_stop()
        self.timer.start_step()

    def _raise_stop(self):
        if self.no_step is not None:
            raise StopScript(f"gpuprof: stopping the script: no training step seen ({self.no_step})")
        raise StopScript(f"gpuprof: stopping the script after {self.steps_done} steps")

    # -- the `zero_grad` rule --------------------------------------------------------------------

    def _wrap_reset(self, fn, counter: str):
        """Module.zero_grad / Optimizer.zero_grad: the `optimizer` phase (as the built-in loop
        times it), and a step boundary under the `zero_grad` rule."""
        hooks = self
        timed = self._wrap(fn, "optimizer", counter)

        @functools.wraps(fn)
        def wrapper(owner, *args, **kwargs):
            if (hooks._step.backwards and hooks.step_rule in (None, STEP_ZERO_GRAD) and not _is_compiling()
                    and hooks._active()):
                hooks._close_step(STEP_ZERO_GRAD, f"{type(owner).__name__}.zero_grad()")
            return timed(owner, *args, **kwargs)

        wrapper.__gpuprof_wrapped__ = fn
        return wrapper

    # -- the `backward` rule ---------------------------------------------------------------------

    def _loop_iteration(self) -> None:
        """A forward with gradients enabled after a backward of the open step, with no optimizer
        step or gradient reset since (the caller checked): with no optimizer in the process, the
        loop went round once, so its step ends here (with one, it is gradient accumulation)."""
        if self.step_rule == STEP_BACKWARD or (self.step_rule is None and not self._optimizers_alive()):
            self._close_step(STEP_BACKWARD, "a forward after a backward (no optimizer in the script)")

    def _optimizers_alive(self) -> int:
        """torch.optim.Optimizer objects alive in the process, counted once (a scan of the
        objects the garbage collector tracks: once per run, at the first forward after a
        backward with no step), so a loop with gradient accumulation pays it once."""
        if self.optimizers_alive is None:
            import gc

            import torch

            gc.collect()  # an optimizer only a reference cycle keeps is not the loop's
            opt = torch.optim.Optimizer  # by type: isinstance would read a proxy's __class__
            self.optimizers_alive = sum(1 for o in gc.get_objects() if issubclass(type(o), opt))
        return self.optimizers_alive

    # -- no step ---------------------------------------------------------------------------------

    def _check_first_step(self, forwards: int = 0, eval_forwards: int = 0) -> None:
        """Before the first step closes, at each outermost forward (not counted yet: `forwards`
        or `eval_forwards` is 1) and backward (counted): stop the script when it is past the
        NoStepLimits."""
        c, lim = self.counts, self.no_step_limits
        fwd, ev, bwd = c["forward"] + forwards, c["eval_forward"] + eval_forwards, c["backward"]
        waited = self._clock() - self._t0
        why = None
        if bwd == 0 and fwd >= lim.forwards:
            why = f"{fwd} forwards with gradients enabled and no backward"
        elif bwd == 0 and fwd == 0 and ev >= lim.eval_forwards:
            why = f"{ev} forwards under no_grad and no training forward"
        elif bwd >= lim.backwards:
            why = f"{bwd} backward calls and no optimizer step, gradient reset or loop iteration ending one"
        elif waited >= lim.seconds:
            why = f"{waited:.0f} s since the first forward without a complete step"
        if why is None:
            return
        c["forward"], c["eval_forward"] = fwd, ev  # the forward that stops the script was seen
        self.no_step = why
        self.stopped = True
        self._off = True
        self._raise_stop()
