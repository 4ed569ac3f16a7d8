"""Where attach's cost on a target comes from: variants of the attach, each against the window
just before it, in turn on one target (ABAB...), so the machine's drift falls on all alike.

Variants (a 10-s window each, by default):
  full      `python -m gpuprof attach PID` as a user runs it
  eager     the same without the low priority (gpuprof.cli.main called directly: no
            gpuprof.console, every verb imported)
  rate100   `--rate 100`
  nopoll    attach with its 5-a-second polling of the target's /proc files turned off
  pyspy     py-spy alone, at 200/s, non-blocking, as attach runs it
  pyspybatch  the same under SCHED_BATCH (no wake-up preemption of the target's threads)
  sleep     nothing attached: the noise between two windows of one target
  spin19    a process that only spins, at niceness 19: what any work at the lowest priority costs

The differences between variants are often smaller than that noise (±3-4% between two windows
here): the CPU each part uses is the firmer figure (see docs/attach.md).

    python benchmarks/attach_cost_sources.py [--variants full,eager,pyspy,sleep] [--rounds 3] [--window 10]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET = REPO / "tests" / "fixtures" / "attach_target.py"
LINE = re.compile(r"^iter (\d+): time ([0-9.]+) ms")


def commands(pid: int, window: float, out: str) -> dict[str, list[str]]:
    attach = ["attach", str(pid), "--duration", str(window), "--json"]
    py = sys.executable
    return {
        "full": [py, "-m", "gpuprof", *attach],
        "eager": [py, "-c", f"from gpuprof.cli import main; main({attach!r})"],
        "rate100": [py, "-m", "gpuprof", *attach, "--rate", "100"],
        "nopoll": [py, "-c", "from gpuprof.attach.gentle import be_gentle; be_gentle()\n"
                   "import gpuprof.attach.process as p; p.ProcessWatch.poll = lambda self: None\n"
                   f"from gpuprof.cli import main; main({attach!r}, only='attach')"],
        "pyspy": ["py-spy", "record", "--pid", str(pid), "--rate", "200", "--nonblocking", "--idle",
                  "--format", "speedscope", "-o", out, "--duration", str(int(window))],
        "pyspybatch": ["chrt", "--batch", "0", "py-spy", "record", "--pid", str(pid), "--rate", "200", "--nonblocking",
                       "--idle", "--format", "speedscope", "-o", out, "--duration", str(int(window))],
        "sleep": [py, "-c", f"import time; time.sleep({window})"],
        "spin19": ["nice", "-n", "19", py, "-c",
                   f"import time\nt = time.monotonic()\nwhile time.monotonic() - t < {window}: pass"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="full,eager,pyspy,sleep")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--hidden", type=int, default=512)
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    target = subprocess.Popen([sys.executable, str(TARGET), "--data_s", "0.025", "--accum", "4", "--threads", "2",
                               "--hidden", str(args.hidden)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)
    lines: list[tuple[float, float]] = []

    def read():
        for line in target.stdout:
            m = LINE.match(line)
            if m:
                lines.append((time.monotonic(), float(m.group(2))))

    threading.Thread(target=read, daemon=True).start()
    folder = tempfile.mkdtemp(prefix="gpuprof-bench-")
    cmds = commands(target.pid, args.window, os.path.join(folder, "stacks.json"))
    unknown = [v for v in variants if v not in cmds]
    if unknown:
        target.kill()
        raise SystemExit(f"unknown variant(s) {unknown}: choose from {list(cmds)}")
    res: dict[str, list[float]] = {v: [] for v in variants}
    try:
        time.sleep(6)
        for _ in range(args.rounds):
            for v in variants:
                t0 = time.monotonic()
                time.sleep(args.window)
                t1 = time.monotonic()
                subprocess.run(cmds[v], capture_output=True, text=True, cwd=REPO, timeout=args.window + 300)
                t2 = time.monotonic()
                off = [ms for at, ms in lines if t0 < at <= t1]
                on = [ms for at, ms in lines if t1 < at <= t2]
                ratio = statistics.median(on) / statistics.median(off)
                res[v].append(ratio)
                print(f"{v:8s} before {statistics.median(off):6.1f} ms, during {statistics.median(on):6.1f} ms "
                      f"({t2 - t1:4.1f} s): {ratio:.3f}", flush=True)
    finally:
        target.kill()
        target.wait()
        for f in os.listdir(folder):
            os.remove(os.path.join(folder, f))
        os.rmdir(folder)
    for v in variants:
        print(f"summary {v}: median {statistics.median(res[v]):.3f} ({', '.join(f'{x:.3f}' for x in res[v])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
