"""`gpuprof diagnose -m MODULE ARGS...`: a module found and run as `python -m MODULE ARGS` runs it.

python -m (Modules/main.c, then runpy._run_module_as_main) puts the current working directory,
as an absolute path, first on sys.path; imports the module's parent packages (their __init__
code runs); finds the module's spec (a package runs its `__main__` submodule); and executes its
code as `__main__` with __spec__, __file__, __cached__, __loader__ and __package__ (the parent
package, so that relative imports work) set from that spec, and sys.argv[0] = the module's file.

Two steps here, as the path mode has its check before the run and its run:
- find_module(): before anything runs, the module's source file, found without executing any
  code (the parents are looked up by the import system's finders, not imported), so that a name
  that is not there is one line and exit 2, and the outputs can be checked against the file.
- module_code(): at run time, inside the run (under the hooks, with sys.argv and sys.path set),
  as runpy's _get_module_details does it: the parents imported, the spec found, its code read.
  An error there (a parent's __init__ that raises) is the script's own failure.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from contextlib import contextmanager

from gpuprof.errors import GpuprofError


def shown(name: str) -> str:
    """How a module run is written in gpuprof's lines and in the profile's command: `-m NAME`."""
    return f"-m {name}"


@contextmanager
def cwd_first():
    """sys.path[0] = the current working directory (absolute), as python -m sets it, for a lookup."""
    saved = list(sys.path)
    sys.path[0:1] = [os.getcwd()]
    try:
        yield
    finally:
        sys.path[:] = saved


def find_module(name: str) -> str:
    """The source file `python -m NAME` would run from here, or a one-line GpuprofError (exit 2).
    Nothing of the module or its packages runs: the parents are looked up, not imported (one that
    is already imported is taken as it is, as the import system would)."""
    what = shown(name)
    if name.endswith(".py") or "/" in name or os.sep in name:
        dotted = name[:-3] if name.endswith(".py") else name
        dotted = dotted.strip("./").replace(os.sep, ".").replace("/", ".")
        raise GpuprofError(f"{what}: -m takes a module name (-m {dotted}), not a path: give the path "
                           f"without -m, or the module with -m")
    if not name or name.startswith("."):
        raise GpuprofError(f"{what}: relative module names are not supported (python -m's rule)")
    with cwd_first():
        spec = _lookup(name, what)
        if spec.submodule_search_locations is not None:  # a package runs its __main__ submodule
            try:
                spec = _lookup(f"{name}.__main__", what)
            except GpuprofError:
                raise GpuprofError(f"{what}: '{name}' is a package without a __main__ module, so it cannot be "
                                   f"run (python -m runs {name}.__main__)") from None
    if spec.loader is None or not spec.has_location or not spec.origin:
        raise GpuprofError(f"{what}: not a module with a source file (a namespace package, a built-in module)")
    return os.path.abspath(spec.origin)


def _lookup(name: str, what: str):
    """The spec of `name`, each parent package found by the finders (sys.meta_path) in its
    parent's __path__, without importing anything."""
    parts = name.split(".")
    path = None
    spec = None
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        imported = sys.modules.get(sub)
        if imported is not None and getattr(imported, "__spec__", None) is not None:
            spec = imported.__spec__
            locations = getattr(imported, "__path__", None)
        else:
            spec = _meta_find(sub, path)
            locations = spec.submodule_search_locations if spec is not None else None
        if spec is None:
            where = (" (python -m looks in the current folder: run from the folder that holds it)"
                     if i == 1 else "")
            raise GpuprofError(f"{what}: no module named '{sub}'{where}")
        if i < len(parts):
            if locations is None:
                raise GpuprofError(f"{what}: '{sub}' is a module, not a package: it has no '{parts[i]}'")
            path = list(locations)
    return spec


def _meta_find(name: str, path):
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name, path)
        except (ImportError, AttributeError, TypeError, ValueError):
            continue
        if spec is not None:
            return spec
    return None


def module_code(name: str):
    """(spec, code) of `python -m NAME` at run time, as runpy._get_module_details finds them: the
    parent packages imported first (their errors are the run's own), then the spec; a package's
    __main__. ImportError when it is not there (it was a moment ago, in find_module)."""
    parent = name.rpartition(".")[0]
    if parent:
        try:
            importlib.import_module(parent)
        except ImportError as exc:  # a missing parent is said by find_spec below; any other error is raised
            if exc.name is None or (exc.name != parent and not parent.startswith(exc.name + ".")):
                raise
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ImportError(f"No module named {name}", name=name)
    if spec.submodule_search_locations is not None:
        if name == "__main__" or name.endswith(".__main__"):
            raise ImportError("Cannot use package as __main__ module")
        return module_code(f"{name}.__main__")
    if spec.loader is None:
        raise ImportError(f"{name!r} is a namespace package and cannot be executed")
    code = spec.loader.get_code(spec.name)
    if code is None:
        raise ImportError(f"No code object available for {name}")
    return spec, code


def main_globals(spec) -> dict:
    """The globals runpy._run_code gives a module run as __main__ (besides __name__)."""
    return {"__file__": spec.origin if spec.has_location else None, "__cached__": spec.cached,
            "__doc__": None, "__loader__": spec.loader, "__package__": spec.parent, "__spec__": spec}
