"""Timing the data calls gpuprof.runners.loader_discovery found: each producer wrapped where it can
be timed exactly as the `data` phase (gpuprof.measure.data_hooks does the timing), the rest handed
to the stack sampler by their code objects. Every patch goes on the hooks' undo list and is
removed with the run's other patches.

- a function of the user's code bound in a module's globals: that global is wrapped;
- a method of a user class: the class attribute;
- a user iterator's `__next__` (next() and for loops both call it);
- `next(gen)` of a generator: a stand-in for the builtin `next` in the globals of the module whose
  code calls it, timing `next()` of that generator function's generators only;
- a generator a `for` loop resumes, or a function the loop holds as a local: sampled.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import types

from gpuprof.measure.hook_calls import _is_compiling
from gpuprof.runners.loader_discovery import _MISSING, Found, _lookup, _Producer, _user_function, _where

_builtin_next = builtins.next


def install(hooks, producers: list[_Producer], found: Found) -> None:
    """Wrap each producer where it can be timed exactly (see the module docstring); the rest go to
    the sampler through `found.codes`."""
    import torch.utils.data as tud

    for p in producers:
        try:
            if p.kind == "function":
                _wrap_function(hooks, p, found)
            elif p.kind == "method":
                _wrap_method(hooks, p, found)
            elif p.kind == "next" and isinstance(p.call.func, ast.Name) and _user_function(
                    _unwrapped(_lookup(p.call.func, p.frame))):
                _wrap_function(hooks, p, found)  # the script's own `next()`: a function of its code
            elif p.kind == "next":
                it = _lookup(p.call.args[0] if p.call.args else p.call.func.value, p.frame)
                _wrap_iterator(hooks, p, it, found, via_next=True)
            else:  # a for loop's iterable
                it = _lookup(p.call, p.frame)
                if it is _MISSING and isinstance(p.call, ast.Call):  # `for b in batches():` a generator made there
                    it = _generator_function(_lookup(p.call.func, p.frame))
                if isinstance(it, (tud.DataLoader, tud.dataloader._BaseDataLoaderIter)):
                    continue  # timed by the DataLoader wrappers
                _wrap_iterator(hooks, p, it, found, via_next=False)
        except Exception as exc:  # noqa: BLE001 - discovery never fails the user's run
            found.notes.append(f"{p.text}: {exc.__class__.__name__}: {exc}")


def _unwrapped(fn):
    return getattr(fn, "__gpuprof_wrapped__", fn)


def _generator_function(fn):
    """A user generator function called in a `for` statement: its code stands for the generator
    the loop holds (on its stack, under no name); else _MISSING."""
    fn = _unwrapped(fn)
    return fn.__code__ if _user_function(fn) and fn.__code__.co_flags & inspect.CO_GENERATOR else _MISSING


def _wrap_function(hooks, p: _Producer, found: Found) -> None:
    name = p.call.func.id
    g = p.frame.f_globals
    fn = p.frame.f_locals.get(name, _MISSING) if p.frame.f_locals is not g else _MISSING
    if fn is not _MISSING:  # a local (a closure the loop was given): not rebindable from outside
        if _user_function(fn):
            found.codes.add(fn.__code__)
            found.sampled.append(f"{name} ({_where(fn.__code__)}), a local")
        return
    fn = g.get(name, _MISSING)
    if fn is _MISSING or not _user_function(getattr(fn, "__gpuprof_wrapped__", fn)):
        found.notes.append(f"{p.text}: not a function of the user's code")
        return
    label = f"{name} ({_where(getattr(fn, '__gpuprof_wrapped__', fn).__code__)})"
    hooks.wrap_attr(g, name, label)
    found.timed.append(label)


def _wrap_method(hooks, p: _Producer, found: Found) -> None:
    owner = _lookup(p.call.func.value, p.frame)
    attr = p.call.func.attr
    if owner is _MISSING or isinstance(owner, types.ModuleType):
        if isinstance(owner, types.ModuleType) and _user_function(vars(owner).get(attr)):
            fn = vars(owner)[attr]
            label = f"{owner.__name__}.{attr} ({_where(fn.__code__)})"
            hooks.wrap_attr(vars(owner), attr, label)
            found.timed.append(label)
        return
    cls = owner if isinstance(owner, type) else type(owner)
    for klass in cls.__mro__:
        fn = vars(klass).get(attr)
        if fn is not None:
            raw = getattr(fn, "__gpuprof_wrapped__", fn)
            if _user_function(raw):
                label = f"{klass.__name__}.{attr} ({_where(raw.__code__)})"
                hooks.wrap_attr(klass, attr, label)
                found.timed.append(label)
            else:
                found.notes.append(f"{p.text}: {klass.__name__}.{attr} is not the user's code")
            return


def _wrap_iterator(hooks, p: _Producer, it, found: Found, via_next: bool) -> None:
    if it is _MISSING:
        found.notes.append(f"{p.text}: not found in the frame")
        return
    if isinstance(it, (types.GeneratorType, types.CodeType)):
        code = it if isinstance(it, types.CodeType) else it.gi_code
        call = ast.unparse(p.call.args[0]) if via_next and p.call.args else p.text
        label = f"{f'next({call})' if via_next else f'for ... in {call}'}: {code.co_name} ({_where(code)})"
        found.codes.add(code)
        if via_next and isinstance(p.call.func, ast.Name):
            if _shim_next(hooks, p.frame.f_globals, code, label):
                found.timed.append(label)
            else:
                found.sampled.append(label)
        else:  # a for loop resumes it: sampled
            found.sampled.append(label)
        return
    cls = type(it)
    for klass in cls.__mro__:
        fn = vars(klass).get("__next__")
        if fn is not None:
            raw = getattr(fn, "__gpuprof_wrapped__", fn)
            if _user_function(raw):
                label = f"{klass.__name__}.__next__ ({_where(raw.__code__)})"
                hooks.wrap_attr(klass, "__next__", label)
                found.timed.append(label)
                return
            break
    iter_fn = getattr(cls, "__iter__", None)
    if _user_function(iter_fn) and iter_fn.__code__.co_flags & inspect.CO_GENERATOR:
        found.codes.add(iter_fn.__code__)  # `for b in loader` over a generator __iter__: sampled
        found.sampled.append(f"{cls.__name__}.__iter__ ({_where(iter_fn.__code__)})")
        return
    found.notes.append(f"{p.text}: a {cls.__name__}, not timed")


def _shim_next(hooks, g: dict, code, label: str) -> bool:
    """Put a stand-in for the builtin `next` in the globals `g` (where the script's code finds it
    before the builtins): `next()` of a generator of `code` is the `data` phase, anything else the
    builtin's own call. Undone with the run's other patches. False when `g` has a `next` of its own
    that is not a function of the user's code (left alone: then the sampler attributes it)."""
    current = g.get("next", _MISSING)
    if current is not _MISSING:
        codes = getattr(current, "__gpuprof_codes__", None)
        if codes is None:
            return False
        codes.add(code)
        return True
    timed = hooks._wrap_user_data(_builtin_next, label)
    codes = {code}
    generator = types.GeneratorType

    def next(iterator, *default):  # noqa: A001 - the builtin's stand-in in the script's globals
        if type(iterator) is generator and iterator.gi_code in codes and not _is_compiling():
            return timed(iterator, *default)
        return _builtin_next(iterator, *default)

    next.__gpuprof_codes__ = codes
    next.__gpuprof_wrapped__ = _builtin_next
    g["next"] = next
    hooks.wrapped.append(label)

    def undo():
        if g.get("next") is next:
            del g["next"]
    hooks._undo.append(undo)
    return True
