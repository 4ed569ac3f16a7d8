"""nanoGPT configuration files: read them without running them, write corrected ones.

nanoGPT's configurator.py `exec`s a config file (plain `key = value` assignments) and then
applies `--key=value` flags, keeping each default's type. We never execute anything: a file is
parsed with `ast`, and only top-level assignments of literal values are read
(`ast.literal_eval`), plus arithmetic between numbers (`gradient_accumulation_steps = 5 * 8`,
as nanoGPT's own config/train_gpt2.py writes it). Imports, names, calls, conditionals — any
other statement — are refused with the line number. Docstrings and comments are fine.

Writing produces `key = value` lines (`repr` of each value) that nanoGPT's configurator, and
Python, read back to the same values; `flags` gives the equivalent command-line flags.
"""

from __future__ import annotations

import ast
import operator
import os
import shlex
from pathlib import Path

from gpuprof.errors import GpuprofError
from gpuprof.files import atomic_write, read_user_text

_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def read_config(path: str | os.PathLike) -> dict:
    """The literal `key = value` assignments of a nanoGPT config file, in file order."""
    return parse_config(read_user_text(path), str(path))


def parse_config(text: str, where: str = "config") -> dict:
    """Parse config text; see the module docstring for what is accepted."""
    try:
        tree = ast.parse(text, filename=where)
    except SyntaxError as exc:
        raise GpuprofError(f"{where}:{exc.lineno}: not valid Python ({exc.msg})") from None
    values: dict = {}
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            continue  # a docstring / bare string
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            values[node.targets[0].id] = _literal(node.value, where, node.lineno)
            continue
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            values[node.target.id] = _literal(node.value, where, node.lineno)
            continue
        raise GpuprofError(
            f"{where}:{node.lineno}: only `key = literal` assignments are read, found "
            f"{_describe(node)}; gpuprof never executes config files"
        )
    return values


def _literal(node: ast.AST, where: str, line: int):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    try:
        return _arith(node)
    except _NotLiteral:
        raise GpuprofError(
            f"{where}:{line}: value is not a literal ({ast.unparse(node)[:60]}); gpuprof reads "
            f"only literal values and never executes config files"
        ) from None


class _NotLiteral(Exception):
    pass


def _arith(node: ast.AST):
    """Numbers combined with + - * / // % ** (and unary minus): nothing else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _arith(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _arith(node.left), _arith(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 2**64):
            raise _NotLiteral()
        try:
            return _BINOPS[type(node.op)](left, right)
        except (ZeroDivisionError, OverflowError):
            raise _NotLiteral() from None
    raise _NotLiteral()


def _describe(node: ast.AST) -> str:
    names = {ast.Import: "an import", ast.ImportFrom: "an import", ast.If: "an if statement",
             ast.For: "a loop", ast.While: "a loop", ast.FunctionDef: "a function",
             ast.Expr: "an expression", ast.AugAssign: "an augmented assignment",
             ast.With: "a with statement", ast.ClassDef: "a class"}
    return names.get(type(node), f"a {type(node).__name__} statement")


def _value_text(value) -> str:
    if isinstance(value, (bool, int, str)) or value is None:
        return repr(value)
    if isinstance(value, float):
        return repr(value)
    raise TypeError(f"cannot write {type(value).__name__} values to a nanoGPT config")


def format_config(overrides: dict, header_comment: str = "") -> str:
    """`key = value` lines in nanoGPT's configurator format, with a `#` comment header."""
    lines = [f"# {line}".rstrip() for line in header_comment.splitlines()] if header_comment else []
    width = max((len(k) for k in overrides), default=0)
    for key, value in overrides.items():
        if not key.isidentifier():
            raise ValueError(f"not a config key: {key!r}")
        lines.append(f"{key.ljust(width)} = {_value_text(value)}")
    return "\n".join(lines) + "\n"


def write_config(path: str | os.PathLike, overrides: dict, header: str = "",
                 force: bool = False) -> Path:
    """Write a config file atomically. An existing file is never replaced unless force=True."""
    return atomic_write(path, format_config(overrides, header), overwrite=force)


def flags(overrides: dict) -> str:
    """The same settings as nanoGPT command-line flags: `--batch_size=32 --compile=False`.

    Strings are written bare when nanoGPT's configurator would read them back as the same
    string (it tries literal_eval first), quoted otherwise; shell quoting is added as needed."""
    parts = []
    for key, value in overrides.items():
        if isinstance(value, str):
            text = value
            try:
                ast.literal_eval(text)
                text = repr(value)  # bare text would parse as something else: quote it
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                pass
        else:
            text = _value_text(value)
        parts.append(shlex.quote(f"--{key}={text}"))
    return " ".join(parts)
