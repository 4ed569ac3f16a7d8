"""Sampled stacks -> the phases `diagnose` uses, and steps found from the optimizer's steps.

A stack (outermost frame first) is classified by what it contains, first match wins:
- eval: a user function named like an evaluation (nanoGPT's `estimate_loss`, `evaluate`, `eval*`);
- backward: autograd's backward (`Tensor.backward`, `torch.autograd.backward`, the engine);
- optimizer: a frame inside torch/optim (`Optimizer.step`, `zero_grad`, AdamW's kernels' callers);
- data: a DataLoader's `__next__` (torch/utils/data), or a function named like data loading
  (`get_batch`, `next_batch`, `__getitem__`, `load_*`: gpuprof.measure.data_hooks.data_like_name),
  or numpy's memmap;
- forward: an nn.Module call (torch/nn/modules/module.py `_call_impl`) not under the above;
- other: anything else (logging, checkpoint writes, the loop's own Python).
Host-to-device copies are C calls (`Tensor.to`), invisible in Python stacks: they count where
they are called from (usually data), and `h2d` is "not measured" in an attached run.

Steps: the optimizer's step ends a training step (as in `diagnose`), so a step is the time from
one optimizer phase's end to the next one's end. An optimizer phase shorter than the sampling
period can go unseen: the gap then holds k steps with k times the micro-steps (backward runs) of
the most common gap, and is split into k equal steps (the count is right; the spread inside
such a gap is not measured, and the section says how many gaps were split).
"""

from __future__ import annotations

import math
import re

from gpuprof.measure.data_hooks import data_like_name

PHASES = ("data", "forward", "backward", "optimizer", "eval", "other")
STEP = "optimizer.step"  # an `optimizer` stack inside Optimizer.step: what ends a training step
_EVAL = re.compile(r"^(estimate_loss|evaluate|eval\w*|validat\w*|\w*_eval|\w*validation\w*)$", re.I)


def _in(file: str, *parts: str) -> bool:
    f = file.replace("\\", "/")
    return any(p in f for p in parts)


def _short(name: str) -> str:
    """py-spy names methods `Class.method`: the method."""
    return name.rsplit(".", 1)[-1]


def _user(file: str) -> bool:
    return not _in(file, "/site-packages/", "/dist-packages/", "/lib/python3", "<frozen") and bool(file)


def classify(stack) -> str:
    """The phase of one stack (outermost frame first)."""
    names = [(_short(n), f) for n, f in stack]
    if any(_user(f) and _EVAL.match(n) for n, f in names):
        return "eval"
    if any(n in ("backward", "_engine_run_backward", "run_backward") and _in(f, "torch/autograd/", "torch/_tensor.py")
           for n, f in names):
        return "backward"
    if any(_in(f, "torch/optim/") and n != "<module>" for n, f in names):
        # the optimizer's step ends a training step; zero_grad and the like do not
        return STEP if any(n == "step" for n, _ in names) else "optimizer"
    if any(_in(f, "torch/utils/data/") and n in ("__next__", "_next_data", "_get_data", "fetch") for n, f in names):
        return "data"
    if any((_user(f) and data_like_name(n)) or (_in(f, "numpy/") and "memmap" in f) for n, f in names):
        return "data"
    if any(_in(f, "torch/nn/modules/module.py") and n in ("_call_impl", "_wrapped_call_impl") for n, f in names):
        return "forward"
    return "other"


def main_thread(timelines: dict) -> object | None:
    """The training thread: the one with the most time in backward or the optimizer (the
    thread a DataLoader's pin-memory thread or a logger is not), else the busiest."""
    def score(tl):
        work = sum(t1 - t0 for t0, t1, s in tl.spans if classify(s) in ("backward", "optimizer", STEP, "forward"))
        return (work, tl.seconds)
    return max(timelines.values(), key=score, default=None)


def phase_spans(timeline) -> list[tuple[float, float, str]]:
    """(t0, t1, phase) with adjacent spans of one phase joined (`optimizer.step` marks the
    optimizer's step within the optimizer phase: see STEP)."""
    out: list[list] = []
    for t0, t1, stack in timeline.spans:
        ph = classify(stack)
        if out and out[-1][2] == ph and abs(out[-1][1] - t0) < 1e-9:
            out[-1][1] = t1
        else:
            out.append([t0, t1, ph])
    return [(a, b, p) for a, b, p in out]


def shares(spans: list[tuple[float, float, str]], rate_hz: float) -> dict:
    """Each phase's share of the sampled time, with how sure it is: the samples behind it
    (seconds × rate) and a 95% interval from that count (binomial: ±1.96·√(p(1−p)/n))."""
    total = sum(b - a for a, b, _ in spans)
    n = max(1, round(total * rate_hz))
    out = {}
    for ph in PHASES:
        sec = sum(b - a for a, b, p in spans if _phase(p) == ph)
        p = sec / total if total else 0.0
        out[ph] = {"seconds": sec, "share": p, "samples": round(sec * rate_hz),
                   "pm95": 1.96 * math.sqrt(p * (1 - p) / n) if total else None}
    return out


def find_steps(spans: list[tuple[float, float, str]], blip_s: float = 0.0,
               grad_accum: int | None = None) -> tuple[list[dict], dict]:
    """Steps between the ends of consecutive optimizer phases: [{start_s, wall_s, phases,
    micro_steps, split_from}], and how they were found. grad_accum: the backward runs per optimizer
    step when the user knows them (else inferred from the gaps, see _unit). The partial step before the first
    optimizer end and after the last are left out. A micro-step is a backward run after forward
    or data time (or after more than `blip_s` of anything else): one odd sample inside a backward
    (a torn stack, a hook) does not make two."""
    ends = [b for (a, b, p), nxt in zip(spans, spans[1:] + [None]) if p == STEP
            and (nxt is None or nxt[2] != STEP)]
    steps = []
    for s0, s1 in zip(ends, ends[1:]):
        phases: dict[str, float] = {}
        order: list[list] = []  # [phase, start from the step's start, seconds], as sampled
        micro, between, other = 0, True, 0.0
        for a, b, p in spans:
            lo, hi = max(a, s0), min(b, s1)
            if hi <= lo:
                continue
            p = _phase(p)
            phases[p] = phases.get(p, 0.0) + (hi - lo)
            if order and order[-1][0] == p:
                order[-1][2] += hi - lo
            else:
                order.append([p, lo - s0, hi - lo])
            if p == "backward":
                if between or other > blip_s:
                    micro += 1
                between, other = False, 0.0
            elif p in ("forward", "data"):
                between = True
            else:
                other += hi - lo
        unsampled = (s1 - s0) - sum(phases.values())
        if unsampled > 0:  # no stack read there (a late or failed sample): not a phase of its own
            phases["other"] = phases.get("other", 0.0) + unsampled
            order.append(["other", s1 - s0 - unsampled, unsampled])
        steps.append({"start_s": s0, "wall_s": s1 - s0, "phases": phases, "micro_steps": micro,
                      "spans": [[p, round(st, 7), round(d, 7)] for p, st, d in order]})
    counts = [s["micro_steps"] for s in steps if s["micro_steps"]]
    unit = grad_accum or _unit(counts)
    out = []
    for s in steps:
        k = max(1, round(s["micro_steps"] / unit)) if unit and s["micro_steps"] else 1
        if k == 1:
            out.append({**s, "split_from": 1})
            continue
        # k optimizer steps in one gap: the optimizer phases between were not sampled. Split the
        # gap into k equal steps (each with its share of every phase): the step count is right,
        # the spread within the gap is not measured.
        part = s["wall_s"] / k
        for j in range(k):
            out.append({"start_s": s["start_s"] + j * part, "wall_s": part,
                        "phases": {p: v / k for p, v in s["phases"].items()},
                        "micro_steps": s["micro_steps"] / k, "split_from": k, "spans": None})
    single = sum(1 for c in counts if c == unit)
    info = {"optimizer_ends": len(ends), "gaps": len(steps), "steps": len(out), "typical_micro_steps": unit,
            "unit_source": ("given (--grad-accum)" if grad_accum else
                            f"inferred: {single} of {len(counts)} gaps between sampled optimizer steps held {unit}"),
            "gaps_split": sum(1 for s in steps if unit and s["micro_steps"] and round(s["micro_steps"] / unit) >= 2)}
    return out, info


def _phase(label: str) -> str:
    return "optimizer" if label == STEP else label


def _unit(counts: list[int]) -> int:
    """Backward runs per optimizer step: the smallest count between consecutive sampled optimizer
    steps of which at least 80% of the counts are whole multiples (a gap that hid k-1 optimizer
    steps holds k times as many), else the most common count."""
    if not counts:
        return 0
    for c in sorted(set(counts)):
        seen = counts.count(c)
        if seen < 2 and seen < 0.2 * len(counts):
            continue  # one odd gap (a backward run not sampled) is not the unit
        if sum(n % c == 0 for n in counts) >= 0.8 * len(counts):
            return c
    freq: dict[int, int] = {}
    for c in counts:
        freq[c] = freq.get(c, 0) + 1
    best = max(freq.values())
    return min(c for c, n in freq.items() if n == best)
