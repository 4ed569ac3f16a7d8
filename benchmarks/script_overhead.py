"""Overhead of script mode: the nanoGPT-style fixture run plain vs under `gpuprof diagnose`.

Both runs are the same command (same seed, same config, same number of iterations; gpuprof with
--no-stop so the script runs to its end). The step time is the fixture's own printed
`iter N: ... time T ms` (nanoGPT's dt: time.time() per iteration), so both sides are timed by the
same code. Rounds alternate plain / instrumented to spread machine noise over both; the figure
is median(instrumented iteration times) / median(plain iteration times), pooled over rounds,
first iterations skipped (iter 0 holds the eval and allocator warm-up).

    python benchmarks/script_overhead.py                 # default: 5 rounds x 40 iterations
    python benchmarks/script_overhead.py --rounds 3 --iters 30 --threads 1

Prints one line per round and the summary; goal: ratio <= 1.02.
"""

from __future__ import annotations

import argparse
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
ITER = re.compile(r"^iter (\d+): loss [-0-9.naif]+, time ([0-9.]+)ms", re.M)


def _iter_times(text: str, skip: int) -> list[float]:
    return [float(ms) for it, ms in ITER.findall(text) if int(it) >= skip]


def _run(cmd: list[str], stream: str) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return proc.stdout if stream == "stdout" else proc.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=40, help="iterations per run (max_iters)")
    ap.add_argument("--skip", type=int, default=5, help="first iterations left out of the medians")
    ap.add_argument("--threads", type=int, default=0, help="torch threads in the fixture (0: torch default)")
    ap.add_argument("--samplers", action="store_true", help="also run gpuprof's NVML/host samplers and probe")
    ap.add_argument("--model", default="--n_layer=4 --n_head=4 --n_embd=128 --block_size=128 --batch_size=8",
                    help="fixture model/batch overrides")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rng = np.random.default_rng(0)
        for split in ("train", "val"):
            rng.integers(0, 256, 200_000, dtype=np.uint16).tofile(tmp / f"{split}.bin")
        script_args = [f"--data_dir={tmp}", f"--out_dir={tmp / 'out'}", f"--max_iters={args.iters}",
                       f"--threads={args.threads}", "--eval_interval=100000", *args.model.split()]
        plain_cmd = [sys.executable, str(FIXTURE), *script_args]
        gp_cmd = [sys.executable, "-m", "gpuprof", "diagnose", "--no-stop", "--json",
                  "--samplers" if args.samplers else "--no-samplers", str(FIXTURE), *script_args]
        print(f"plain:        {' '.join(plain_cmd[1:])}")
        print(f"instrumented: {' '.join(gp_cmd[1:])}")
        plain_all, gp_all = [], []
        t0 = time.time()
        for r in range(args.rounds):
            plain = _iter_times(_run(plain_cmd, "stdout"), args.skip)
            gp = _iter_times(_run(gp_cmd, "stderr"), args.skip)  # --json: script output on stderr
            plain_all += plain
            gp_all += gp
            print(f"round {r + 1}: plain median {statistics.median(plain):.2f} ms, instrumented median "
                  f"{statistics.median(gp):.2f} ms, ratio {statistics.median(gp) / statistics.median(plain):.4f}")
        ratio = statistics.median(gp_all) / statistics.median(plain_all)
        rounds = [g / p for g, p in zip(_chunk_medians(gp_all, args.rounds), _chunk_medians(plain_all, args.rounds))]
        print(f"iterations per side: {len(plain_all)} plain, {len(gp_all)} instrumented ({time.time() - t0:.0f} s)")
        print(f"median step: plain {statistics.median(plain_all):.2f} ms, instrumented {statistics.median(gp_all):.2f} ms")
        print(f"overhead ratio (pooled medians): {ratio:.4f}  (per-round ratios {min(rounds):.4f}..{max(rounds):.4f}; "
              f"goal <= 1.02)")


def _chunk_medians(xs: list[float], n: int) -> list[float]:
    size = max(1, len(xs) // n)
    return [statistics.median(xs[i * size:(i + 1) * size]) for i in range(n) if xs[i * size:(i + 1) * size]]


if __name__ == "__main__":
    main()
