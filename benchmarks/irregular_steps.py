"""Irregular steps, measured: a script whose steps take ~45 ms (a 40 ms sleep in get_batch and a
tiny model, so the same on any CPU) pauses in one step (a sleep after its optimizer step, where a
checkpoint or an eval would run). For each pause length, run `gpuprof diagnose` on it and check
what issue 18 asks:

- the pause is named: an irregular step whose grown phase is `other`, by about the pause;
- the typical step the report prints is the ordinary step, not the pause;
- the phase table adds up to that step (its total row) and no fix saves more than it;
- the cost the finding states (mean step − typical step, per step) against the injected one
  (pause ÷ measured steps).

Prints one line per run and exits 1 when a check fails.

    python benchmarks/irregular_steps.py                    # pauses 0.25, 0.5, 1.0 s, twice each
    python benchmarks/irregular_steps.py --pauses 1.0 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "fixtures" / "pause_train.py"


def run_once(pause_s: float, steps: int, warmup: int, folder: Path) -> dict:
    out = folder / f"pause-{pause_s}-{time.monotonic_ns()}.gpuprof.json"
    cmd = [sys.executable, "-m", "gpuprof", "diagnose", "--steps", str(steps), "--warmup", str(warmup),
           "--post-budget", "0", "--no-samplers", "--out", str(out), str(SCRIPT),
           f"--steps={steps + warmup + 2}", f"--pause_at={warmup + steps // 2}", f"--pause_s={pause_s}"]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, COLUMNS="120"), timeout=300)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        return {"ok": False, "why": f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}", "wall": wall}
    saved = json.loads(out.read_text())
    st, findings = saved["analysis"]["steps"], saved["analysis"]["findings"]
    pause = [x for x in st["irregular"] if x["phase"] == "other"]
    irr = next((f for f in findings if f["id"] == "irregular-steps"), None)
    fixes = [f for f in findings if f["kind"] == "fix" and f["saving_s"] is not None]
    text = " ".join(r.stdout.replace("│", " ").split())
    from gpuprof.units import seconds

    head = seconds(st["step_s"])
    checks = {
        "named": len(pause) == 1 and 0.8 * pause_s <= pause[0]["phase_extra_s"] <= 1.5 * pause_s,
        "typical": st["step_s"] < 0.5 * pause_s and st["step_s"] >= 0.040,
        "adds_up": bool(re.search(rf"total {re.escape(head)} 100\.0%", text)) and f"step {head} (typical" in text,
        "no_fix_above_step": all(f["saving_s"] <= st["step_s"] for f in fixes),
    }
    injected = pause_s / st["n_steps"]
    cost = irr["evidence"]["cost_per_step_s"] if irr else None
    return {"ok": all(checks.values()), "checks": checks, "step_s": st["step_s"], "n": st["n_steps"],
            "irregular": [x["index"] for x in st["irregular"]], "cost": cost, "injected": injected, "wall": wall}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pauses", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args(argv)
    failed = 0
    print(f"{'pause':>6} {'run':>3} {'typical':>9} {'irregular':>10} {'cost/step':>10} {'injected':>9} "
          f"{'ratio':>6}  checks")
    with tempfile.TemporaryDirectory(prefix="gpuprof-irregular-") as tmp:
        for pause in args.pauses:
            for i in range(args.repeats):
                r = run_once(pause, args.steps, args.warmup, Path(tmp))
                if "checks" not in r:
                    print(f"{pause:6.2f} {i + 1:3d}  FAIL {r['why']}")
                    failed += 1
                    continue
                ratio = r["cost"] / r["injected"] if r["cost"] else float("nan")
                bad = [k for k, v in r["checks"].items() if not v]
                print(f"{pause:6.2f} {i + 1:3d} {r['step_s'] * 1e3:7.1f}ms {str(r['irregular']):>10} "
                      f"{(r['cost'] or 0) * 1e3:8.1f}ms {r['injected'] * 1e3:7.1f}ms {ratio:6.2f}  "
                      + ("PASS" if r["ok"] else "FAIL " + ", ".join(bad)) + f"   ({r['wall']:.0f} s)")
                failed += not r["ok"]
    print(f"{'all passed' if not failed else f'{failed} failed'}; load average {os.getloadavg()[0]:.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
