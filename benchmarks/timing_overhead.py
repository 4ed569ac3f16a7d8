"""Phase timing on vs off in the built-in loop: ratio of median step times (goal <= 1.02).

Both runs time each optimizer step the same way, from outside the timer (the loop's on_step
callback), so the only difference is the PhaseTimer. Runs alternate on/off to spread machine
noise over both.

    python benchmarks/timing_overhead.py [--rounds 3] [--steps 20] [--config default|small]
"""

from __future__ import annotations

import argparse
import statistics
import time

from gpuprof.runners.builtin import LoopConfig, run_builtin

CONFIGS = {
    # the default `gpuprof diagnose` on CPU
    "default": dict(model="tiny", batch_size=8, block_size=256, grad_accum=4),
    # a much smaller step, where fixed per-phase costs weigh most
    "small": dict(model="tiny", n_layer=1, n_embd=64, n_head=2, batch_size=2, block_size=32, grad_accum=4),
}


def step_times(cfg: LoopConfig, timing: bool) -> list[float]:
    stamps = []
    run_builtin(cfg, on_step=lambda i, n: stamps.append(time.perf_counter()), timing=timing)
    diffs = [b - a for a, b in zip(stamps, stamps[1:])]
    return diffs[cfg.warmup:]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--config", choices=list(CONFIGS), default="default")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    cfg = LoopConfig(**CONFIGS[args.config], steps=args.steps, warmup=2, device=args.device)
    on, off = [], []
    for r in range(args.rounds):
        on += step_times(cfg, True)
        off += step_times(cfg, False)
    m_on, m_off = statistics.median(on), statistics.median(off)
    print(f"config={args.config} device={args.device} rounds={args.rounds} steps/round={args.steps}")
    print(f"median step, timing on : {m_on * 1e3:.3f} ms  (n={len(on)})")
    print(f"median step, timing off: {m_off * 1e3:.3f} ms  (n={len(off)})")
    print(f"ratio on/off: {m_on / m_off:.4f}  (goal <= 1.02)")


if __name__ == "__main__":
    main()
