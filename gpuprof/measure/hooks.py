"""Phases of an unmodified training script, from torch's public hooks and a few wrappers.

`TrainingHooks.install()` drives a PhaseTimer from the script's own calls:

- forward: a global module forward pre-hook catches each outermost module call with grad
  enabled, and a forward hook on that module ends it (see _fwd_pre for why not a global
  post-hook). A forward under no_grad/inference_mode is `eval`, and stays `eval` until the
  next training event (a grad-enabled forward, backward, optimizer work or grad-enabled data
  call), so the loss.item() and batches of an evaluation loop are not training time either.
  A torch.compile'd model counts once: its OptimizedModule is the outermost call; the inner
  module runs while the global pre-hook is unregistered (and hooks return at once inside
  dynamo's trace: is_compiling()).
- backward: a wrapper around torch.autograd.backward (Tensor.backward calls it).
- optimizer: optimizer step pre/post hooks, plus Optimizer.zero_grad, clip_grad_norm_ and
  GradScaler.unscale_/step/update, so the phase means what it means in the built-in loop.
- step boundary: the post-hook of the first optimizer seen stepping, or the end of a
  GradScaler.step() that skipped it (fp16 overflow). micro-steps = backward calls.
- a model compiled in place (Module.compile()) runs the forward hooks inside dynamo's trace, so
  no forward is seen: the first backward or optimizer step then starts the run, and forward
  time falls into `other`.
- h2d: Tensor.to/.cuda from a CPU tensor to an accelerator, and Tensor.pin_memory; not
  wrapped at all when torch sees no accelerator (no copy is possible, and clip_grad_norm_ alone
  calls Tensor.to once per parameter).
- data: DataLoader.__iter__ / _BaseDataLoaderIter.__next__, and user functions the runner
  wraps with `wrap_attr` (get_batch-like functions of the script).

Every hook and wrapper is removed by `remove()`; a wrapper the script still holds a reference to
afterwards just calls the original. Hooks ignore other threads, forked DataLoader workers, and
calls made while `suspended` (an instrument running the model itself).
"""

from __future__ import annotations

import functools
import os
import re
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

from gpuprof.measure.timer import PhaseTimer

try:
    from torch.compiler import is_compiling as _is_compiling
except ImportError:  # torch < 2.3
    def _is_compiling() -> bool:
        return False

_get_ident = threading.get_ident
_Tensor = torch.Tensor
_ACTIVE: "weakref.WeakSet[TrainingHooks]" = weakref.WeakSet()
_FORK_HANDLER = False


def _dead_ref():  # what a weakref to nothing answers: the "no last outermost module yet" state
    return None


def _after_fork_in_child() -> None:
    # A forked DataLoader worker inherits the patched functions; make them inert there.
    for hooks in list(_ACTIVE):
        hooks._off = True


class StopScript(BaseException):
    """Raised from the optimizer post-hook after the requested steps. A BaseException, so a
    script's `except Exception:` cannot swallow it."""


@dataclass
class _StepCounts:
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
        return d


def _first_tensor(args, kwargs):
    for a in args:
        if isinstance(a, _Tensor):
            return a
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, _Tensor):
                return a
    return None


# Integer dtypes a token-id tensor can have (not bool, float or complex).
_ID_DTYPES = frozenset(getattr(torch, n) for n in ("int64", "int32", "int16", "int8", "uint8", "uint16",
                                                   "uint32", "uint64") if hasattr(torch, n))


def _tokens_of(args, kwargs) -> int:
    """Tokens in one forward: the element count of its first tensor input when it holds integer
    ids (a language model's idx); 0 when the first input is not token ids."""
    t = _first_tensor(args, kwargs)
    if t is None or t.dtype not in _ID_DTYPES:
        return 0
    return t.numel()


def _caller_kwargs() -> dict:
    """The keyword arguments of the module call being pre-hooked. A global forward pre-hook gets
    only positional args; Module._call_impl holds the kwargs in the frame that calls the hooks
    (this function <- _fwd_pre <- that frame). {} if the layout differs."""
    try:
        kw = sys._getframe(2).f_locals.get("kwargs")
    except ValueError:
        return {}
    return dict(kw) if isinstance(kw, dict) else {}


def accelerator_available() -> bool:
    """True when torch can reach a device other than the CPU (CUDA, MPS, XPU, ...)."""
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "is_available"):
        return bool(acc.is_available())
    mps = getattr(torch.backends, "mps", None)
    return torch.cuda.is_available() or bool(mps is not None and mps.is_available())


def _forward_hook(module, hook):
    """A forward hook on `module` that also runs when forward raises (where torch supports it)."""
    try:
        return module.register_forward_hook(hook, with_kwargs=True, always_call=True)
    except TypeError:  # torch < 2.1
        return module.register_forward_hook(hook, with_kwargs=True)


def _is_accelerator(dev) -> bool:
    if isinstance(dev, torch.device):
        return dev.type not in ("cpu", "meta")
    if isinstance(dev, str):
        return not (dev.startswith("cpu") or dev.startswith("meta"))
    if isinstance(dev, int) and not isinstance(dev, bool):
        return True  # a bare index means cuda:N
    return False


def _non_blocking(method: str, args, kwargs) -> bool:
    """The non_blocking flag of a Tensor.cuda / Tensor.to call, keyword or positional:
    cuda(device, non_blocking); to(dtype, non_blocking), to(tensor, non_blocking),
    to(device, dtype, non_blocking)."""
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    if method == "cuda":
        pos = 1
    elif args and isinstance(args[0], (torch.dtype, torch.Tensor)):
        pos = 1
    else:
        pos = 2
    return bool(args[pos]) if len(args) > pos and isinstance(args[pos], bool) else False


def _to_target_is_accelerator(args, kwargs) -> bool:
    dev = kwargs.get("device")
    if dev is None and args:
        a = args[0]
        if isinstance(a, torch.Tensor):
            dev = a.device
        elif not isinstance(a, torch.dtype):
            dev = a
    return dev is not None and _is_accelerator(dev)


class TrainingHooks:
    """Installs the hooks; keeps the phase state and the counters of one script run.

    on_first_forward(module, args, kwargs) -> PhaseTimer: called once, at the first outermost
    forward (with hooks suspended); the returned timer is then driven by the hooks.
    on_step(done): called after each closed step. stop_after: raise StopScript once that many
    steps are closed (None: never).
    """

    def __init__(self, on_first_forward: Callable, on_step: Callable[[int], None] | None = None,
                 stop_after: int | None = None):
        self._on_first_forward = on_first_forward
        self._on_step = on_step
        self.stop_after = stop_after
        self.timer: PhaseTimer | None = None
        self.steps_done = 0
        self.stopped = False
        self.suspended = False
        self._off = True
        self._tid = _get_ident()
        self._pre_handle = None  # the global forward pre-hook's handle, from install() to remove()
        self._pre_id = None  # its key in torch's dict of global forward pre-hooks
        self._pre_fn = None  # the bound method stored there (made once, not per forward)
        # module -> its forward-hook handle; weak, so a module created per call (an inline
        # `nn.CrossEntropyLoss()(...)`) does not leave a stale entry a new one could alias
        self._post_hooked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._outer = None  # the outermost module whose forward is running
        self._last_outer = _dead_ref  # weak: the last one, known to carry our forward hook
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
                           skipped_optimizer_step=0)
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
                    self._wrap(torch.optim.Optimizer.zero_grad, "optimizer", "optimizer_aux"))
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
        for h in (*self._handles, *list(self._post_hooked.values())):
            h.remove()
        self._handles.clear()
        self._post_hooked.clear()
        self._last_outer = _dead_ref
        while self._undo:
            self._undo.pop()()
        _ACTIVE.discard(self)

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

    def _patch(self, owner, attr: str, wrapper) -> None:
        if attr in vars(owner):  # restore exactly what the owner itself held
            original = vars(owner)[attr]
            self._undo.append(lambda: setattr(owner, attr, original))
        else:  # inherited (e.g. Tensor.to from the C base): delete ours to uncover it again
            self._undo.append(lambda: delattr(owner, attr))
        setattr(owner, attr, wrapper)

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

    # The wrappers below run on every call of what they wrap (a backward, zero_grad, a user's
    # get_batch, ...): _active() and _enter() are written out in them, and what they need is
    # bound once, so a call costs a few attribute reads and two timer switches.

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
            if hooks.steps_done == done and primary in (None, optimizer) and not hooks._off:
                hooks._primary_opt = hooks._primary_opt or weakref.ref(optimizer)
                hooks.counts["skipped_optimizer_step"] += 1
                hooks._close_step()
            return result

        wrapper.__gpuprof_wrapped__ = fn
        return wrapper

    def _not_data(self) -> None:
        # Training work inside a wrapped "data" function: it was misnamed, stop wrapping it.
        self.disqualified.update(self._in_data)

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

    # -- forward hooks -------------------------------------------------------------------------

    def _fwd_pre(self, module, args):
        """Global forward pre-hook: an outermost module call on the script's thread starts a
        `forward` (or `eval`) span. It then unregisters itself until that call ends, so the
        model's submodules take torch's hook-free fast path (a global hook sends every module
        call through the slow path, ~2 µs each); a forward hook on the outermost module itself
        ends the span and registers the pre-hook again."""
        if _is_compiling():
            return None  # inside dynamo's trace of a compiled model
        if self._off or self.suspended or _get_ident() != self._tid:
            return None
        timer = self.timer
        if timer is None:
            if not self._start(module, args, _caller_kwargs()):
                return None
            timer = self.timer
        if timer.current == "backward":
            return None  # activation checkpointing recomputing a forward: part of the backward
        # Step aside (a dict pop, not a handle's remove: no allocation per forward).
        nn_module._global_forward_pre_hooks.pop(self._pre_id, None)
        self._outer = module
        if self._last_outer() is not module:  # usually the same model every time
            if module not in self._post_hooked:
                self._post_hooked[module] = _forward_hook(module, self._fwd_post)
            self._last_outer = weakref.ref(module)
        if torch.is_grad_enabled():
            if self._in_data:
                self._not_data()
            self.counts["forward"] += 1
            self._step.forwards += 1
            self._fwd_training = True
            prev = timer.switch("forward")
            self._fwd_prev = "other" if prev == "eval" else prev
        else:
            self._fwd_training = False
            self.counts["eval_forward"] += 1
            self._step.eval_forwards += 1
            timer.switch("eval")
            self._fwd_prev = "eval"  # eval mode sticks until the next training event
        return None

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
        self.timer.start_step()
        return True

    def _first_event(self) -> bool:
        """For backward/optimizer wrappers: True when measuring, starting if nothing was seen yet."""
        if self.timer is None and not (self._off or self.suspended or _get_ident() != self._tid):
            self.counts["no_forward_start"] = 1
            self._start(None, (), {})
        return self._active()

    def _fwd_post(self, module, args, kwargs=None, output=None):
        """Forward hook on an outermost module (module, args, kwargs, output): the end of its span,
        also when forward raised (always_call). Calls of it nested in another forward are ignored."""
        if module is not self._outer or _is_compiling() or _get_ident() != self._tid:
            return None
        self._outer = None
        if self._off:
            return None
        # _end_forward, written out: watch for the next outermost call again (same hook, same key)
        nn_module._global_forward_pre_hooks[self._pre_id] = self._pre_fn
        self.timer.switch(self._fwd_prev)
        if self._fwd_training:  # tokens counted here: the pre-hook sees no kwargs
            t = args[0] if args else None
            if type(t) is not _Tensor:  # not a plain tensor first (an nn.Parameter, a kwarg, ...)
                t = _first_tensor(args, kwargs)
            if t is not None and t.dtype in _ID_DTYPES:
                self._step.tokens += t.numel()
        return None

    def _end_forward(self) -> None:
        self._outer = None
        if self._off:
            return
        # Watch for the next outermost call again: the same hook under the same key.
        nn_module._global_forward_pre_hooks[self._pre_id] = self._pre_fn
        self.timer.switch(self._fwd_prev)

    # -- optimizer hooks -----------------------------------------------------------------------

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
            raise StopScript(f"gpuprof: stopping the script after {self.steps_done} optimizer steps")
        if not self._active() or not self._opt_prev:
            return None
        self.timer.switch(self._opt_prev.pop())
        primary = self._primary_opt() if self._primary_opt is not None else None
        if opt is not primary or self._opt_prev:
            self.counts["other_optimizer_step"] += 1
            return None
        self.counts["optimizer_step"] += 1
        self._close_step()
        return None

    def _close_step(self) -> None:
        s = self._step
        self.timer.end_step(tokens=s.tokens, micro_steps=s.backwards or s.forwards, extra=s.extra())
        self._step = _StepCounts()
        self.steps_done += 1
        if self._on_step is not None:
            self._on_step(self.steps_done)
        if self.stop_after is not None and self.steps_done >= self.stop_after:
            self.stopped = True
            self._off = True  # nothing after this point is measured
            raise StopScript(f"gpuprof: stopping the script after {self.steps_done} optimizer steps")
        self.timer.start_step()



# Names of user functions taken for data loading: nanoGPT's get_batch, build-nanogpt's
# next_batch, load_* helpers, a Dataset's __getitem__, an iterator's __next__. Names that say
# they do something else (train_batch, load_checkpoint) are left alone.
_DATA_NAME = re.compile(r"batch|load|__getitem__|__next__", re.I)
_NOT_DATA = re.compile(r"train|step|loss|eval|forward|backward|model|ckpt|checkpoint|state|save|"
                       r"weight|config|process|run|update|optim", re.I)


def data_like_name(name: str) -> bool:
    """True for a function name that reads like a data-loading function."""
    return bool(_DATA_NAME.search(name)) and not _NOT_DATA.search(name)
