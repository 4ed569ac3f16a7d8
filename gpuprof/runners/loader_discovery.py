"""Which call of the script produces the batch its model consumes: found from the first training
forward's call site, whatever the loader's shape or name, and timed as the `data` phase.

At the first forward, the innermost frame of the user's code is the one calling the model
(`loss = model(x, y)`). Its source line and the instruction running in it (`co_positions`) give
that call's arguments; each argument's names are followed back through the assignments of the
same scope (`x, y, state = next(train_loader)`, `batch = next(it)` then `x, y = batch`, a `for`
target), and a function's parameters through its caller's frame, to the calls that produced them.
gpuprof.runners.loader_timing then instruments each producer where it can be timed exactly:

- `F(...)`, F a function of the user's code bound in a module's globals (nanoGPT's get_batch):
  that global is wrapped (gpuprof.measure.data_hooks);
- `obj.meth(...)`, meth a method of a user class (build-nanogpt's DataLoaderLite.next_batch): the
  class attribute is wrapped;
- `next(it)`: `it` a user iterator class: its `__next__` is wrapped; `it` a generator (a loader
  that reads and tokenizes as it yields, nanochat's shape): a stand-in for the builtin `next` is
  put in the globals of the module whose code calls it, which times `next()` of that generator
  function's generators only and calls the builtin for anything else; removed after the run;
- a DataLoader (or its iterator) is already timed by gpuprof.measure.hooks.

A generator advanced by a `for` loop cannot be timed from outside (the loop resumes it without a
call gpuprof can see): its code objects are handed to the stack sampler, which moves the `other`
time sampled inside it to `data` (gpuprof.runners.script_profile._attribute_data).

Nothing here runs the script's code: names are looked up, never evaluated (an attribute through
inspect.getattr_static, so no property runs), and any failure leaves the name-based fallback
(gpuprof.runners.script_discovery.wrap_data_functions) to do what it can.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import os
import sys
import types
from dataclasses import dataclass, field

from gpuprof.measure.stacks import is_user_file

MAX_CALLERS = 3  # function parameters followed up through at most this many callers
MAX_HOPS = 4  # assignments followed back within one scope (batch = next(it); x, y = batch; ...)
_WRAPPERS = ("enumerate", "iter", "zip", "tqdm", "trange", "islice", "cycle", "chain")  # for ... in enumerate(loader)


@dataclass
class Found:
    """What discovery found and instrumented at the first forward."""

    timed: list[str] = field(default_factory=list)  # labels of the producers timed exactly
    sampled: list[str] = field(default_factory=list)  # producers only the sampler can attribute
    codes: set = field(default_factory=set)  # their code objects, for the sampler's marker
    call_site: str | None = None  # file:line of the model call the batch was followed from
    notes: list[str] = field(default_factory=list)  # why a producer was not instrumented

    def to_dict(self) -> dict:
        return {"call_site": self.call_site, "timed": list(self.timed), "sampled": list(self.sampled),
                "notes": self.notes[:5]}


# -- source ----------------------------------------------------------------------------------

_TREES: dict[str, ast.AST | None] = {}


def _tree(filename: str):
    if filename not in _TREES:
        try:
            with open(filename, "rb") as f:
                _TREES[filename] = ast.parse(f.read(), filename)
        except (OSError, SyntaxError, ValueError):
            _TREES[filename] = None
    return _TREES[filename]


def _position(frame):
    """(lineno, end_lineno, col, end_col) of the instruction the frame is running (Python 3.11+)."""
    try:
        positions = list(frame.f_code.co_positions())
        return positions[frame.f_lasti // 2]
    except (AttributeError, IndexError, ValueError):
        return (frame.f_lineno, None, None, None)


def _call_at(tree, frame) -> ast.Call | None:
    """The Call node of the frame's current instruction (the exact span when known, else the
    outermost call on its line)."""
    line, end, col, end_col = _position(frame)
    on_line = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno == line]
    exact = [n for n in on_line if (n.end_lineno, n.col_offset, n.end_col_offset) == (end, col, end_col)]
    if exact:
        return exact[0]
    return min(on_line, key=lambda n: n.col_offset) if on_line else None


def _scope(tree, line: int):
    """The innermost function whose body holds `line`, else the module."""
    best = tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= (node.end_lineno or 0):
            if best is tree or node.lineno >= best.lineno:
                best = node
    return best


def _own_nodes(scope):
    """The scope's nodes, not those of functions, classes or lambdas defined inside it."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def _names(expr) -> list[str]:
    """The names an expression reads (`batch` in `batch["x"].to(dev)`; not inside lambdas)."""
    out = []
    todo = [expr]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            out.append(node.id)
        elif not isinstance(node, ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))
    return list(dict.fromkeys(out))


def _binds(target, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target))


def _producers(scope, name: str) -> list[tuple[str, ast.AST]]:
    """Where `name` is bound in the scope: ("value", the assigned expression) or ("iter", the
    iterable of a `for` whose target binds it)."""
    out = []
    for node in _own_nodes(scope):
        if isinstance(node, ast.Assign) and any(_binds(t, name) for t in node.targets):
            out.append(("value", node.value))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None and _binds(node.target, name):
            out.append(("value", node.value))
        elif isinstance(node, ast.NamedExpr) and node.target.id == name:
            out.append(("value", node.value))
        elif isinstance(node, (ast.For, ast.AsyncFor)) and _binds(node.target, name):
            out.append(("iter", node.iter))
        elif isinstance(node, ast.comprehension) and _binds(node.target, name):
            out.append(("iter", node.iter))
    return out


def _params(scope) -> list[str]:
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return []
    a = scope.args
    return [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)] + \
        ([a.vararg.arg] if a.vararg else []) + ([a.kwarg.arg] if a.kwarg else [])


# -- values, looked up and never evaluated ------------------------------------------------------

_MISSING = object()


def _lookup(expr, frame):
    """The value of a Name or an attribute chain on one (`self.loader`) in the frame, or _MISSING."""
    if isinstance(expr, ast.Name):
        for ns in (frame.f_locals, frame.f_globals, vars(builtins)):
            if expr.id in ns:
                return ns[expr.id]
        return _MISSING
    if isinstance(expr, ast.Attribute):
        owner = _lookup(expr.value, frame)
        if owner is _MISSING:
            return _MISSING
        try:
            value = inspect.getattr_static(owner, expr.attr)
        except AttributeError:
            return _MISSING
        if isinstance(value, (staticmethod, classmethod, property, types.MemberDescriptorType,
                              types.GetSetDescriptorType)):
            return _MISSING if isinstance(value, property) else getattr(owner, expr.attr, _MISSING)
        if isinstance(value, types.FunctionType) and not isinstance(owner, type):
            return types.MethodType(value, owner)  # a method looked up on an instance: bound
        return value
    return _MISSING


def _is_batch(value) -> bool:
    """A value the model consumes as data: a tensor, or a container holding one."""
    import torch

    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(isinstance(v, torch.Tensor) for v in list(value.values())[:32])
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, torch.Tensor) for v in value[:32])
    fields = getattr(value, "__dict__", None)  # a dataclass / namespace batch
    return isinstance(fields, dict) and any(isinstance(v, torch.Tensor) for v in list(fields.values())[:32])


def _user_function(fn) -> bool:
    return isinstance(fn, types.FunctionType) and is_user_file(fn.__code__.co_filename)


def _where(code) -> str:
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"


# -- discovery ---------------------------------------------------------------------------------

@dataclass
class _Producer:
    kind: str  # function | method | next | iter
    frame: object
    call: ast.AST
    text: str


def _caller_frame(start) -> object | None:
    """The innermost frame of the user's code above `start` (the frame calling the model)."""
    f = start
    while f is not None and not is_user_file(f.f_code.co_filename):
        f = f.f_back
    return f


def find_producers(frame, call: ast.Call, tree, found: Found) -> list[_Producer]:
    """The calls that produced the batch `call` (the model call in `frame`) consumes."""
    out: dict[str, _Producer] = {}
    args = [*call.args, *(k.value for k in call.keywords)]
    pending = [(frame, tree, n, 0) for a in args for n in _names(a)]
    seen: set = set()
    while pending:
        fr, tr, name, depth = pending.pop(0)
        if (id(fr), name) in seen or len(seen) > 64:
            continue
        seen.add((id(fr), name))
        if depth == 0 and not _is_batch(fr.f_locals.get(name, fr.f_globals.get(name))):
            continue  # the model call's own non-data arguments (a device, a flag)
        scope = _scope(tr, _position(fr)[0])
        producers = _producers(scope, name)
        if not producers and name in _params(scope):
            up = fr.f_back
            caller_tree = _tree(up.f_code.co_filename) if up is not None and is_user_file(up.f_code.co_filename) else None
            caller_call = _call_at(caller_tree, up) if caller_tree is not None else None
            if caller_call is not None and depth < MAX_CALLERS + MAX_HOPS:
                expr = _argument_for(scope, caller_call, name)
                if expr is not None:
                    pending.extend((up, caller_tree, n, depth + 1) for n in _names(expr))
            continue
        for kind, expr in producers:
            if kind == "iter":
                expr = _unwrap_iter(expr)
                key = ast.unparse(expr)
                out.setdefault(key, _Producer("iter", fr, expr, key))
                continue
            if isinstance(expr, ast.Call):
                p = _classify_call(expr, fr)
                if p is not None:
                    out.setdefault(p.text, p)
                    continue
            if depth < MAX_HOPS:  # x, y = batch / x = batch["input_ids"].to(dev): follow its names
                pending.extend((fr, tr, n, depth + 1) for n in _names(expr))
    return list(out.values())


def _argument_for(scope, call: ast.Call, param: str):
    """The caller's expression passed for `param` of the function `scope` (by keyword or position;
    a method's `self` is not among the call's arguments)."""
    for k in call.keywords:
        if k.arg == param:
            return k.value
    names = [x.arg for x in (*scope.args.posonlyargs, *scope.args.args)]
    if param not in names:
        return None
    i = names.index(param)
    if names and names[0] in ("self", "cls") and isinstance(call.func, ast.Attribute):
        i -= 1
    return call.args[i] if 0 <= i < len(call.args) and not isinstance(call.args[i], ast.Starred) else None


def _unwrap_iter(expr):
    """`enumerate(loader)`, `tqdm(loader)`, `iter(loader)`: the loader."""
    while isinstance(expr, ast.Call) and expr.args:
        fn = expr.func
        name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else None
        if name not in _WRAPPERS:
            break
        expr = expr.args[0]
    return expr


def _classify_call(call: ast.Call, frame) -> _Producer | None:
    fn = call.func
    text = ast.unparse(call)
    if isinstance(fn, ast.Name) and fn.id == "next" and call.args:
        return _Producer("next", frame, call, text)
    if isinstance(fn, ast.Attribute) and fn.attr == "__next__":
        return _Producer("next", frame, call, text)
    if isinstance(fn, ast.Name):
        return _Producer("function", frame, call, text)
    if isinstance(fn, ast.Attribute):
        return _Producer("method", frame, call, text)
    return None


def discover() -> tuple[Found, list[_Producer]]:
    """The calls that produced the first training forward's inputs, followed back from its call
    site (called at that forward, with the hooks suspended); gpuprof.runners.loader_timing.install
    then times them."""
    found = Found()
    frame = _caller_frame(sys._getframe(1))
    if frame is None:
        found.notes.append("the model was not called from the user's code")
        return found, []
    try:
        tree = _tree(frame.f_code.co_filename)
        call = _call_at(tree, frame) if tree is not None else None
        if call is None:
            found.notes.append(f"no call found at {os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}")
            return found, []
        found.call_site = f"{os.path.basename(frame.f_code.co_filename)}:{call.lineno}"
        return found, find_producers(frame, call, tree, found)
    finally:
        del frame
