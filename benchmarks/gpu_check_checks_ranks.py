"""gpu_check's checks of data parallel runs on one GPU: one DDP rank and one FSDP2 rank launched
by `gpuprof diagnose --nproc-per-node 1` on NCCL, and the DDP rank interrupted mid-run."""

from __future__ import annotations

import json
import signal
import sys

from gpu_check_profile import Missing, lookup
from gpu_check_run import REPO, Check, Ctx, _ran
from gpu_check_verdicts_ranks import judge_fsdp, judge_interrupted_rank, judge_nccl, rank_entry

DDP_FIXTURE = REPO / "tests" / "fixtures" / "ddp_train.py"


def check_nccl(ctx: Ctx) -> Check:
    c = Check("nccl-one-rank")
    if ctx.smoke:
        return c.skip("needs CUDA: NCCL runs on GPUs only (the suite runs the same launcher on gloo)")
    script = [str(DDP_FIXTURE), "--backend=nccl", "--device_kind=cuda", f"--data_dir={ctx.tmp / 'ddp'}",
              "--max_iters=200"]
    proc, prof = ctx.diagnose("nccl", ["--nproc-per-node", "1", "--steps", "5", "--warmup", "2"], script,
                              budget_s=120)
    if not _ran(c, proc, prof):
        return c
    e = rank_entry(prof) or {}
    for k in ("backend", "clock", "measured_steps", "rounds_per_step", "buckets_per_round", "bytes_per_round",
              "in_flight_s", "exposed_s", "algbw_Bps", "busbw_Bps", "busbw_note", "incomplete_rounds",
              "mark_errors", "link"):
        c.figures[f"comm.{k}"] = lookup(e.get("profile") or {}, f"measurements.comm.{k}")
    c.figures["rank 0 nccl_env"] = e.get("nccl_env") or Missing("key missing: nccl_env")
    ok, why = judge_nccl(prof)
    if not ok:
        return c.decide(False, why)
    # Ctrl-C mid-run: the rank's entry is still written, within a bound.
    out = ctx.tmp / "nccl-interrupted.json"
    argv = [sys.executable, "-m", "gpuprof", "diagnose", "--nproc-per-node", "1", "--steps", "100000",
            "--warmup", "1", "--post-budget", "0", "--out", str(out), *script[:-1], "--max_iters=1000000"]
    run, after = ctx.run_until(argv, "iter 5:", signal.SIGINT, 120)
    c.runs.append(run)
    try:
        stopped = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stopped = None
    c.figures["interrupted: exit code"] = run.rc
    c.figures["interrupted: seconds from SIGINT to exit"] = after if after is not None else Missing("no `iter 5:` line")
    if after is None:
        return c.decide(False, f"{why}; but the interrupted run never printed `iter 5:` (exit {run.rc})")
    ok2, why2 = judge_interrupted_rank(stopped, run.rc, after)
    return c.decide(ok2, f"{why}; {why2}")


FSDP_FIXTURE = REPO / "tests" / "fixtures" / "fsdp_train.py"


def check_fsdp(ctx: Ctx) -> Check:
    c = Check("fsdp-one-rank")
    if ctx.smoke:
        return c.skip("needs CUDA: the gloo runs of the same script are in the suite (tests/distributed/test_fsdp.py)")
    proc, prof = ctx.diagnose("fsdp", ["--nproc-per-node", "1", "--steps", "5", "--warmup", "2", "--post-budget", "10"],
                              [str(FSDP_FIXTURE), "--backend=nccl", "--device_kind=cuda", "--max_iters=40"], budget_s=120)
    if not _ran(c, proc, prof):
        return c
    e = rank_entry(prof) or {}
    for k in ("measurements.sharding", "measurements.collectives", "measurements.microbatch.not_measured",
              "analysis.steps.timeline"):
        c.figures[k] = lookup(e.get("profile") or {}, k)
    return c.decide(*judge_fsdp(prof))
