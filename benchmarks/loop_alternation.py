"""Does switching a fix on and off between two steps of a loop time the first step after the
switch cold? (issue #41: the experiment steps of gpuprof/measure/experiments.py)

One process runs the minGPT-shaped fixture's model (tests/fixtures/mingpt_train.py, the by-hand
attention case of benchmarks/loop_experiments.py: vocabulary 2048, 2 layers, 64 wide, batch 8 x
128, no dropout, one torch thread) step after step, a whole training step each (forward, backward,
AdamW), and compares two ways of a fix three ways:

    single  ABBA pairs of adjacent single steps (a, b), (b, a), ...: the experiments' schedule
            before each timed step followed a step of its own way
    leads   the same pairs, each timed step after an untimed step of its own way (the schedule now)
    blocks  3 untimed then 15 timed steps of one way, then of the other (what a loop that never
            switches runs), 3 rounds, order alternating

and prints the median ratio b ÷ a of each. The fixes: `attention` (the model's attention by hand,
a: as written, b: F.scaled_dot_product_attention, the fixture's own switch) compares whole steps;
`fused` (AdamW for-each, a, against fused=True, b) the optimizer's step alone. `--positions`
also prints each way's k-th step after a switch (medians over rounds of 8 steps a way).

    python benchmarks/loop_alternation.py [--fix attention,fused] [--pairs 20] [--repeat 2] [--positions]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "mingpt_train.py"
ARGS = ["--vocab", "2048", "--n-layer", "2", "--n-embd", "64", "--batch", "8", "--dropout", "0.0",
        "--attn", "hand", "--block", "128", "--steps", "0", "--threads", "1"]


def load():
    """The fixture's model, its parsed args (their `attn` read at each forward) and optimizer."""
    saved = sys.argv
    sys.argv = [str(FIXTURE), *ARGS]
    try:
        g = {"__name__": "mingpt_fixture"}
        exec(compile(FIXTURE.read_text(), str(FIXTURE), "exec"), g)
    finally:
        sys.argv = saved
    return g["model"], g["args"], g["optimizer"]


def stepper(fix: str):
    import torch

    model, args, opt = load()
    batch, block = args.batch, args.block

    def step(way: str) -> float:
        x = torch.randint(0, 2048, (batch, block))
        y = torch.randint(0, 2048, (batch, block))
        if fix == "attention":
            args.attn = "sdpa" if way == "b" else "hand"
        else:
            for group in opt.param_groups:
                group["fused"] = way == "b"
        t0 = time.perf_counter()
        _, loss = model(x, y)
        loss.backward()
        t1 = time.perf_counter()
        opt.step()
        t2 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        return (t2 - t0) if fix == "attention" else (t2 - t1)

    return step


def single(step, pairs: int) -> float:
    ratios = []
    for i in range(pairs):
        t = {w: step(w) for w in (("a", "b") if i % 2 == 0 else ("b", "a"))}
        ratios.append(t["b"] / t["a"])
    return statistics.median(ratios)


def leads(step, pairs: int) -> float:
    ratios, prev = [], None
    for i in range(pairs):
        t = {}
        for w in (("a", "b") if i % 2 == 0 else ("b", "a")):
            if prev != w:
                step(w)  # untimed: the first step of this way after a switch
            t[w] = step(w)
            prev = w
        ratios.append(t["b"] / t["a"])
    return statistics.median(ratios)


def blocks(step, rounds: int = 3, n: int = 15) -> float:
    ratios = []
    for i in range(rounds):
        t = {}
        for w in (("a", "b") if i % 2 == 0 else ("b", "a")):
            for _ in range(3):
                step(w)
            t[w] = statistics.median([step(w) for _ in range(n)])
        ratios.append(t["b"] / t["a"])
    return statistics.median(ratios)


def positions(step, rounds: int = 12, k: int = 8) -> dict:
    at = {w: [[] for _ in range(k)] for w in ("a", "b")}
    for i in range(rounds):
        for w in (("a", "b") if i % 2 == 0 else ("b", "a")):
            for j in range(k):
                at[w][j].append(step(w))
    return {w: [round(statistics.median(v) * 1e3, 1) for v in at[w]] for w in at}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fix", default="attention,fused")
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--positions", action="store_true")
    a = ap.parse_args(argv)
    for fix in [f for f in a.fix.split(",") if f]:
        if fix not in ("attention", "fused"):
            print(f"unknown fix {fix!r} (attention, fused)", file=sys.stderr)
            return 2
        step = stepper(fix)
        for _ in range(5):
            step("a"), step("b")
        what = "whole steps" if fix == "attention" else "the optimizer's step"
        for _ in range(a.repeat):
            print(f"{fix:9s} b/a of {what}: single {single(step, a.pairs):.3f}  leads {leads(step, a.pairs):.3f}  "
                  f"blocks {blocks(step):.3f}", flush=True)
        if a.positions:
            print(f"{fix:9s} k-th step after a switch (ms, medians): {positions(step)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
