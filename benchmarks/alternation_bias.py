"""Does alternating the two ways of a paired round time a way cold? (issue #29)

The fixture's GPT (tests/fixtures/argparse_train.py) at batch 2 x 128 tokens (--batch, --seq), one torch thread.

precision: an fp32 forward+backward timed right after a bf16-autocast one (as pairs.alternate_rounds
timed the precision switch before its lead-in: one call of each way per round), against the same
fp32 call after one fp32 call (what the lead-in times), and 2nd-8th in a row of 8 (as a
gradient-accumulation loop runs it).

microbatch: the micro-batch pair (measure/microbatch.time_pair): the run's way, 4 forward+backward
of the batch, and the larger way, one of 4 times the batch (the same tokens). Each way timed right after the
other (as the pair's rounds time it) and right after a run of its own way.

8 rounds each; medians printed.

    OMP_NUM_THREADS=1 python benchmarks/alternation_bias.py [--pair precision|microbatch|both]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))


def _ms(v: list[float]) -> str:
    return f"{statistics.median(v) * 1e3:.2f} ms"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--pair", choices=("precision", "microbatch", "both"), default="both")
    ap.add_argument("--batch", type=int, default=2, help="the run's micro-batch (advice_repeat's microbatch scenario: 1)")
    ap.add_argument("--seq", type=int, default=128, help="tokens per row (advice_repeat's microbatch scenario: 64)")
    a = ap.parse_args(argv)
    import argparse_train as at

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = at.GPT(block=a.seq)
    x, y = torch.randint(0, 256, (a.batch, a.seq)), torch.randint(0, 256, (a.batch, a.seq))
    x8, y8 = x.repeat(4, 1), y.repeat(4, 1)

    def fwd_bwd(dtype: str, xs=x, ys=y) -> None:
        if dtype == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                _, loss = model(xs, ys)
        else:
            _, loss = model(xs, ys)
        loss.backward()

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    if a.pair in ("precision", "both"):
        for _ in range(3):
            fwd_bwd("fp32")
            fwd_bwd("bf16")
        after_bf16, second, in_a_row = [], [], []
        for _ in range(a.rounds):
            fwd_bwd("bf16")
            after_bf16.append(timed(lambda: fwd_bwd("fp32")))
            fwd_bwd("bf16")
            fwd_bwd("fp32")
            second.append(timed(lambda: fwd_bwd("fp32")))
            fwd_bwd("bf16")
            in_a_row.append(statistics.median([timed(lambda: fwd_bwd("fp32")) for _ in range(8)][1:]))
        print(f"precision: fp32 after a bf16 call: {_ms(after_bf16)}; after one fp32 call (the lead-in): "
              f"{_ms(second)}; in a row of 8 (2nd-8th): {_ms(in_a_row)}")

    if a.pair in ("microbatch", "both"):
        def run_way():
            model.zero_grad(set_to_none=True)
            for _ in range(4):
                fwd_bwd("fp32")

        def larger():
            model.zero_grad(set_to_none=True)
            fwd_bwd("fp32", x8, y8)

        for _ in range(3):
            run_way()
            larger()
        big_cold, big_warm, run_cold, run_warm = [], [], [], []
        for _ in range(a.rounds):
            run_way()
            big_cold.append(timed(larger))
            big_warm.append(timed(larger))
            run_cold.append(timed(run_way))
            run_warm.append(timed(run_way))
        print(f"microbatch: batch {4 * a.batch} after the 4 x {a.batch} way: {_ms(big_cold)}; after a batch-{4 * a.batch} call: {_ms(big_warm)}; "
              f"4 x {a.batch} after a batch-{4 * a.batch} call: {_ms(run_cold)}; after the 4 x {a.batch} way: {_ms(run_warm)}; "
              f"larger/run as the rounds pair them: {statistics.median(big_cold) / statistics.median(run_cold):.3f}, "
              f"each after its own: {statistics.median(big_warm) / statistics.median(run_warm):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
