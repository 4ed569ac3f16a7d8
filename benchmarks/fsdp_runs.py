"""Sharded training under gpuprof (issue #26): does every FSDP2 run finish, and is the straggler's
saving what the script gains when the slow rank is not slow?

1. `--runs N` (default 20): `gpuprof diagnose --nproc-per-node 2 --steps 4 --warmup 1` (`--steps`; post-run
   measurements on, 5 s budget: they must not run the sharded model) on tests/fixtures/fsdp_train.py,
   N times in a row, cycling through reshard_after_forward True/False × accumulation 1/2 × rank 1
   slowed or not; each run bounded by a 300 s timeout. Prints per run: exit code, wall seconds,
   both ranks' status, the top finding; then how many finished, failed and hung.
2. `--pairs K` (default 3): the straggler's predicted saving against the achieved one. Achieved:
   the fixture timed plain under torchrun (no gpuprof), rank 1 slowed (`--slow_rank=1
   --slow_s=S`) and not, in ABBA order, each the median of its printed iteration times after the
   first 3; the gain is slowed − not slowed. Predicted: `straggler-rank`'s saving in a diagnose of
   the slowed script, once per pair. Prints each pair and the ratio of the medians.

3. `--hang`: rank 1 sleeps an hour inside its second block at iteration 3; `--rank-timeout 10`.
   Prints the exit code, the seconds to exit, each rank's status and steps kept, and gpuprof's
   line naming what each rank was doing in the unfinished step.

    python benchmarks/fsdp_runs.py [--runs 20] [--pairs 3] [--slow-s 0.04] [--steps 4] [--hang]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "fixtures" / "fsdp_train.py"
ENV = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")


STEPS = 4  # measured steps per diagnose (--steps)


def diagnose(args: list[str], timeout: float = 300.0, options: tuple = ()) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "merged.json"
        cmd = [sys.executable, "-m", "gpuprof", "diagnose", "--nproc-per-node", "2", "--steps", str(STEPS), "--warmup", "1",
               "--post-budget", "5", *options, "--out", str(out), str(SCRIPT), "--max_iters=40", *args]
        t0 = time.monotonic()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
        except subprocess.TimeoutExpired:
            return {"rc": None, "wall": time.monotonic() - t0, "hung": True}
        res = {"rc": r.returncode, "wall": time.monotonic() - t0, "hung": False,
               "error_line": next((x for x in r.stderr.splitlines() if x.startswith("gpuprof: error:")), None)}
        if out.exists():
            prof = json.loads(out.read_text())
            res["status"] = {e["rank"]: e["status"] for e in prof["ranks"]}
            res["steps"] = {e["rank"]: len((e.get("profile") or {}).get("steps") or []) for e in prof["ranks"]}
            findings = prof["analysis"]["findings"]
            res["top"] = findings[0]["id"] if findings else None
            res["straggler_s"] = next((f["saving_s"] for f in findings if f["id"] == "straggler-rank"), None)
        else:
            res["stderr"] = r.stderr[-500:]
        return res


def plain(args: list[str]) -> float:
    """The median iteration time the fixture prints under plain torchrun, after its first 3."""
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(SCRIPT), "--max_iters=20", *args], capture_output=True, text=True, timeout=300, env=ENV)
    times = [float(t) / 1e3 for i, t in re.findall(r"iter (\d+): .*time ([0-9.]+)ms", r.stdout) if int(i) >= 3]
    if not times:
        raise RuntimeError(f"no iteration times: {r.stderr[-500:]}")
    return statistics.median(times)


def main() -> None:
    global STEPS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--slow-s", type=float, default=0.04)
    p.add_argument("--hang", action="store_true")
    p.add_argument("--steps", type=int, default=STEPS, help="measured steps per diagnose")
    a = p.parse_args()
    STEPS = a.steps
    if a.hang:
        r = diagnose(["--hang_rank=1", "--hang_at=3"], options=("--rank-timeout", "10"))
        print(f"hang: exit {r['rc']} after {r['wall']:.1f} s (hung: {r['hung']}); ranks {r.get('status')}, "
              f"measured steps kept {r.get('steps')}\n  {r.get('error_line')}\n", flush=True)
    variants = list(itertools.product([True, False], [1, 2], [False, True]))
    counts = {"finished": 0, "failed": 0, "hung": 0}
    straggler = {True: [0, 0], False: [0, 0]}  # slowed? -> [runs with straggler-rank first, runs]
    print(f"{'run':>3} {'reshard':>7} {'accum':>5} {'slow':>5} {'rc':>4} {'wall s':>7}  ranks        top finding")
    for i in range(a.runs):
        reshard, accum, slow = variants[i % len(variants)]
        args = [f"--reshard={reshard}", f"--gradient_accumulation_steps={accum}"]
        if slow:
            args += ["--slow_rank=1", f"--slow_s={a.slow_s}"]
        r = diagnose(args)
        kind = "hung" if r["hung"] else ("finished" if r["rc"] == 0 else "failed")
        counts[kind] += 1
        straggler[slow][0] += r.get("top") == "straggler-rank"
        straggler[slow][1] += 1
        print(f"{i + 1:>3} {str(reshard):>7} {accum:>5} {str(slow):>5} {str(r['rc']):>4} {r['wall']:>7.1f}  "
              f"{str(r.get('status')):<12} {r.get('top')}{'  ' + r.get('stderr', '') if kind == 'failed' else ''}",
              flush=True)
    print(f"\n{a.runs} runs: {counts['finished']} finished, {counts['failed']} failed, {counts['hung']} hung; "
          f"straggler-rank first in {straggler[True][0]} of {straggler[True][1]} slowed runs and in "
          f"{straggler[False][0]} of {straggler[False][1]} others\n")
    if not a.pairs:
        return
    slow_args = ["--slow_rank=1", f"--slow_s={a.slow_s}"]
    predicted, achieved = [], []
    for k in range(a.pairs):
        order = [True, False, False, True] if k % 2 == 0 else [False, True, True, False]
        t = {True: [], False: []}
        for slowed in order:
            t[slowed].append(plain(slow_args if slowed else []))
        gain = statistics.mean(t[True]) - statistics.mean(t[False])
        saving = diagnose(slow_args).get("straggler_s")
        achieved.append(gain)
        predicted.append(saving)
        print(f"pair {k + 1}: plain step slowed {statistics.mean(t[True]) * 1e3:.1f} ms, not slowed "
              f"{statistics.mean(t[False]) * 1e3:.1f} ms: achieved {gain * 1e3:.1f} ms; predicted "
              f"{'none' if saving is None else f'{saving * 1e3:.1f} ms'}"
              + (f" ({saving / gain:.2f}×)" if saving and gain > 0 else ""), flush=True)
    good = [x for x in predicted if x is not None]
    if good:
        ratio = statistics.median(good) / statistics.median(achieved)
        print(f"\nmedian predicted {statistics.median(good) * 1e3:.1f} ms / median achieved "
              f"{statistics.median(achieved) * 1e3:.1f} ms = {ratio:.2f} (bar: within 25%)")


if __name__ == "__main__":
    main()
