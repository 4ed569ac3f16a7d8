"""What a torchrun launch costs before a rank trains (issue #44: the suite's many-process tests
are mostly interpreter and torch start-ups): torch.distributed.run's main() in a process that has
already imported torch (as gpuprof's parent has), launching 2 gloo ranks of a tiny DDP script
(init_process_group, a Linear under DDP, AdamW, 5 steps), its ranks started two ways, alternating:

    subprocess  as torchrun runs a script: a fresh interpreter per rank (imports torch again)
    fork        `--run-path --start-method fork`: the ranks fork from the launching process

Per launch: the wall time of main() and the CPU seconds of the launching process and of its
children (the ranks). A measurement for the suite's design, not something gpuprof does: its
launcher starts ranks as torchrun runs a script.

    python benchmarks/launch_cost.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import resource
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    opt = torch.optim.AdamW(m.parameters())
    for _ in range(5):
        m(torch.randn(8, 64)).sum().backward(); opt.step(); opt.zero_grad()
    dist.destroy_process_group()
""")

ONE = textwrap.dedent("""
    import resource, sys, time
    import torch, torch.distributed.run as run
    way, port, script = sys.argv[1:4]
    args = ["--nproc-per-node", "2", "--master-port", port]
    if way == "fork":
        args += ["--run-path", "--start-method", "fork"]
    t = time.perf_counter()
    run.main(args + [script])
    wall = time.perf_counter() - t
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"RESULT {wall:.3f} {s.ru_utime + s.ru_stime:.2f} {c.ru_utime + c.ru_stime:.2f}")
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(SCRIPT)
        for _ in range(a.rounds):
            for way in ("subprocess", "fork", "fork", "subprocess"):
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                r = subprocess.run([sys.executable, "-c", ONE, way, str(free_port()), str(script)],
                                   capture_output=True, text=True, timeout=300)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
                if r.returncode != 0 or line is None:
                    print(f"{way}: exit {r.returncode}: {r.stderr[-500:]}")
                    return 1
                wall, own, ranks = map(float, line.split()[1:])
                total = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
                print(f"{way:10s} launch {wall:5.2f} s wall; CPU: launcher {own:4.1f} s (its torch import included), "
                      f"ranks {ranks:4.1f} s; the whole process {total:4.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
