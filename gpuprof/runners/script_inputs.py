"""What a script reads from its command line and its environment, and the guard that keeps
gpuprof's own options out of it. Active only while the script runs: gpuprof.runners.script
installs it just before the script's code and removes it in the run's `finally`.

argparse. ArgumentParser.parse_known_args (parse_args goes through it) and
parse_known_intermixed_args (parse_intermixed_args goes through it, and it calls
parse_known_args twice) are wrapped on the class for the run. The outermost call of a parser
parsing the command line (args None, or a list equal to sys.argv[1:]):
- is checked first (the guard): an argument that names one of gpuprof's own options exactly
  (`--warmup`, `--steps=3`, `-o`; OwnOptions, derived from the verb's Typer parameters) and that
  the script's parser does not define exactly (its sub-parsers included) is gpuprof's option
  written after the script. argparse would take it by prefix into another option (`--warmup` as
  `--warmup-steps`, allow_abbrev) or, through parse_args, refuse it as unrecognized: the run is
  stopped before the script sees it (OptionAfterScript, a BaseException the script's own
  `except Exception:` cannot swallow; the runner turns it into ScriptOptionError, exit 2, once
  its state is restored). Through parse_known_args called by the script itself an unknown
  option goes back to the script's code, which may hand it to another parser: not stopped.
- is recorded after it returns: for every option action (help and version skipped) its
  option strings, dest, parsed value, default (JSON scalars; anything else its repr, cut to 80
  characters), type name, and whether the command line gave it. A parser given an explicit list
  (not the command line) is recorded too, with "source": "explicit" and "given": false (the
  values did not come from the command line); a sub-parser's parse inherits its parent's
  source. One entry per (option strings, dest): a later parse replaces an earlier one, except
  that an explicit parse never replaces one from the command line.
The script gets exactly the Namespace and the list argparse returned; nothing is set on it.

Environment. os._Environ.__getitem__ is wrapped for the run: os.environ[...], .get(), `in`,
.setdefault(), .pop() and os.getenv() all reach it (through os.py and collections.abc, which
are stepped over). A read counts when the frame that asked is user code
(gpuprof.measure.stacks.is_user_file: not the standard library, site-packages or gpuprof) and it
asked for that name: a subscript or one of those methods, not a copy (dict(os.environ),
{**os.environ}, .copy()). The names are kept, and the value of those that say how the step
computes (VALUE_NAMES); None for the others and for a name that is not set.

Any failure while recording is swallowed (counted in "errors"): it never reaches the script.
"""

from __future__ import annotations

import argparse
import dis
import functools
import math
import os
import re
import sys
import threading
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field

from gpuprof.errors import GpuprofError
from gpuprof.measure.stacks import is_user_file

# Environment variables whose value is kept: those that choose precision, compilation, batch sizes.
VALUE_NAMES = re.compile(r"DTYPE|PRECISION|AMP|BF16|FP16|FP8|COMPILE|BATCH|ACCUM", re.I)
MAX_ACTIONS = 400  # option entries kept (a parser of thousands of options is cut, "truncated")
MAX_ENV = 400
REPR_CHARS = 80


class OptionAfterScript(BaseException):
    """Raised inside the script's own argparse call: gpuprof's option after the script. A
    BaseException (as gpuprof.measure.step_rules.StopScript) so the script cannot swallow it."""


class ScriptOptionError(GpuprofError):
    """gpuprof's option went after the script (the runner raises it after the run): exit 2."""


@dataclass(frozen=True)
class OwnOptions:
    """gpuprof's own options of one verb: option string -> whether it takes a value."""

    verb: str  # "gpuprof diagnose"
    options: dict = field(default_factory=dict)

    def named(self, token: str) -> str | None:
        """The gpuprof option `token` names exactly (`--warmup`, `--warmup=3`), else None."""
        if not isinstance(token, str) or not token.startswith("-"):
            return None
        name = token.split("=", 1)[0]
        return name if name in self.options else None

    def written(self, args: list[str], i: int) -> str:
        """The option at args[i] as the user would write it before the script (with its value)."""
        token = args[i]
        if "=" not in token and self.options.get(token) and i + 1 < len(args):
            return f"{token} {args[i + 1]}"
        return token

    def hint(self, args: list[str], message: str | None) -> str | None:
        """For a script that failed before its first step on an argument of gpuprof's (nanoGPT's
        configurator raises `Unknown config key: steps`): that argument, when the error names it
        (`steps`, `--steps`; a script that failed on something else is not blamed on it)."""
        text = str(message or "")
        for token in args:
            if token == "--":
                break
            name = self.named(token)
            key = name.lstrip("-") if name else ""
            if len(key) > 1 and (key in text or key.replace("-", "_") in text):
                return f"{token} after the script went to the script: gpuprof's options come before the script"
        return None

    def to_dict(self) -> dict:
        return {"verb": self.verb, "options": dict(self.options)}

    @classmethod
    def from_dict(cls, d: dict | None) -> "OwnOptions | None":
        return cls(d["verb"], dict(d["options"])) if d else None


def _safe(value):
    """A JSON scalar as it is; anything else its repr, cut to REPR_CHARS."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    text = repr(value)
    return text if len(text) <= REPR_CHARS else text[:REPR_CHARS - 1] + "…"


def _type_name(action) -> str | None:
    if action.type is not None:
        return getattr(action.type, "__name__", None) or type(action.type).__name__
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)):
        return "bool"
    if isinstance(action, argparse._CountAction):
        return "int"
    if isinstance(action, (argparse._StoreAction, argparse._AppendAction)):
        return "str"
    return None


def _parsers(parser, seen=None):
    """The parser and its sub-parsers, recursively."""
    seen = set() if seen is None else seen
    if id(parser) in seen:
        return []
    seen.add(id(parser))
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _parsers(sub, seen)
    return found


def _abbreviated(parser, name: str) -> list[str]:
    """The option strings argparse's prefix matching (allow_abbrev) would read `name` as."""
    hits = {}
    for p in _parsers(parser):
        if not getattr(p, "allow_abbrev", True):
            continue
        for opt, action in p._option_string_actions.items():
            long_form = len(opt) > 2 or opt[1:2] in p.prefix_chars
            if long_form and opt != name and opt.startswith(name):
                hits.setdefault(id(action), opt)
    return sorted(hits.values())


def _given(parser, tokens: list[str]) -> set[int]:
    """ids of the parser's actions the tokens name (exactly, `--x=v`, `-n4`, or by a unique prefix)."""
    opts = parser._option_string_actions
    given = set()
    for tok in tokens:
        if tok == "--":
            break
        if not isinstance(tok, str) or len(tok) < 2 or tok[0] not in parser.prefix_chars:
            continue
        name = tok.split("=", 1)[0]
        action = opts.get(tok) or opts.get(name)
        if action is None and tok[1] not in parser.prefix_chars:
            action = opts.get(tok[:2])  # a short option with its value attached
        if action is None and parser.allow_abbrev:
            hits = {id(a): a for o, a in opts.items() if o.startswith(name)}
            action = next(iter(hits.values())) if len(hits) == 1 else None
        if action is not None:
            given.add(id(action))
    return given


# The functions os.environ's reads go through on their way to __getitem__ (stepped over). By code
# object: os and collections.abc are frozen modules, their frames' file is "<frozen os>".
_THROUGH = frozenset(f.__code__ for f in (os.getenv, os._Environ.setdefault, Mapping.get, Mapping.__contains__,
                                          MutableMapping.pop))
# A subscript's instruction (3.14 makes it a BINARY_OP)
_SUBSCRIPT = frozenset({"BINARY_SUBSCR"} if "BINARY_SUBSCR" in dis.opmap else {"BINARY_OP"})


def _asked_by_name(frame) -> bool:
    """The frame is executing a subscript (os.environ["X"]), not a copy of the whole mapping."""
    code = frame.f_code.co_code
    return 0 <= frame.f_lasti < len(code) and dis.opname[code[frame.f_lasti]] in _SUBSCRIPT


def _is_compiling():
    """torch.compiler.is_compiling (torch's dynamo folds it to True while it traces): a script's
    compiled function that reads os.environ must compile as it would without gpuprof, and the
    recorder's frame walk (sys._getframe) is a graph break. A read traced there is not recorded."""
    try:
        import torch.compiler

        return torch.compiler.is_compiling
    except (ImportError, AttributeError):
        return lambda: False


class ScriptInputs:
    """The recorder and the guard for one run (see the module doc). install() before the
    script's code, remove() in the run's `finally` (idempotent); to_dict() for the profile."""

    def __init__(self, own: OwnOptions | None, shown: str):
        self.own = own
        self.shown = shown  # the script as the user wrote it: `train.py` or `-m scripts.base_train`
        self.actions: dict[tuple, dict] = {}
        self.env: dict[str, str | None] = {}
        self.errors = 0
        self.truncated = False
        self._saved: list[tuple[type, str, object]] = []
        self._local = threading.local()
        self._user_files: dict[str, bool] = {}  # co_filename -> is_user_file (it resolves the path)

    # -- install / remove ----------------------------------------------------------------

    def install(self) -> None:
        ap = argparse.ArgumentParser
        strict = {ap.parse_args.__code__, ap.parse_intermixed_args.__code__}
        self._patch(ap, "parse_known_args", lambda orig: self._wrap_parse(orig, strict))
        self._patch(ap, "parse_known_intermixed_args", lambda orig: self._wrap_parse(orig, strict))
        self._patch(os._Environ, "__getitem__", self._wrap_getitem)

    def _patch(self, cls: type, name: str, make) -> None:
        orig = cls.__dict__[name]
        self._saved.append((cls, name, orig))
        setattr(cls, name, make(orig))

    def remove(self) -> None:
        while self._saved:
            cls, name, orig = self._saved.pop()
            setattr(cls, name, orig)

    def __enter__(self) -> "ScriptInputs":
        self.install()
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    # -- argparse -------------------------------------------------------------------------

    def _wrap_parse(self, orig, strict_callers):
        rec = self

        @functools.wraps(orig)
        def parse(parser, args=None, namespace=None):
            stack = rec._stack()
            if any(p is parser for p, _ in stack):  # argparse's own inner call (intermixed's two passes)
                return orig(parser, args, namespace)
            if args is not None and not isinstance(args, (list, tuple)):
                args = rec._listed(args)  # an iterator, read once: argparse lists it the same way
            # A sub-parser is parsed by its parent's call: it takes that call's source.
            from_argv = stack[0][1] if stack else (args is None or rec._is_argv(args))
            tokens = list(sys.argv[1:]) if args is None else list(args) if isinstance(args, (list, tuple)) else []
            if not stack and from_argv and rec.own is not None:
                rec._guard(parser, tokens, sys._getframe(1).f_code in strict_callers)
            stack.append((parser, from_argv))
            try:
                result = orig(parser, args, namespace)
            finally:
                stack.pop()
            rec._record(parser, result, tokens, from_argv)
            return result

        return parse

    def _stack(self) -> list:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    @staticmethod
    def _is_argv(args) -> bool:
        try:
            return isinstance(args, (list, tuple)) and list(args) == sys.argv[1:]
        except Exception:  # noqa: BLE001 - an odd sys.argv: not the command line
            return False

    @staticmethod
    def _listed(args):
        try:
            return list(args)
        except Exception:  # noqa: BLE001 - argparse's own list(args) raises it again, as without gpuprof
            return args

    def _guard(self, parser, tokens: list[str], strict: bool) -> None:
        try:
            problem = self._leak(parser, tokens, strict)
        except Exception:  # noqa: BLE001 - a parser we cannot read: no guard, never a broken script
            self.errors += 1
            return
        if problem is not None:
            raise OptionAfterScript(problem)

    def _leak(self, parser, tokens: list[str], strict: bool) -> str | None:
        defined = set()
        for p in _parsers(parser):
            defined.update(p._option_string_actions)
        for i, tok in enumerate(tokens):
            if tok == "--":
                break
            name = self.own.named(tok)
            if name is None or name in defined:  # not gpuprof's, or the script's own option of that name
                continue
            targets = _abbreviated(parser, name)
            if len(targets) == 1:
                how = f"its argparse would read it as {targets[0]}"
            elif targets:
                how = f"its argparse would find it ambiguous: {', '.join(targets)}"
            elif strict:
                how = "its argparse would refuse it as unrecognized"
            else:
                continue  # parse_known_args: the script's own code gets it back (see the module doc)
            return (f"{name} after the script is gpuprof's option, and the script has no {name} ({how}): "
                    f"put gpuprof's options before the script: {self.own.verb} {self.own.written(tokens, i)} "
                    f"{self.shown} ...")
        return None

    def _record(self, parser, result, tokens: list[str], from_argv: bool) -> None:
        try:
            namespace = result[0]
            given = _given(parser, tokens) if from_argv else set()
            for action in parser._actions:
                if (not action.option_strings or action.dest == argparse.SUPPRESS
                        or isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
                    continue
                key = (tuple(action.option_strings), action.dest)
                old = self.actions.get(key)
                if old is not None and old["source"] == "argv" and not from_argv:
                    continue
                if old is None and len(self.actions) >= MAX_ACTIONS:
                    self.truncated = True
                    continue
                default = None if action.default == argparse.SUPPRESS else action.default
                entry = {"flags": list(action.option_strings), "dest": action.dest,
                         "value": _safe(getattr(namespace, action.dest, default)), "default": _safe(default),
                         "given": id(action) in given, "type": _type_name(action),
                         "source": "argv" if from_argv else "explicit"}
                if action.choices is not None:
                    entry["choices"] = [_safe(c) for c in list(action.choices)[:20]]
                self.actions[key] = entry
        except Exception:  # noqa: BLE001 - a recording, never the script's run
            self.errors += 1

    # -- environment ----------------------------------------------------------------------

    def _wrap_getitem(self, orig):
        rec = self
        compiling = _is_compiling()

        @functools.wraps(orig)
        def __getitem__(environ, key):
            if compiling():  # torch.compile tracing the read: it sees the read alone (see _is_compiling)
                return orig(environ, key)
            try:
                value = orig(environ, key)
            except KeyError:
                rec._env_read(key, None)
                raise
            rec._env_read(key, value)
            return value

        return __getitem__

    def _env_read(self, key, value) -> None:
        try:
            if not isinstance(key, str) or (key in self.env and (self.env[key] is not None
                                                                   or not VALUE_NAMES.search(key))):
                return  # already known
            frame = sys._getframe(2)  # 0: here, 1: the wrapper, 2: who asked
            direct = True
            while frame is not None and frame.f_code in _THROUGH:
                frame, direct = frame.f_back, False
            if frame is None or (direct and not _asked_by_name(frame)):
                return
            name = frame.f_code.co_filename
            user = self._user_files.get(name)
            if user is None:
                user = self._user_files[name] = is_user_file(name)
            if not user:
                return
            if key not in self.env and len(self.env) >= MAX_ENV:
                self.truncated = True
                return
            self.env[key] = value if (value is not None and VALUE_NAMES.search(key)) else None
        except Exception:  # noqa: BLE001 - a recording, never the script's run
            self.errors += 1

    # -- the profile ----------------------------------------------------------------------

    def to_dict(self) -> dict:
        out = {"argparse": [dict(e) for e in self.actions.values()], "env": dict(self.env)}
        if self.truncated:
            out["truncated"] = True
        if self.errors:
            out["errors"] = self.errors
        return out
