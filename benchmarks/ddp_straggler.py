"""Is a straggler rank found, with the right size? (issue #12: within 5 points of the step)

Runs `gpuprof diagnose --nproc-per-node 2` (torchrun, gloo on this CPU) on the nanoGPT-shaped DDP
fixture (tests/fixtures/ddp_train.py) with rank 1 sleeping DELAY in every get_batch, for several
delays, and prints per run: the injected seconds per step (delay × micro-steps), the straggler
finding's rank, phase and extra seconds, and the difference as points of the step, against the
injected sleep ("vs inj") and against what the delay really cost the step ("cost": the step time
minus that of the run without delay; a sleep costs more than its argument: wake-up latency,
caches). Also a run
with no delay (what the rule says when nothing was injected) and one with sync on every
micro-step (ddp-sync-every-micro-step's saving against the extra all-reduce rounds measured).

    python benchmarks/ddp_straggler.py [--delays 0.01 0.03 0.06] [--steps 12]

--repeat N: the same straggler (rank 1, --repeat-delay per get_batch) diagnosed N times as a user
would (the default post-run budget: its fixes timed), and per run the findings in the report's
order with their savings (issue #41: the straggler first five times of five).

    python benchmarks/ddp_straggler.py --repeat 5 [--repeat-delay 0.04]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "fixtures" / "ddp_train.py"


def run(args: list[str], steps: int, data_dir: str, budget: list[str] | None = None) -> tuple[dict, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "merged.json"
        cmd = [sys.executable, "-m", "gpuprof", "diagnose", "--nproc-per-node", "2", "--steps", str(steps),
               "--warmup", "1", *(["--post-budget", "0"] if budget is None else budget), "--out", str(out),
               str(SCRIPT), f"--data_dir={data_dir}", *args]
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, PYTHONPATH=str(ROOT)))
        wall = time.monotonic() - t0
        if r.returncode != 0:
            raise SystemExit(f"run failed ({r.returncode}): {r.stderr[-2000:]}")
        return json.loads(out.read_text()), wall


def finding(prof: dict, fid: str) -> dict | None:
    """A finding of the analysis saved with the merged profile."""
    return next((f for f in prof["analysis"]["findings"] if f["id"] == fid), None)


def rank_micro_steps(prof: dict, rank: int) -> int:
    """A rank's micro-steps per step, from its own profile's steps (gpuprof.stats)."""
    from gpuprof.profile import Profile

    entry = next(e for e in prof["ranks"] if e["rank"] == rank)
    return Profile.from_dict(entry["profile"]).stats.micro_steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delays", type=float, nargs="+", default=[0.01, 0.03, 0.06])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=0, help="diagnose one straggler this many times (default budget)")
    ap.add_argument("--repeat-delay", type=float, default=0.04)
    a = ap.parse_args()
    data_dir = tempfile.mkdtemp(prefix="gpuprof-ddp-bench-")
    try:
        if a.repeat:
            _repeat(a, data_dir)
        else:
            _bench(a, data_dir)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def _repeat(a, data_dir: str) -> None:
    firsts = []
    for i in range(a.repeat):
        prof, wall = run(["--delay_rank=1", f"--delay_s={a.repeat_delay}", "--max_iters=1000"], a.steps, data_dir,
                         budget=[])
        ranked = prof["analysis"]["findings"]
        firsts.append(ranked[0]["id"] if ranked else None)
        step = prof["analysis"]["steps"]["step_s"]
        print(f"run {i + 1} ({wall:.0f} s, step {step * 1e3:.0f} ms): " + "; ".join(
            f"{f['id']}" + (f" saves {f['saving_s'] * 1e3:.0f} ms" if f.get("saving_s") else " (no saving)")
            for f in ranked[:4]), flush=True)
    first = sum(f == "straggler-rank" for f in firsts)
    print(f"summary: the straggler first in {first} of {len(firsts)} runs (rank 1 sleeps {a.repeat_delay * 1e3:.0f} ms "
          f"in every get_batch)")


def _bench(a, data_dir: str) -> None:
    print(f"{'delay':>7} {'injected':>9} {'step':>8} {'found':>16} {'reported':>9} {'vs inj':>7} "
          f"{'cost':>8} {'vs cost':>7} {'wall':>6}")
    base_step = None
    for delay in [0.0, *a.delays]:
        prof, wall = run(["--delay_rank=1", f"--delay_s={delay}"] if delay else [], a.steps, data_dir)
        f = finding(prof, "straggler-rank")
        slow = (prof["analysis"]["distributed"].get("slowest") or {})
        injected = delay * rank_micro_steps(prof, 1)
        step = slow.get("step_s") or prof["analysis"]["steps"]["step_s"]
        extra = slow.get("extra_s")
        found = f"rank {f['evidence']['rank']} {f['evidence']['phase']}" if f else "no finding"
        diff = (extra - injected) / step * 100 if extra is not None and step else float("nan")
        if base_step is None:
            base_step = step
        cost = step - base_step  # what the delay really cost the step: against the run without it
        dcost = (extra - cost) / step * 100 if extra is not None and step and delay else float("nan")
        print(f"{delay:7.3f} {injected * 1e3:7.1f}ms {step * 1e3:6.1f}ms {found:>16} "
              f"{(extra or 0) * 1e3:7.1f}ms {diff:+7.1f} {cost * 1e3:6.1f}ms {dcost:+7.1f} {wall:5.0f}s   by phase: "
              + ", ".join(f"{k} {v * 1e3:+.1f}" for k, v in (slow.get("by_phase_s") or {}).items() if abs(v) > 2e-4))
    prof, wall = run(["--sync_every_micro=True"], a.steps, data_dir)
    f = finding(prof, "ddp-sync-every-micro-step")
    comm = prof["analysis"]["distributed"]["communication"]
    print(f"sync every micro-step: finding {'found' if f else 'NOT found'}; rounds/step "
          f"{comm['rounds_per_step']:g} for {comm['micro_steps']:g} micro-steps; predicted saving "
          f"{(f or {}).get('saving_s', 0) * 1e3:.1f} ms = extra rounds' exposed "
          f"{comm['extra_rounds_exposed_s'] * 1e3:.1f} ms (in flight {comm['extra_rounds_in_flight_s'] * 1e3:.1f} ms); "
          f"busbw {comm['busbw_Bps'] / 1e6:.0f} MB/s ({wall:.0f} s)")


if __name__ == "__main__":
    main()
