"""Overhead of script mode: the nanoGPT-style fixture run plain vs under `gpuprof diagnose`.

Both runs are the same command (same seed, config and number of iterations; gpuprof with
--no-stop so the script runs to its end). Step times are the fixture's own printed
`iter N: ... time T ms` (nanoGPT's dt, time.time() per iteration), so both sides are timed by
the same code; the fixture also prints the iteration's process CPU time (`cpu C ms`, all
threads: gpuprof's sampler thread included), which other processes on a shared machine disturb
far less than wall time. Runs alternate in ABBA order (plain, instrumented, instrumented,
plain, ...) to spread drifting machine load over both sides. The figures are
median(instrumented) / median(plain) of the pooled iterations, first iterations skipped (iter 0
holds the eval and allocator warm-up).

    python benchmarks/script_overhead.py                  # 4 pairs x 25 iterations, small model
    python benchmarks/script_overhead.py --model tiny     # the fixture's default ~10 ms step
    python benchmarks/script_overhead.py --in-process --model tiny --pairs 30 --iters 15

--in-process runs both sides in this one process (plain: the fixture executed as __main__;
instrumented: gpuprof.runners.script.run_script, no instruments), so the alternation is a
fraction of a second instead of a whole interpreter start: on a shared, loaded machine it
resolves a few per cent where whole-process runs cannot.

Goal: wall-time ratio <= 1.02.
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
ITER = re.compile(r"^iter (\d+): loss [-0-9.naif]+, time ([0-9.]+)ms.*?, cpu ([0-9.]+)ms", re.M)
MODELS = {
    "small": "--n_layer=4 --n_head=4 --n_embd=128 --block_size=128 --batch_size=8",
    "tiny": "",  # the fixture's defaults: 2 layers, d=32, block 32, batch 4
}


def _iters(text: str, skip: int) -> tuple[list[float], list[float]]:
    rows = [(float(ms), float(cpu)) for it, ms, cpu in ITER.findall(text) if int(it) >= skip]
    return [r[0] for r in rows], [r[1] for r in rows]


def _run(cmd: list[str], stream: str) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return proc.stdout if stream == "stdout" else proc.stderr


def _in_process(script_args: list[str]):
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
        run_script(str(FIXTURE), script_args, steps=1, warmup=0, stop=False, stdout=buf)
        return buf.getvalue()

    return plain, instrumented


def _ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(a) / statistics.median(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=4, help="ABBA pairs of runs (each pair: 2 plain + 2 instrumented)")
    ap.add_argument("--iters", type=int, default=25, help="iterations per run (max_iters)")
    ap.add_argument("--skip", type=int, default=3, help="first iterations left out")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in the fixture (0: torch default)")
    ap.add_argument("--samplers", action="store_true", help="also run gpuprof's NVML/host samplers and probe")
    ap.add_argument("--model", default="small", help=f"{' | '.join(MODELS)} or fixture --key=value overrides")
    ap.add_argument("--in-process", action="store_true", help="alternate both sides inside this process")
    ap.add_argument("--quiet", action="store_true", help="no per-pair lines")
    args = ap.parse_args()
    model = MODELS.get(args.model, args.model)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rng = np.random.default_rng(0)
        for split in ("train", "val"):
            rng.integers(0, 256, 200_000, dtype=np.uint16).tofile(tmp / f"{split}.bin")
        script_args = [f"--data_dir={tmp}", f"--out_dir={tmp / 'out'}", f"--max_iters={args.iters}",
                       f"--threads={args.threads}", "--eval_interval=100000", "--cpu_time=True", *model.split()]
        plain_cmd = [sys.executable, str(FIXTURE), *script_args]
        gp_cmd = [sys.executable, "-m", "gpuprof", "diagnose", "--no-stop", "--json",
                  "--samplers" if args.samplers else "--no-samplers", str(FIXTURE), *script_args]
        if args.in_process:
            run_plain, run_gp = _in_process(script_args)
            print(f"in-process: fixture {' '.join(script_args)}")
        else:
            run_plain, run_gp = (lambda: _run(plain_cmd, "stdout")), (lambda: _run(gp_cmd, "stderr"))
            print(f"plain:        python {' '.join(str(c) for c in plain_cmd[1:])}")
            print(f"instrumented: python {' '.join(str(c) for c in gp_cmd[1:])}")
        side = {"plain": ([], []), "gpuprof": ([], [])}
        t0 = time.time()
        for pair in range(args.pairs):
            per = {}
            for name in ("plain", "gpuprof", "gpuprof", "plain"):  # ABBA
                text = run_plain() if name == "plain" else run_gp()  # --json: script output on stderr
                wall, cpu = _iters(text, args.skip)
                side[name][0].extend(wall)
                side[name][1].extend(cpu)
                per.setdefault(name, ([], []))
                per[name][0].extend(wall)
                per[name][1].extend(cpu)
            if not args.quiet:
                print(f"pair {pair + 1}: wall plain {statistics.median(per['plain'][0]):.2f} ms, gpuprof "
                      f"{statistics.median(per['gpuprof'][0]):.2f} ms, ratio {_ratio(per['gpuprof'][0], per['plain'][0]):.4f}; "
                      f"cpu ratio {_ratio(per['gpuprof'][1], per['plain'][1]):.4f}")
        (pw, pc), (gw, gc) = side["plain"], side["gpuprof"]
        print(f"{len(pw)} iterations per side in {time.time() - t0:.0f} s; model: {args.model}")
        print(f"median step wall: plain {statistics.median(pw):.2f} ms, gpuprof {statistics.median(gw):.2f} ms"
              f"  -> wall ratio {_ratio(gw, pw):.4f} (goal <= 1.02)")
        print(f"median step CPU:  plain {statistics.median(pc):.2f} ms, gpuprof {statistics.median(gc):.2f} ms"
              f"  -> cpu ratio {_ratio(gc, pc):.4f}")


if __name__ == "__main__":
    main()
