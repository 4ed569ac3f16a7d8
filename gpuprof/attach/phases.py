"""Sampled stacks -> the phases `diagnose` uses, and steps found from the optimizer's steps.

A stack (outermost frame first) is classified by what it contains, first match wins:
- eval: a user function named like an evaluation (nanoGPT's `estimate_loss`, `evaluate`, `eval*`);
- backward: autograd's backward (`Tensor.backward`, `torch.autograd.backward`, the engine);
- optimizer: a frame inside torch/optim (`Optimizer.step`, `zero_grad`, AdamW's kernels' callers);
- data: a DataLoader's `__next__` (torch/utils/data), or a function named like data loading
  (`get_batch`, `next_batch`, `__getitem__`, `load_*`: gpuprof.measure.data_names.data_like_name),
  or numpy's memmap;
- forward: an nn.Module call (torch/nn/modules/module.py `_call_impl`) not under the above;
- other: anything else (logging, checkpoint writes, the loop's own Python).
Host-to-device copies are C calls (`Tensor.to`), invisible in Python stacks: they count where
they are called from (usually data), and `h2d` is "not measured" in an attached run.

Steps: a step ends where the loop leaves its once-per-step code (gpuprof.attach.loops: the step
loop's lines outside the micro-step loop, read from the script's source: clipping, the optimizer
step, zero_grad, logging, the next iteration's head), or, where the source cannot say, at the
end of the optimizer's step (as in `diagnose`). Micro-steps: the micro-step loop's line sequence
going back to its top (a new iteration of it), or, without the source, backward runs after
forward or data time. Code that short can go unsampled: a gap between two seen boundaries then
holds k steps with k times the micro-steps of the most common gap (one, by structure, when the
step loop has no micro-step loop), and is split into k equal steps (the count is right; the
spread inside such a gap is not measured, and the section says how many gaps were split).
"""

from __future__ import annotations

import math
import re

from gpuprof.measure.data_names import data_like_name

PHASES = ("data", "forward", "backward", "optimizer", "eval", "other")
UNIT_SURE = math.log(20)  # a unit 20× likelier than the next is stated without a caveat
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
    names = [(_short(fr[0]), fr[1]) for fr in stack]
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


def shares(spans: list[tuple[float, float, str]], rate_hz: float, systematic: float = 0.0) -> dict:
    """Each phase's share of the sampled time, with how sure it is: the samples behind it
    (seconds × rate), a 95% interval from that count (binomial: ±1.96·√(p(1−p)/n)), the
    `systematic` part (the share of samples that came late enough to fall in another phase,
    gpuprof.attach.quality) and `interval`, their sum."""
    total = sum(b - a for a, b, _ in spans)
    n = max(1, round(total * rate_hz))
    out = {}
    for ph in PHASES:
        sec = sum(b - a for a, b, p in spans if _phase(p) == ph)
        p = sec / total if total else 0.0
        pm = 1.96 * math.sqrt(p * (1 - p) / n) if total else None
        out[ph] = {"seconds": sec, "share": p, "samples": round(sec * rate_hz), "pm95": pm,
                   "systematic": systematic, "interval": (pm + systematic) if pm is not None else None}
    return out


def loop_marks(timeline, shape) -> tuple[list[float], list[float]]:
    """From each sample's loop frame (gpuprof.attach.loops): the ends of the runs of samples in the
    once-per-step code (step boundaries), and the times the micro-step loop went back to its top
    (a line lower than the sample before, both inside it: a new micro-step began)."""
    from gpuprof.attach.loops import region_of

    ends, wraps = [], []
    run_end, prev = None, None
    for t0, t1, stack in timeline.spans:
        region = region_of(stack, shape)
        line = next((fr[2] for fr in stack if fr[1] == shape.file and fr[0] == shape.function), None)
        if region == "step":
            run_end = t1
        elif region == "micro":
            if run_end is not None:
                ends.append(run_end)
                run_end = None
            if prev is not None and prev[0] == "micro" and line is not None and prev[1] is not None and line < prev[1]:
                wraps.append(t0)
        if region is not None:
            prev = (region, line)
    if run_end is not None:
        ends.append(run_end)
    return ends, wraps


def find_steps(spans: list[tuple[float, float, str]], blip_s: float = 0.0,
               grad_accum: int | None = None, marks: tuple[list[float], list[float]] | None = None,
               structural_unit: int | None = None) -> tuple[list[dict], dict]:
    """Steps between consecutive boundaries: [{start_s, wall_s, phases, micro_steps, split_from}],
    and how they were found. Boundaries: `marks` (loop_marks: the ends of the once-per-step code,
    and the micro-step loop's returns to its top) when the loop's source was read, else the ends
    of the optimizer's steps. grad_accum: the micro-steps per optimizer step when the user knows
    them; structural_unit: 1 when the step loop has no micro-step loop; else inferred from the
    gaps (_unit). The partial step before the first boundary and after the last are left out.
    Without marks, a micro-step is a backward run after forward or data time (or after more than
    `blip_s` of anything else): one odd sample inside a backward (a torn stack, a hook) does not
    make two; with marks, it is a return of the micro-step loop to its top, or such a backward
    run, whichever counts more (each misses a micro-step whose samples it does not see)."""
    stepped = [b for (a, b, p), nxt in zip(spans, spans[1:] + [None]) if p == STEP
               and (nxt is None or nxt[2] != STEP)]
    ends = sorted(marks[0]) if marks and marks[0] else stepped
    wraps = sorted(marks[1]) if marks else []
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
        if marks:  # the micro-step loop's returns to its top inside this step, +1 for its first
            micro = max(micro, 1 + sum(1 for w in wraps if s0 < w < s1))
        steps.append({"start_s": s0, "wall_s": s1 - s0, "phases": phases, "micro_steps": micro,
                      "spans": [[p, round(st, 7), round(d, 7)] for p, st, d in order]})
    counts = [s["micro_steps"] for s in steps if s["micro_steps"]]
    margin = None
    if grad_accum or structural_unit:
        unit = grad_accum or structural_unit
    else:
        unit, margin = _unit_fit(counts)
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
    what = "boundaries" if marks and marks[0] else "sampled optimizer steps"
    info = {"optimizer_ends": len(stepped), "boundaries": len(ends),
            "boundary_source": ("the step loop's once-per-step lines (the script's source)" if marks and marks[0]
                                else "the optimizer's step"),
            "gaps": len(steps), "steps": len(out), "typical_micro_steps": unit,
            "unit_source": ("given (--grad-accum)" if grad_accum else
                            "the step loop has no micro-step loop (the script's source)" if structural_unit else
                            f"inferred from {len(counts)} gaps between {what} ({single} held exactly {unit})"
                            + _margin_words(margin)),
            "unit_margin": margin,
            "gaps_split": sum(1 for s in steps if unit and s["micro_steps"] and round(s["micro_steps"] / unit) >= 2),
            # the evidence: each gap between two seen boundaries, its micro-steps and seconds
            "gap_micro_steps": [s["micro_steps"] for s in steps], "gap_s": [round(s["wall_s"], 4) for s in steps]}
    return out, info


def _margin_words(margin: float | None) -> str:
    if margin is None:
        return ""
    if margin >= UNIT_SURE:
        return f", {math.exp(min(margin, 50)):.0f}× likelier than the next unit"
    return f"; uncertain: only {math.exp(margin):.1f}× likelier than the next unit (--grad-accum N sets it)"


def _phase(label: str) -> str:
    return "optimizer" if label == STEP else label


_MISS = (0.02, 0.05, 0.1, 0.15, 0.2)  # the chance a micro-step goes unseen, tried
_EXTRA = 0.02  # the chance a gap shows one micro-step more than it held (a torn stack)


def _count_lik(c: int, m: int, q: float) -> float:
    """P(a gap of m micro-steps shows c): each missed with chance q, or one extra seen."""
    if c <= m:
        return (1 - _EXTRA) * math.comb(m, m - c) * q ** (m - c) * (1 - q) ** c
    return _EXTRA if c == m + 1 else 0.0


def _unit_fit(counts: list) -> tuple[int, float | None]:
    """Micro-steps per optimizer step from the counts between consecutive seen boundaries, by
    maximum likelihood. A gap holds k steps (k − 1 boundaries unseen), each boundary seen with one
    chance p, so k is geometric, P(k) = p(1−p)^(k−1). Of its k × unit micro-steps each may go
    unseen (chance q: a host whose cores the target fills samples its compute late, and a
    micro-step whose compute is not sampled does not show), and now and then one extra shows. The
    unit, p and q under which the counts are likeliest win. So a unit is not doubled for want of a
    one-step gap (two unseen boundaries in a row are unlikely when boundaries are often seen) and
    not lowered by the micro-steps that went unseen. The gaps' seconds are no evidence here: on a
    host whose cores the target fills, a gap's sample count, which is its time, is off by ±30%
    (late samples land in the next gap). Returns (unit, margin): how much likelier the unit makes
    the counts than the best other unit, as a natural log (None with one candidate)."""
    counts = [int(round(c)) for c in counts if c > 0]
    if not counts:
        return 0, None
    top = max(counts)
    per_unit: dict[int, float] = {}
    for u in range(1, top + 1):
        ks = range(1, top // u + 4)
        for q in _MISS:
            table = [[_count_lik(c, k * u, q) for k in ks] for c in counts]
            for p in (x / 20 for x in range(1, 20)):
                geom = [p * (1 - p) ** (k - 1) for k in ks]
                ll = 0.0
                for row in table:
                    lik = sum(g * x for g, x in zip(geom, row))
                    ll += math.log(lik) if lik > 0 else -1e9
                per_unit[u] = max(per_unit.get(u, -math.inf), ll)
    ranked = sorted(per_unit.items(), key=lambda kv: (-kv[1], kv[0]))
    return ranked[0][0], (ranked[0][1] - ranked[1][1]) if len(ranked) > 1 else None


def _unit(counts: list) -> int:
    """The unit of _unit_fit."""
    return _unit_fit(counts)[0]
