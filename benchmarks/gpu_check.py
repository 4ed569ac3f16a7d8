"""The GPU check: one command that validates gpuprof's CUDA paths the moment a GPU is lent.

    PYTHONPATH=. python3 benchmarks/gpu_check.py                       # every check that fits --budget
    PYTHONPATH=. python3 benchmarks/gpu_check.py --only sync-counts,nvml
    python benchmarks/gpu_check.py --cpu-smoke --report-dir /tmp/x     # the plumbing, on a CPU

Without CUDA it prints one line saying what it would check and exits 0, writing nothing. On a
GPU each check runs gpuprof in a subprocess with its own time budget (a timed-out or failed check
is reported and the others still run), reads the profile JSON it wrote, prints one line
`PASS|FAIL|SKIP <check>: <key figures>` as it finishes, and the run ends with a report in
docs/measurements/<date>-<gpu-name>.md (never overwritten: -2, -3 ...) holding the command, the
machine and software versions, and per check its commands, wall time, every figure it read
("not measured" when the profile lacks it) and the verdict with its reason.

Options:
  --only NAME[,NAME]  run only these checks (`nvml` and `gpu-spans` also run `default-diagnose`,
                      whose profile they read)
  --report-dir DIR    where the report goes (default: docs/measurements in this checkout)
  --budget SECONDS    the whole run's time limit (default 480); a check that would start with
                      less time left than it needs is SKIPped
  --cpu-smoke         run the plumbing on the CPU with tiny configs: checks that need CUDA print
                      SKIP with the reason; the others run and judge what a CPU run can show.
                      Used by tests/benchmarks/test_gpu_check.py.

Exit codes: 0 every check passed or was skipped (or there is no GPU); 1 a check failed;
2 bad arguments; 130 interrupted (the report so far is still written).

Everything the children write (profiles, generated tokens, compile caches, temp files) goes to
one temporary folder, removed at the end. Standard library only, besides gpuprof's own needs.

The modules beside it, each with one job (imported by bare name: this file puts benchmarks/ on
sys.path): gpu_check_run.py runs commands (Ctx, Proc, Check), gpu_check_checks.py and
gpu_check_checks_ranks.py are the checks, gpu_check_plan.py their run order and run_check,
gpu_check_profile.py reads profiles, gpu_check_verdicts*.py judge them (pure),
gpu_check_report.py writes the report.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python benchmarks/gpu_check.py` without PYTHONPATH=.
    sys.path.insert(1, str(REPO))
if str(REPO / "benchmarks") not in sys.path:  # the gpu_check_*.py modules beside this file
    sys.path.insert(1, str(REPO / "benchmarks"))

DEFAULT_REPORT_DIR = REPO / "docs" / "measurements"
DEFAULT_BUDGET_S = 480.0  # the device tool allows 600 s per call: keep a margin for start-up

from gpu_check_plan import CHECKS, run_check  # noqa: E402
from gpu_check_report import describe, device_facts, render_report, scrubber, write_report  # noqa: E402
from gpu_check_run import Check, Ctx, child_env  # noqa: E402

# Read through this module by tests/benchmarks/test_gpu_check.py (`gc.judge_nvml`, ...).
from gpu_check_plan import Spec  # noqa: E402,F401
from gpu_check_profile import lookup  # noqa: E402,F401
from gpu_check_report import report_path, slugify  # noqa: E402,F401
from gpu_check_run import Proc  # noqa: E402,F401
from gpu_check_verdicts import (judge_compute_fixes, judge_cpu_run, judge_cudagraphs,  # noqa: E402,F401
                                judge_gpu_run, judge_gpu_spans, judge_tf32)
from gpu_check_verdicts_meters import (NVML_FIELDS, data_share_truth, judge_data_share,  # noqa: E402,F401
                                       judge_h2d, judge_nvml, judge_overhead, judge_syncs, normalize_uuid,
                                       parse_overhead)
from gpu_check_verdicts_ranks import judge_fsdp, judge_interrupted_rank, judge_nccl  # noqa: E402,F401


# ---------------------------------------------------------------------------------------- main
def parse_args(argv):
    ap = argparse.ArgumentParser(description="Validate gpuprof's CUDA paths on this GPU (see the module docstring).")
    ap.add_argument("--only", help="comma-separated check names: " + ", ".join(s.name for s in CHECKS))
    ap.add_argument("--report-dir", type=Path, default=DEFAULT_REPORT_DIR)
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds for the whole run")
    ap.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    names = [s.name for s in CHECKS]
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            ap.error(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(names)}")
        if {"nvml", "gpu-spans"} & set(wanted) and "default-diagnose" not in wanted:
            wanted.append("default-diagnose")  # nvml and gpu-spans read its profile
        args.selected = [n for n in names if n in wanted]
    else:
        args.selected = names
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not args.cpu_smoke and not torch.cuda.is_available():
        print("gpu_check: needs a CUDA GPU (torch.cuda.is_available() is False here); on one it checks "
              + ", ".join(args.selected) + " (see benchmarks/gpu_check.py); nothing run, nothing written")
        return 0
    t0 = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="gpuprof-gpu-check-"))
    checks: list[Check] = []
    interrupted = False
    env = child_env(tmp)
    if args.cpu_smoke:
        # One intra-op thread for the CPU children (as the suite's tests/conftest.py): on a shared
        # 2-core machine torch's two OpenMP threads stall each other whenever another process
        # takes a core (here, with other jobs running, the smoke's event-overhead child took 52 s, and
        # 20 s on one thread). The smoke checks plumbing, not figures; a GPU run's children keep
        # torch's default.
        env["OMP_NUM_THREADS"] = "1"
    ctx = Ctx(tmp=tmp, smoke=args.cpu_smoke, deadline=t0 + args.budget, env=env)
    meta: dict = {"title": "CPU smoke" if args.cpu_smoke else "GPU", "budget_s": args.budget}
    scrub = scrubber(tmp)
    try:
        meta = describe(ctx, torch.__version__, None if args.cpu_smoke else device_facts(ctx), args.budget)
        print(f"gpu_check: {meta['title']}: {len(args.selected)} checks, budget {args.budget:.0f} s", flush=True)
        for spec in CHECKS:
            if spec.name in args.selected:
                c = run_check(ctx, spec)
                checks.append(c)
                print(scrub(c.line()), flush=True)
    except KeyboardInterrupt:
        interrupted = True
        meta.setdefault("note", "interrupted (Ctrl-C): the checks after the last one listed did not run")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total = time.monotonic() - t0
    meta["scrub"] = scrub
    day = datetime.now().strftime("%Y-%m-%d")
    path = write_report(args.report_dir, day, "cpu-smoke" if args.cpu_smoke else ctx.gpu_name,
                        render_report(meta, checks, total))
    print(f"gpu_check: report written to {path} ({total:.0f} s)")
    if interrupted:
        return 130
    return 1 if any(c.status == "FAIL" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
