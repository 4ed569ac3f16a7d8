"""Phase timing on vs off in the built-in loop: ratio of median step times (goal <= 1.02).

Both runs time each optimizer step the same way, from outside the timer (the loop's on_step
callback), so the only difference is the PhaseTimer. Runs alternate on/off to spread machine
noise over both: in ABBA order (on, off, off, on, ...), and the figure is the median of the
per-pair ratios, so a burst of load from another process spoils one pair, not the result.
CPU time per step (process_time) is printed too: it does not grow when other processes
take the cores.

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


def step_times(cfg: LoopConfig, timing: bool) -> tuple[list[float], list[float]]:
    stamps = []
    run_builtin(cfg, on_step=lambda i, n: stamps.append((time.perf_counter(), time.process_time())),
                timing=timing)
    wall = [b[0] - a[0] for a, b in zip(stamps, stamps[1:])][cfg.warmup:]
    cpu = [b[1] - a[1] for a, b in zip(stamps, stamps[1:])][cfg.warmup:]
    return wall, cpu


def timer_cost_per_step(micro_steps: int, n: int = 2000) -> float:
    """Seconds of the PhaseTimer's own work for one step of the loop's phase pattern."""
    from gpuprof.measure.timer import PhaseTimer

    t = PhaseTimer()
    t0 = time.perf_counter()
    for _ in range(n):
        t.start_step()
        for _ in range(micro_steps):
            with t.phase("forward"):
                pass
            with t.phase("data"):
                with t.phase("h2d"):
                    pass
            with t.phase("backward"):
                pass
        with t.phase("optimizer"):
            pass
        t.end_step(tokens=1, micro_steps=micro_steps)
    return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--config", choices=list(CONFIGS), default="default")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    cfg = LoopConfig(**CONFIGS[args.config], steps=args.steps, warmup=2, device=args.device)
    ratios, cpu_ratios, on_all, off_all = [], [], [], []
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        got = {t: step_times(cfg, t) for t in order}
        (w_on, c_on), (w_off, c_off) = got[True], got[False]
        on_all += w_on
        off_all += w_off
        ratios.append(statistics.median(w_on) / statistics.median(w_off))
        cpu_ratios.append(statistics.median(c_on) / statistics.median(c_off))
    print(f"config={args.config} device={args.device} rounds={args.rounds} (ABBA) steps/round={args.steps}")
    print(f"median step, timing on : {statistics.median(on_all) * 1e3:.3f} ms  (n={len(on_all)})")
    print(f"median step, timing off: {statistics.median(off_all) * 1e3:.3f} ms  (n={len(off_all)})")
    print("per-pair wall ratios: " + " ".join(f"{x:.3f}" for x in ratios))
    cost = timer_cost_per_step(cfg.grad_accum)
    print(f"timer's own work: {cost * 1e6:.1f} µs per step = {cost / statistics.median(off_all):.4%} "
          f"of the median untimed step")
    print(f"ratio on/off (median of pairs): wall {statistics.median(ratios):.4f}, "
          f"CPU time {statistics.median(cpu_ratios):.4f}  (goal <= 1.02)")


if __name__ == "__main__":
    main()
