"""The training loop's own structure, read from its source: which lines are inside the
micro-step loop and which are the rest of the optimizer step's loop.

An attached run is sampled from outside, so a step boundary is seen only when a sample lands in
code that runs once per optimizer step. The optimizer's step itself takes ~1 ms on the host and
is often missed; the loop's own lines say more: py-spy gives each frame's line, and the script's
source (read from the file py-spy names, parsed with `ast`) says which of its lines run once per
step (the step loop's body outside the micro-step loop: clipping, the optimizer step, zero_grad,
logging, the next iteration's head) and which once per micro-step.

How the loops are found, from a stack that is in backward: the frames that hold the loop are
the callers of `Tensor.backward`/`torch.autograd.backward`, innermost first; the first whose
function (or module) has a `for`/`while` loop around its current line is the loop frame. Of the
loops around that line, the step loop is the innermost whose body calls `.step(` (an optimizer's
or a GradScaler's); a loop inside it around the backward line is the micro-step loop. No step
loop found (the step is in another function, the source is not readable): None, and steps come
from the optimizer's step as before. No micro-step loop: one backward per step by structure.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache

_LOOPS = (ast.For, ast.While, ast.AsyncFor)


@dataclass(frozen=True)
class LoopShape:
    """Where the loop frame is and which of its lines belong to what."""

    file: str
    function: str  # py-spy's name of the frame: `<module>`, `main`, `Trainer._inner_training_loop`
    step_loop: tuple[int, int]  # first and last line of the optimizer step's loop
    micro_loop: tuple[int, int] | None  # ... of the micro-step loop inside it, if any
    backward_line: int

    def region(self, line: int | None) -> str | None:
        """'micro' (inside the micro-step loop), 'step' (once per optimizer step), else None."""
        if line is None or not self.step_loop[0] <= line <= self.step_loop[1]:
            return None
        if self.micro_loop is not None and self.micro_loop[0] <= line <= self.micro_loop[1]:
            return "micro"
        if self.micro_loop is None:
            return None  # no once-per-step region to tell apart: steps come from elsewhere
        return "step"


@lru_cache(maxsize=32)
def _tree(file: str):
    try:
        with open(file, "rb") as f:
            return ast.parse(f.read(), filename=file)
    except (OSError, SyntaxError, ValueError):
        return None


def _calls_step(node) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "step"
               for n in ast.walk(node))


def _span(node) -> tuple[int, int]:
    return node.lineno, getattr(node, "end_lineno", node.lineno)


def _loops_around(tree, line: int) -> list:
    """Every loop whose lines include `line`, outermost first."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, _LOOPS):
            a, b = _span(node)
            if a <= line <= b:
                out.append(node)
    return sorted(out, key=lambda n: (n.lineno, -_span(n)[1]))


def shape_of(file: str, function: str, line: int) -> LoopShape | None:
    """The loops around `line` of `file` (the frame `function` is at it), or None."""
    tree = _tree(file)
    if tree is None:
        return None
    loops = _loops_around(tree, line)
    steps = [n for n in loops if _calls_step(n)]
    if not steps:
        return None
    step = steps[-1]  # the innermost loop that steps an optimizer
    inner = [n for n in loops if n is not step and step.lineno < n.lineno and _span(n)[1] <= _span(step)[1]
             and not _calls_step(n)]
    micro = inner[-1] if inner else None
    return LoopShape(file, function, _span(step), _span(micro) if micro is not None else None, line)


_BACKWARD = ("backward", "_engine_run_backward", "run_backward")


def find_shape(stacks) -> LoopShape | None:
    """The loop shape from the training thread's stacks (outermost frame first, frames (name,
    file, line)): from the first stacks in backward, the innermost caller of the backward whose
    source has a step loop around its line (module doc)."""
    seen = set()
    for stack in stacks:
        k = next((i for i, fr in enumerate(stack) if fr[0].rsplit(".", 1)[-1] in _BACKWARD
                  and ("torch/" in fr[1].replace("\\", "/"))), None)
        if not k:
            continue
        for fr in reversed(stack[:k]):
            name, file, line = fr[0], fr[1], fr[2]
            if not file or line is None or (file, name, line) in seen:
                continue
            seen.add((file, name, line))
            shape = shape_of(file, name, int(line))
            if shape is not None:
                return shape
        if len(seen) > 64:
            break
    return None


def region_of(stack, shape: LoopShape | None) -> str | None:
    """Where this sample's loop frame is: 'micro', 'step' (see LoopShape.region) or None."""
    if shape is None:
        return None
    for fr in stack:
        if fr[1] == shape.file and fr[0] == shape.function:
            return shape.region(fr[2])
    return None
