"""The `forward` and `eval` phases: which module calls are the model's forward, and their end.

A global module forward pre-hook catches each outermost module call with grad enabled, and a
forward hook on that module, registered for that one call, ends it (see ForwardHooks._fwd_pre for
why not a global post-hook) and counts the step's tokens. Between calls nothing of gpuprof's is
on the user's modules: `torch.save(model)`, `copy.deepcopy`, pickle and `state_dict()` see the
model exactly as the script made it. A forward under no_grad/inference_mode is `eval`, and stays `eval`
until the next training event (a grad-enabled forward, backward, optimizer work or grad-enabled
data call), so the loss.item() and batches of an evaluation loop are not training time either.
A torch.compile'd model counts once: its OptimizedModule is the outermost call; the inner module
runs while the global pre-hook is unregistered (and the hooks return at once inside dynamo's
trace: is_compiling()). ForwardHooks is a part of gpuprof.measure.hooks.TrainingHooks and works
on its state.
"""

from __future__ import annotations

import sys
import threading

import torch
from torch.nn.modules import module as nn_module

from gpuprof.measure.hook_calls import _caller_kwargs, _compiled_graph_call, _is_compiling, _tokens_of

_get_ident = threading.get_ident


def _forward_hook(module, hook):
    """A forward hook on `module` that also runs when forward raises (where torch supports it)."""
    try:
        return module.register_forward_hook(hook, with_kwargs=True, always_call=True)
    except TypeError:  # torch < 2.1
        return module.register_forward_hook(hook, with_kwargs=True)


class ForwardHooks:
    """The forward hooks of TrainingHooks (install() registers the global pre-hook)."""

    def _fwd_pre(self, module, args):
        """Global forward pre-hook: an outermost module call on the script's thread starts a
        `forward` (or `eval`) span. It then unregisters itself until that call ends, so the
        model's submodules take torch's hook-free fast path (a global hook sends every module
        call through the slow path, ~2 µs each); a forward hook on the outermost module itself,
        registered for this call only, ends the span, registers the pre-hook again and removes
        itself (a hook left on the user's module would be pickled with it)."""
        if _is_compiling() or _compiled_graph_call(module):
            return None
        if self.stopped and _get_ident() == self._tid:  # a bare `except:` swallowed StopScript
            self._raise_stop()
        if self._off or self.suspended:
            return None
        timer = self.timer
        if timer is not None and timer.current == "backward":
            # activation checkpointing recomputing a forward: part of the backward, counted (every
            # module call of the recomputed region while the pre-hook stays registered). Before the
            # thread check: on CUDA the autograd engine runs the backward on its own device thread.
            self.counts["forward_in_backward"] += 1
            return None
        if _get_ident() != self._tid:
            return None
        if self._stale is not None:  # the hook of a forward that raised: removed now
            self._stale.remove()
            self._stale = None
        training = torch.is_grad_enabled()
        if timer is None:
            if not self._start(module, args, _caller_kwargs()):
                return None
            timer = self.timer
        elif training and self._step.backwards and self.step_rule != "optimizer":
            self._loop_iteration()  # may close the step (the `backward` step rule), or stop
        if self.steps_done == 0 and self.stop_after is not None:
            self._check_first_step(int(training), int(not training))
        # Step aside (a dict pop, not a handle's remove: no allocation per forward).
        nn_module._global_forward_pre_hooks.pop(self._pre_id, None)
        self._outer = module
        self._outer_handle = _forward_hook(module, self._fwd_post)
        if training:
            if self._in_data:
                self._not_data()
            self.counts["forward"] += 1
            self._step.forwards += 1
            self._fwd_training = True
            prev = timer.switch("forward")
            self._fwd_prev = "other" if prev == "eval" else prev
            for watcher in self.forward_watchers:
                watcher.arm()
        else:
            self._fwd_training = False
            self.counts["eval_forward"] += 1
            self._step.eval_forwards += 1
            timer.switch("eval")
            self._fwd_prev = "eval"  # eval mode sticks until the next training event
        return None

    def _fwd_post(self, module, args, kwargs=None, output=None):
        """Forward hook on an outermost module (module, args, kwargs, output), for its current
        call: the end of its span, also when forward raised (always_call). Calls of it nested
        in another forward are ignored."""
        if module is not self._outer or _is_compiling() or _get_ident() != self._tid:
            return None
        if self._fwd_training and self.forward_watchers:
            for watcher in self.forward_watchers:
                watcher.disarm()
            self.forward_watchers[:] = [w for w in self.forward_watchers if not w.done]
        # The always-call path after a raising forward passes no output (and is iterating over
        # the module's hook dict): then the hook is removed later.
        self._end_forward(raised=output is None and sys.exc_info()[0] is not None)
        if not self._off and self._fwd_training:  # tokens counted here: the pre-hook sees no kwargs
            self._step.tokens += _tokens_of(args, kwargs)
        return None

    def _end_forward(self, raised: bool = False) -> None:
        self._outer = None
        self._drop_outer_hook(raised)
        if self._off:
            return
        # Watch for the next outermost call again: the same hook under the same key.
        nn_module._global_forward_pre_hooks[self._pre_id] = self._pre_fn
        self.timer.switch(self._fwd_prev)

    def _drop_outer_hook(self, raised: bool = False) -> None:
        """Remove this call's forward hook from the user's module. When its forward raised, torch
        is iterating over that module's hook dict (Module._call_impl's always-call path): a
        removal then would turn the user's error into another one, so the handle is removed at
        the next forward (or at remove())."""
        handle, self._outer_handle = self._outer_handle, None
        if handle is None:
            return
        if raised:
            if self._stale is not None:
                self._stale.remove()
            self._stale = handle
        else:
            handle.remove()
