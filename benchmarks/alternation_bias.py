"""Does alternating the two ways of a paired round time the faster way cold? (issue #29)

The fixture's GPT (tests/fixtures/argparse_train.py) at batch 2 x 128 tokens, one torch thread:
an fp32 forward+backward timed right after a bf16-autocast one (as pairs.alternate_rounds times
the precision switch: one call of each way per round), against the same fp32 call 2nd-8th in a
row of 8 (as a gradient-accumulation loop runs it). 8 rounds each; medians printed.

    OMP_NUM_THREADS=1 python benchmarks/alternation_bias.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args(argv)
    import argparse_train as at

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = at.GPT(block=128)
    x, y = torch.randint(0, 256, (2, 128)), torch.randint(0, 256, (2, 128))

    def fwd_bwd(dtype: str) -> None:
        if dtype == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                _, loss = model(x, y)
        else:
            _, loss = model(x, y)
        loss.backward()

    def timed(dtype: str) -> float:
        t0 = time.perf_counter()
        fwd_bwd(dtype)
        return time.perf_counter() - t0

    for _ in range(3):
        fwd_bwd("fp32")
        fwd_bwd("bf16")
    after_bf16, in_a_row = [], []
    for _ in range(a.rounds):
        fwd_bwd("bf16")
        after_bf16.append(timed("fp32"))
        fwd_bwd("bf16")
        in_a_row.append(statistics.median([timed("fp32") for _ in range(8)][1:]))
    print(f"fp32 after a bf16 call: {statistics.median(after_bf16) * 1e3:.2f} ms; "
          f"fp32 in a row of 8 (2nd-8th): {statistics.median(in_a_row) * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
