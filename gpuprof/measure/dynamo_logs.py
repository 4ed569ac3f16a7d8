"""Reading dynamo's log records (measure/dynamo.py): where a graph break, a recompilation or a
recompile-limit hit happened (the user's file:line, not torch's) and dynamo's reason, parsed from
the text of the graph_breaks and recompiles artifacts as torch 2.13 words them. Pure: no torch
import."""

from __future__ import annotations

import os
import re
import sys


_HEADER = re.compile(r"Graph break.*? in user code at (.+):(\d+)\s*$", re.MULTILINE)
_FRAME = re.compile(r'File "([^"]+)", line (\d+)(?:, in (\S+))?')
_RECOMPILE = re.compile(r"Recompiling function (\S+) in (.+):(\d+)\s*$", re.MULTILINE)
_GUARD = re.compile(r"^\s*-\s*(\d+/\d+):\s?(.*)$")
_RESUME = re.compile(r"^torch_dynamo_resume_in_(.+)_at_(\d+)$")
_LIMIT = re.compile(r"torch\._dynamo hit config\.(\w+) \(([^)]*)\)\s*\n\s*function: '([^']*)' \((.+):(\d+)\)"
                    r"(?:\s*\n\s*last reason: (.*))?")
_GB_PAGE = re.compile(r"/gb/(gb\d+)\.html")
_REASON_HEADS = ("Encountered graph break when attempting to trace", "Failed to handle graph break gracefully")


def torch_root() -> str:
    torch = sys.modules.get("torch")
    path = getattr(torch, "__file__", None)
    return os.path.dirname(os.path.realpath(path)) + os.sep if path else "\0"


def is_torch(file: str, torch_dir: str) -> bool:
    return file.startswith("<") or os.path.realpath(file).startswith(torch_dir)


def where(file: str | None, line: int | None) -> str | None:
    return f"{os.path.basename(file)}:{line}" if file and line is not None else None


# --------------------------------------------------------------------------- message readers
def parse_reason(text: str) -> dict:
    """dynamo's graph-break reason block: its one-line reason, explanation, hints and page code."""
    lines = text.strip().splitlines()
    # "Encountered graph break when attempting to trace CALL: ...:" heads most reasons; "Failed to
    # handle graph break gracefully. Skipping the function and falling back to eager. ..." the
    # ones that make dynamo give up on the whole function
    fallback = False
    while lines and lines[0].startswith(_REASON_HEADS):
        fallback = fallback or "falling back to eager" in lines[0]
        lines = lines[1:]
    body = [ln.strip() for ln in lines]
    reason = next((ln for ln in body if ln), "")
    explanation = next((ln[len("Explanation:"):].strip() for ln in body if ln.startswith("Explanation:")), None)
    hints = [ln[len("Hint:"):].strip() for ln in body if ln.startswith("Hint:")]
    page = _GB_PAGE.search(text)
    return {"reason": reason, "explanation": explanation, "hints": hints[:4], "gb": page.group(1) if page else None,
            "eager_fallback": fallback}


def parse_graph_break(message: str, exc_text: str | None = None, torch_dir: str | None = None) -> dict | None:
    """One graph-break log message -> {reason, explanation, hints, gb, file, line, dynamo_file,
    dynamo_line, user_code, duplicate}; None when it is not one."""
    torch_dir = torch_dir or torch_root()
    head = _HEADER.search(message)
    if "Graph Break Reason:" in message:
        block = message.split("Graph Break Reason:", 1)[1]
        block = re.split(r"\n\s*\n(?=Stack variable source attribution:|User code traceback:)|\nUser code traceback:",
                         block, maxsplit=1)[0]
        info = parse_reason(block)
    elif exc_text:  # a break that made dynamo skip the frame: the reason is the exception's
        info = parse_reason(exc_text)
    else:
        first = message.strip().splitlines()[0] if message.strip() else ""
        info = {"reason": first, "explanation": None, "hints": [], "gb": None, "eager_fallback": False}
    if "fall back to eager" in message or "falling back to eager" in message:
        info["eager_fallback"] = True
    stack = message
    for marker in ("User code traceback:", "The graph break occurred in the following user code:"):
        if marker in message:
            stack = message.split(marker, 1)[1]
            break
    else:
        stack = "" if head else message
    frames = [(f, int(n)) for f, n, _ in _FRAME.findall(stack)]
    dyn = (head.group(1), int(head.group(2))) if head else (frames[-1] if frames else (None, None))
    if dyn[0] is None and not frames:
        return None
    user = next(((f, n) for f, n in reversed(frames) if not is_torch(f, torch_dir)), None)
    file, line = user or dyn
    info.update({"file": file, "line": line, "dynamo_file": dyn[0], "dynamo_line": dyn[1],
                 "user_code": not is_torch(file, torch_dir) if file else False,
                 "duplicate": "user stack suppressed" in message, "has_stack": bool(frames)})
    return info


def _guard_text(text: str) -> str:
    """A failed guard without dynamo's compile-id prefix and the source comment after it."""
    text = re.sub(r"^\s*\d+/\d+:\s*", "", text.strip())
    return re.split(r"\s{2,}#\s", text, maxsplit=1)[0].strip()


def parse_recompile(message: str, torch_dir: str | None = None) -> dict | None:
    """One recompiles log message -> {function, code_file, code_line, file, line, reason, reasons,
    resume_of}; None when it is not one."""
    m = _RECOMPILE.search(message)
    if m is None:
        return None
    torch_dir = torch_dir or torch_root()
    function, code_file, code_line = m.group(1), m.group(2), int(m.group(3))
    reasons, stack = [], []
    for ln in message.splitlines()[1:]:
        g = _GUARD.match(ln)
        if g:
            # "1/0: ___stack0 == 1.39      # if y.sum().item() > 0:  # exp.py:25 in fn": the guard,
            # then the source line it came from
            reasons.append(_guard_text(g.group(2)))
        elif ln.strip().startswith("-") and "User stack trace" not in ln:
            rest = ln.strip()[1:].strip()
            f = _FRAME.search(rest)
            if f:
                stack.append((f.group(1), int(f.group(2))))
            elif rest and not rest.startswith(("guard ", "File")) and not stack:  # recompiles_verbose
                reasons.append(rest)
    if not is_torch(code_file, torch_dir):
        user = (code_file, code_line)
    else:  # torch's wrapper of a compiled module ("inner"): the user's innermost frame under it
        user = next(((f, n) for f, n in reversed(stack) if not is_torch(f, torch_dir)), None)
    resume = _RESUME.match(function)
    return {"function": function, "code_file": code_file, "code_line": code_line,
            "file": user[0] if user else code_file, "line": user[1] if user else code_line,
            "user_code": user is not None, "reason": reasons[0] if reasons else None,
            "reasons": reasons[:5],
            "resume_of": {"function": resume.group(1), "line": int(resume.group(2))} if resume else None}


def parse_limit(message: str) -> dict | None:
    """dynamo's "hit config.recompile_limit" warning -> {limit, value, function, file, line, reason}."""
    m = _LIMIT.search(message)
    if m is None:
        return None
    return {"limit": m.group(1), "value": m.group(2), "function": m.group(3), "file": m.group(4),
            "line": int(m.group(5)), "reason": _guard_text(m.group(6) or "") or None}


# ---------------------------------------------------------------------------------- handler
