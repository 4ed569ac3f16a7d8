"""Overhead of script mode: the nanoGPT-style fixture run plain vs under `gpuprof diagnose`.

Both runs are the same command (same seed, config and number of iterations; gpuprof with
--no-stop so the script runs to its end). Step times are the fixture's own printed
`iter N: ... time T ms` (nanoGPT's dt, time.time() per iteration), so both sides are timed by
the same code; the fixture also prints the iteration's process CPU time (`cpu C ms`, all
threads: gpuprof's sampler thread included), which other processes on a shared machine disturb
far less than wall time. Runs alternate in ABBA order (plain, instrumented, instrumented,
plain) to spread drifting machine load over both sides; one such group is a *pair*. Each pair
gives one ratio, median(instrumented iterations) / median(plain iterations), first iterations
skipped (iter 0 holds the eval and allocator warm-up); the report is the median of the pair
ratios with their spread (min, quartiles, max), for wall and for CPU time, plus the ratio of
the pooled medians.

    python benchmarks/script_overhead.py --interleaved --model mid --pairs 150 --compare hooks
    python benchmarks/script_overhead.py --interleaved --model tiny --pairs 300 --compare hooks
    python benchmarks/script_overhead.py --in-process --model mid --pairs 10 --iters 15   # whole runs
    python benchmarks/script_overhead.py --model small                                    # CLI end to end

--interleaved alternates short *blocks of iterations*, not runs: the fixture is executed once
(two iterations) for its model, optimizer and get_batch, then this file runs nanoGPT's
iteration body (the fixture's loop, copied below) in blocks of --block (3) iterations, one
block per variant in the order plain, gpuprof, *--compare, then reversed (ABBA generalised) --
a *group*. gpuprof's instrumentation is installed before a block and removed after it, outside
the timed region: the same TrainingHooks + PhaseTimer + StackSampler (started per block with
the period a sampler running through the whole run would have learnt, step time / per_step,
and its caches filled) and the get_batch wrapper that run_script installs; no instruments. The
first iteration of each block is not timed (it absorbs installing and starting). Each group
gives each variant's ratio to plain, so machine load that drifts over seconds cancels out; on a
shared 2-core VM this is the only mode that resolves ~1% (with a few hundred groups). It
measures the steady state (no first-forward setup, no report). --compare adds variants to the
same groups: `hooks` (no stack sampler) and `fixed10` (the sampler at a fixed 10 ms, as it was
before the period adapted). Besides the median group ratio it prints the ratio of the 10th
percentiles: other processes only ever add time, so the fast tail is the least disturbed.

--in-process runs both sides in this one process (plain: the fixture executed as __main__;
instrumented: gpuprof.runners.script.run_script, no instruments), so the alternation is a
fraction of a second instead of a whole interpreter start: on a shared, loaded machine it
resolves a few per cent where whole-process runs cannot (on this VM, not even that: see
docs/script.md). --sampler off runs gpuprof without its stack sampler.

Goal (issue 11): wall-time ratio <= 1.01 on steps >= 50 ms.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "nanogpt_train.py"
ITER = re.compile(r"^iter (\d+): loss [-0-9.naif]+, time ([0-9.]+)ms.*?, cpu ([0-9.]+)ms", re.M)
MODELS = {
    "small": "--n_layer=4 --n_head=4 --n_embd=128 --block_size=128 --batch_size=8",  # ~230-340 ms
    "mid": "--n_layer=2 --n_head=4 --n_embd=128 --block_size=64 --batch_size=4",  # ~75 ms
    "tiny": "",  # the fixture's defaults: 2 layers, d=32, block 32, batch 4: ~17 ms
}


def _iters(text: str, skip: int) -> tuple[list[float], list[float]]:
    rows = [(float(ms), float(cpu)) for it, ms, cpu in ITER.findall(text) if int(it) >= skip]
    return [r[0] for r in rows], [r[1] for r in rows]


def _run(cmd: list[str], stream: str) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return proc.stdout if stream == "stdout" else proc.stderr


def _in_process(script_args: list[str], sampler: bool):
    """Runners for both sides inside this process; each returns the fixture's stdout."""
    import contextlib
    import io
    import runpy

    from gpuprof.runners.script import run_script

    def plain() -> str:
        buf, saved = io.StringIO(), sys.argv
        sys.argv = [str(FIXTURE), *script_args]
        try:
            with contextlib.redirect_stdout(buf):
                runpy.run_path(str(FIXTURE), run_name="__main__")
        finally:
            sys.argv = saved
        return buf.getvalue()

    def instrumented() -> str:
        buf = io.StringIO()
        # an hour-long first period: the sampler thread starts but never samples
        kw = {} if sampler else {"sample_interval_s": 3600.0}
        run_script(str(FIXTURE), script_args, steps=1, warmup=0, stop=False, stdout=buf, **kw)
        return buf.getvalue()

    return plain, instrumented


# Variants --interleaved can compare, each against plain in the same groups: (hooks installed,
# sampler settings or None). "gpuprof" is filled in from the command line.
VARIANTS = {
    "plain": (False, None),
    "hooks": (True, None),  # gpuprof without its stack sampler
    "fixed10": (True, {"interval": 0.01, "per_step": 1e9}),  # the sampler as it was: every 10 ms
}


def _interleaved(script_args: list[str], pairs: int, gpuprof: dict | None, block: int,
                 compare: list[str]) -> None:
    """Groups of short blocks of the fixture's loop body, one block per variant in the order
    plain, gpuprof, *compare, then the same reversed (ABBA, generalised); prints each variant's
    ratio to plain per group."""
    import contextlib
    import io
    import runpy
    import threading

    import torch

    from gpuprof.measure.hooks import TrainingHooks, data_like_name
    from gpuprof.measure.stacks import StackSampler
    from gpuprof.measure.timer import PhaseTimer

    saved = sys.argv
    sys.argv = [str(FIXTURE), *script_args, "--max_iters=1"]  # two iterations: builds everything
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            g = runpy.run_path(str(FIXTURE), run_name="__main__")
    finally:
        sys.argv = saved
    model, optimizer, scaler, ctx = g["model"], g["optimizer"], g["scaler"], g["ctx"]
    accum, grad_clip = g["gradient_accumulation_steps"], g["grad_clip"]
    batch = {"xy": g["get_batch"]("train")}

    def iteration() -> None:  # the fixture's loop body (nanoGPT's), without eval and logging
        X, Y = batch["xy"]
        for _ in range(accum):
            with ctx:
                logits, loss = model(X, Y)
                loss = loss / accum
            X, Y = g["get_batch"]("train")  # looked up per call: the wrapper when installed
            scaler.scale(loss).backward()
        batch["xy"] = X, Y
        if grad_clip != 0.0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        loss.item()

    timer = PhaseTimer()
    hooks = TrainingHooks(lambda module, args, kwargs: timer)
    tid = threading.get_ident()
    caches = ({}, {})  # the sampler's code and file caches, kept across blocks as in one run
    variants = {**VARIANTS, "gpuprof": (True, gpuprof)}
    order = ["plain", "gpuprof", *compare]
    samplers: dict[str, list[StackSampler]] = {name: [] for name in order}
    step_s: list[float] = []

    def label():
        return timer.current if timer.in_step else None

    def run_block(name: str) -> list[tuple[float, float]]:
        """`block` iterations under variant `name`; (wall, CPU) of each but the first, which
        absorbs installing the hooks and starting the sampler."""
        installed, smp = variants[name]
        s = None
        if installed:
            hooks.install()
            hooks.wrap_attr(g, "get_batch", "get_batch")
        if smp is not None:
            kw = {} if smp.get("per_step") is None else {"per_step": smp["per_step"]}
            s = StackSampler(tid, label, smp["interval"], marker=data_like_name,
                             steps=lambda: hooks.steps_done, **kw)
            # Start where a sampler running through a whole run would be: the period it has
            # learnt (five steps seen, so that the first one this sampler times, which began
            # before it started, does not move it), the code objects here already classified.
            for _ in range(5):
                s._adapt(statistics.median(step_s))
            s._code_cache, s._file_cache = caches
            s.start()
        out = []
        try:
            for i in range(block):
                t, c = time.perf_counter(), time.process_time()
                iteration()
                t, c = time.perf_counter() - t, time.process_time() - c
                if i:
                    out.append((t, c))
        finally:
            if s is not None:
                s.stop()
                samplers[name].append(s)
            if installed:
                hooks.remove()
                hooks.wrapped.clear()
        return out

    for _ in range(2):
        step_s.extend(t for t, _ in run_block("plain"))
    for name in order[1:]:
        run_block(name)
        samplers[name].clear()
    rows = {name: ([], []) for name in order}
    ratios = {name: ([], []) for name in order[1:]}
    t0, load0 = time.time(), os.getloadavg()[0]
    for _ in range(pairs):
        per = {name: [0.0, 0.0] for name in order}
        for name in order + order[::-1]:
            for w, c in run_block(name):
                rows[name][0].append(w * 1e3)
                rows[name][1].append(c * 1e3)
                per[name][0] += w
                per[name][1] += c
        for name in order[1:]:
            ratios[name][0].append(per[name][0] / per["plain"][0])
            ratios[name][1].append(per[name][1] / per["plain"][1])
    pw, pc = rows["plain"]
    print(f"{pairs} groups ({' '.join(order + order[::-1])}), blocks of {block} iterations, the first of each "
          f"untimed: {len(pw)} timed iterations per variant in {time.time() - t0:.0f} s; load avg (1 min) "
          f"{load0:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"plain: median iteration wall {statistics.median(pw):.2f} ms, CPU {statistics.median(pc):.2f} ms")
    for name in order[1:]:
        gw, gc = rows[name]
        smp = samplers[name]
        what = "hooks only" if not smp else (
            f"sampler period {statistics.median(x.interval_s for x in smp) * 1e3:.1f} ms, "
            f"{sum(x.samples for x in smp) / (len(smp) * block):.1f} samples per iteration")
        print(f"{name} ({what}):")
        print(f"  wall ratio per group: {_fmt(spread(ratios[name][0]))}")
        print(f"  CPU ratio per group:  {_fmt(spread(ratios[name][1]))}")
        # Interference from other processes only ever adds time: the fast tail is the least disturbed.
        print(f"  ratio of medians: wall {_ratio(gw, pw):.4f}, CPU {_ratio(gc, pc):.4f}; of 10th percentiles: "
              f"wall {_q10(gw) / _q10(pw):.4f}, CPU {_q10(gc) / _q10(pc):.4f}")


def _q10(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=10, method="inclusive")[0]


def _ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(a) / statistics.median(b)


def spread(ratios: list[float]) -> dict:
    """Median, min, quartiles and max of per-pair ratios."""
    q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return {"median": statistics.median(ratios), "min": min(ratios), "q1": q[0], "q3": q[2],
            "max": max(ratios), "n": len(ratios)}


def _fmt(s: dict) -> str:
    return (f"median {s['median']:.4f}  (min {s['min']:.4f}, IQR {s['q1']:.4f}-{s['q3']:.4f}, "
            f"max {s['max']:.4f}; {s['n']} pairs)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=8, help="ABBA pairs of runs (each pair: 2 plain + 2 instrumented)")
    ap.add_argument("--iters", type=int, default=20, help="iterations per run (max_iters)")
    ap.add_argument("--skip", type=int, default=3, help="first iterations left out")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in the fixture (0: torch default)")
    ap.add_argument("--samplers", action="store_true", help="also run gpuprof's NVML/host samplers and probe")
    ap.add_argument("--model", default="mid", help=f"{' | '.join(MODELS)} or fixture --key=value overrides")
    ap.add_argument("--in-process", action="store_true", help="alternate both sides inside this process")
    ap.add_argument("--interleaved", action="store_true",
                    help="alternate blocks of iterations inside this process (pairs = groups of blocks)")
    ap.add_argument("--per-step", type=float, default=None,
                    help="--interleaved: the sampler's samples per step (default: the sampler's own)")
    ap.add_argument("--compare", default="",
                    help=f"--interleaved: more variants in the same groups, comma-separated: "
                         f"{', '.join(k for k in VARIANTS if k != 'plain')}")
    ap.add_argument("--block", type=int, default=3,
                    help="--interleaved: iterations per block (the first of each is not timed)")
    ap.add_argument("--interval", type=float, default=0.01,
                    help="--interleaved: the sampler's shortest period in seconds (run_script's default 0.01); "
                         "1e-3 with --per-step 1000 samples every ms, to measure the cost of one sample")
    ap.add_argument("--sampler", choices=("on", "off"), default="on",
                    help="off: gpuprof without its stack sampler (in-process only)")
    ap.add_argument("--quiet", action="store_true", help="no per-pair lines")
    args = ap.parse_args()
    if args.sampler == "off" and not (args.in_process or args.interleaved):
        ap.error("--sampler off needs --in-process or --interleaved")
    model = MODELS.get(args.model, args.model)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rng = np.random.default_rng(0)
        for split in ("train", "val"):
            rng.integers(0, 256, 200_000, dtype=np.uint16).tofile(tmp / f"{split}.bin")
        script_args = [f"--data_dir={tmp}", f"--out_dir={tmp / 'out'}", f"--max_iters={args.iters}",
                       f"--threads={args.threads}", "--eval_interval=100000", "--cpu_time=True", *model.split()]
        if args.interleaved:
            print(f"interleaved: fixture {' '.join(script_args[3:])}")
            smp = {"interval": args.interval, "per_step": args.per_step} if args.sampler == "on" else None
            _interleaved(script_args[:2] + script_args[3:], args.pairs, smp, args.block,
                         [c for c in args.compare.split(",") if c])
            return
        plain_cmd = [sys.executable, str(FIXTURE), *script_args]
        gp_cmd = [sys.executable, "-m", "gpuprof", "diagnose", "--no-stop", "--json",
                  "--samplers" if args.samplers else "--no-samplers", str(FIXTURE), *script_args]
        if args.in_process:
            run_plain, run_gp = _in_process(script_args, args.sampler == "on")
            print(f"in-process (sampler {args.sampler}): fixture {' '.join(script_args)}")
        else:
            run_plain, run_gp = (lambda: _run(plain_cmd, "stdout")), (lambda: _run(gp_cmd, "stderr"))
            print(f"plain:        python {' '.join(str(c) for c in plain_cmd[1:])}")
            print(f"instrumented: python {' '.join(str(c) for c in gp_cmd[1:])}")
        side = {"plain": ([], []), "gpuprof": ([], [])}
        pair_wall, pair_cpu = [], []
        t0 = time.time()
        load0 = os.getloadavg()[0]
        for pair in range(args.pairs):
            per = {"plain": ([], []), "gpuprof": ([], [])}
            for name in ("plain", "gpuprof", "gpuprof", "plain"):  # ABBA
                text = run_plain() if name == "plain" else run_gp()  # --json: script output on stderr
                wall, cpu = _iters(text, args.skip)
                for dst in (side[name], per[name]):
                    dst[0].extend(wall)
                    dst[1].extend(cpu)
            pair_wall.append(_ratio(per["gpuprof"][0], per["plain"][0]))
            pair_cpu.append(_ratio(per["gpuprof"][1], per["plain"][1]))
            if not args.quiet:
                print(f"pair {pair + 1}: wall plain {statistics.median(per['plain'][0]):.2f} ms, gpuprof "
                      f"{statistics.median(per['gpuprof'][0]):.2f} ms, ratio {pair_wall[-1]:.4f}; "
                      f"cpu ratio {pair_cpu[-1]:.4f}; load {os.getloadavg()[0]:.1f}", flush=True)
        (pw, pc), (gw, gc) = side["plain"], side["gpuprof"]
        print(f"{len(pw)} iterations per side in {time.time() - t0:.0f} s; model: {args.model}; "
              f"load avg (1 min) {load0:.1f} -> {os.getloadavg()[0]:.1f}")
        print(f"median step wall: plain {statistics.median(pw):.2f} ms, gpuprof {statistics.median(gw):.2f} ms"
              f"  (pooled ratio {_ratio(gw, pw):.4f})")
        print(f"median step CPU:  plain {statistics.median(pc):.2f} ms, gpuprof {statistics.median(gc):.2f} ms"
              f"  (pooled ratio {_ratio(gc, pc):.4f})")
        print(f"wall ratio per pair: {_fmt(spread(pair_wall))}")
        print(f"CPU ratio per pair:  {_fmt(spread(pair_cpu))}")


if __name__ == "__main__":
    main()
