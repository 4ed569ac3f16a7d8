"""The lines nanoGPT's train.py prints, parsed: `iter N: loss L, time T ms, mfu M%` and
`step N: train loss A, val loss B`. Plain data, shared by the script runner (which tees a
script's output) and the log analysis."""

from __future__ import annotations

import re
from dataclasses import dataclass

# iter 10: loss 4.2345, time 21000.12ms, mfu 104.33%
ITER_RE = re.compile(
    r"iter\s+(?P<iter>\d+):\s*loss\s+(?P<loss>[-+0-9.eEnaif]+),\s*time\s+(?P<ms>[0-9.eE+-]+)\s*ms"
    r"(?:,\s*mfu\s+(?P<mfu>[-+0-9.eE]+)%)?"
)
# step 0: train loss 10.9876, val loss 10.9912
EVAL_RE = re.compile(
    r"step\s+(?P<step>\d+):\s*train loss\s+(?P<train>[-+0-9.eEnaif]+),\s*val loss\s+(?P<val>[-+0-9.eEnaif]+)"
)


@dataclass
class IterLine:
    iter: int
    loss: float
    time_ms: float
    mfu_pct: float | None  # None when not printed; nanoGPT prints -100.00 before iter 5


@dataclass
class EvalLine:
    step: int
    train_loss: float
    val_loss: float


def parse_line(line: str) -> IterLine | EvalLine | None:
    """One log line -> IterLine / EvalLine, or None if it is neither."""
    m = ITER_RE.search(line)
    if m:
        mfu = m.group("mfu")
        return IterLine(int(m.group("iter")), float(m.group("loss")), float(m.group("ms")),
                        float(mfu) if mfu is not None else None)
    m = EVAL_RE.search(line)
    if m:
        return EvalLine(int(m.group("step")), float(m.group("train")), float(m.group("val")))
    return None


def parse_lines(lines) -> tuple[list[IterLine], list[EvalLine]]:
    iters, evals = [], []
    for line in lines:
        rec = parse_line(line)
        if isinstance(rec, IterLine):
            iters.append(rec)
        elif isinstance(rec, EvalLine):
            evals.append(rec)
    return iters, evals
