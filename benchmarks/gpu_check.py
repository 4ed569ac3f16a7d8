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
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python benchmarks/gpu_check.py` without PYTHONPATH=.
    sys.path.insert(1, str(REPO))
if str(REPO / "benchmarks") not in sys.path:  # the verdicts module beside this file
    sys.path.insert(1, str(REPO / "benchmarks"))

FIXTURE = REPO / "tests" / "fixtures" / "nanogpt_train.py"
MINGPT = REPO / "tests" / "fixtures" / "mingpt_train.py"
SCRIPTS = REPO / "benchmarks" / "gpu_scripts"
DEFAULT_REPORT_DIR = REPO / "docs" / "measurements"
DEFAULT_BUDGET_S = 480.0  # the device tool allows 600 s per call: keep a margin for start-up

from gpu_check_verdicts import *  # noqa: E402,F401,F403 - thresholds, profile readers, judges
from gpu_check_verdicts import TAIL_CHARS, _cell  # noqa: E402


# ------------------------------------------------------------------------------- the report
def scrubber(tmp: Path) -> Callable[[str], str]:
    """Text for the report: the temp folder as $TMP (it is gone by then), checkout paths relative."""
    def scrub(text: str) -> str:
        return str(text).replace(str(tmp), "$TMP").replace(str(REPO) + os.sep, "")
    return scrub


def show(argv: list[str]) -> str:
    """A command line as run, with this interpreter written `python`."""
    return shlex.join(["python" if a == sys.executable else a for a in argv])


def render_report(meta: dict, checks: list[Check], total_s: float) -> str:
    """The markdown report: header, one table row per check, then each check's commands and figures."""
    scrub = meta.get("scrub") or str
    counts = {s: sum(c.status == s for c in checks) for s in ("PASS", "FAIL", "SKIP")}
    out = [f"# gpuprof GPU check: {meta['title']}", ""]
    for key in ("command", "date", "host", "gpu", "software", "note"):
        if meta.get(key):
            out.append(f"- {key}: {meta[key]}")
    out.append(f"- result: {counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP "
               f"in {total_s:.1f} s (budget {meta.get('budget_s', 0):.0f} s)")
    out += ["", "| check | result | wall | reason |", "|---|---|---|---|"]
    out += [f"| {c.name} | {c.status} | {c.wall_s:.1f} s | {_cell(scrub(c.reason))} |" for c in checks]
    for c in checks:
        out += ["", f"## {c.name}: {c.status}", "", f"{CHECK_WHAT.get(c.name, '')}", "",
                f"Reason: {scrub(c.reason)}", ""]
        if c.runs:
            out += ["| command | wall | exit |", "|---|---|---|"]
            for r in c.runs:
                end = f"timed out after {r.timeout_s:.0f} s" if r.timed_out else str(r.rc)
                out.append(f"| `{_cell(scrub(show(r.argv)))}` | {r.wall_s:.1f} s | {end} |")
            out.append("")
        if c.figures:
            out += ["| figure | value |", "|---|---|"]
            out += [f"| {_cell(k)} | {_cell(scrub(fmt(v)))} |" for k, v in c.figures.items()]
            out.append("")
        if c.status == "FAIL":  # the output of the runs that failed; of all runs when the verdict did
            broken = [r for r in c.runs if r.timed_out or r.rc != 0] or c.runs
            for r in broken:
                out += [f"Output tail of `{_cell(scrub(show(r.argv)))}`:", "", "```text",
                        scrub(r.tail(TAIL_CHARS if len(broken) == 1 else TAIL_CHARS // 2)).rstrip(), "```", ""]
        if c.error:
            out += ["The check itself raised:", "", "```text", c.error.rstrip(), "```", ""]
    return "\n".join(out).rstrip() + "\n"


# ------------------------------------------------------------------------- running the checks
@dataclass
class Ctx:
    """What every check needs: where to run, the time left, the GPU's identity, shared results."""

    tmp: Path
    smoke: bool
    deadline: float  # time.monotonic() by which the whole run must end
    env: dict
    gpu_name: str | None = None
    torch_uuid: str | None = None
    profiles: dict = field(default_factory=dict)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, argv: list[str], budget_s: float) -> Proc:
        """argv from the checkout in a process group of its own, killed with its children at the
        timeout. Output goes to a file, not a pipe: a killed run's output is still there."""
        timeout = max(1.0, min(budget_s, self.left()))
        logs = self.tmp / "logs"
        logs.mkdir(exist_ok=True)
        log = logs / f"{len(list(logs.iterdir()))}.log"
        t0 = time.monotonic()
        timed_out = False
        with open(log, "w+", encoding="utf-8", errors="replace") as f:
            proc = subprocess.Popen(argv, cwd=REPO, env=self.env, stdin=subprocess.DEVNULL, stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:  # also on Ctrl-C; and after a normal exit, whatever it left running
                _kill_group(proc)
                proc.wait()
            wall = time.monotonic() - t0
            f.seek(0)
            out = f.read()
        return Proc(argv, proc.returncode, out, wall, timed_out, timeout)

    def run_until(self, argv: list[str], line_prefix: str, sig: int, budget_s: float) -> tuple[Proc, float | None]:
        """argv in a process group of its own; when a line starting with `line_prefix` appears, `sig`
        goes to the whole group (as a terminal's Ctrl-C). The run, and the seconds from the signal
        to its exit (None when the line never came)."""
        timeout = max(1.0, min(budget_s, self.left()))
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, cwd=REPO, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        lines, after, timed_out = [], None, False
        try:
            for line in proc.stdout:  # a hang here ends at the kill below (the budget's timer)
                lines.append(line)
                if line.startswith(line_prefix):
                    signalled = time.monotonic()
                    os.killpg(proc.pid, sig)
                    rest, _ = proc.communicate(timeout=max(1.0, timeout - (signalled - t0)))
                    lines.append(rest or "")
                    after = time.monotonic() - signalled
                    break
                if time.monotonic() - t0 > timeout:
                    timed_out = True
                    break
            else:
                proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc)
            proc.wait()
        return Proc(argv, proc.returncode, "".join(lines), time.monotonic() - t0, timed_out, timeout), after

    def diagnose(self, label: str, options: list[str], script: list[str] | None = None,
                 budget_s: float = 120.0) -> tuple[Proc, dict | None]:
        """`python -m gpuprof diagnose OPTIONS --out X [SCRIPT ARGS]` and the profile it wrote."""
        out = self.tmp / f"{label}.json"
        argv = [sys.executable, "-m", "gpuprof", "diagnose", *options, "--out", str(out), *(script or [])]
        proc = self.run(argv, budget_s)
        try:
            prof = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            prof = None
        return proc, prof if isinstance(prof, dict) else None


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group: the child and what it started (compile workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group is already gone
        pass
    except (PermissionError, AttributeError, OSError):
        if proc.poll() is None:
            proc.kill()


def _ran(c: Check, proc: Proc, prof: dict | None) -> bool:
    """Record the run; False (and a FAIL) when it timed out, failed or wrote no profile."""
    c.runs.append(proc)
    if proc.timed_out:
        c.decide(False, f"timed out after {proc.timeout_s:.0f} s")
    elif proc.rc != 0:
        c.decide(False, f"exit code {proc.rc}" + (" (profile written)" if prof is not None else ""))
    elif prof is None:
        c.decide(False, "exit code 0 but no profile written")
    else:
        return True
    return False


def check_default_diagnose(ctx: Ctx) -> Check:
    c = Check("default-diagnose")
    proc, prof = ctx.diagnose("default", SMOKE_BUILTIN if ctx.smoke else [], budget_s=150)
    if not _ran(c, proc, prof):
        return c
    ctx.profiles["default"] = prof
    c.figures = run_figures(prof)
    return c.decide(*(judge_cpu_run(prof) if ctx.smoke else judge_gpu_run(prof)))


def check_compiled(ctx: Ctx) -> Check:
    c = Check("compiled")
    if ctx.smoke:
        return c.skip("needs CUDA: torch.compile of GPT-2 takes minutes on a small CPU")
    opts = ["--batch-size", "16", "--block-size", "1024", "--grad-accum", "8", "--dtype", "bf16", "--compile",
            "--steps", "5", "--warmup", "3"]
    proc, prof = ctx.diagnose("compiled", opts, budget_s=300)
    if not _ran(c, proc, prof):
        return c
    c.figures = run_figures(prof)
    return c.decide(*judge_gpu_run(prof))


def _token_dir(ctx: Ctx) -> Path:
    """train.bin/val.bin of random uint16 tokens below the fixture's vocab_size 256."""
    d = ctx.tmp / "tokens"
    if not d.exists():
        import numpy as np

        d.mkdir()
        rng = np.random.default_rng(0)
        for split in ("train", "val"):
            rng.integers(0, 256, 100_000, dtype=np.uint16).tofile(d / f"{split}.bin")
    return d


def _fixture_args(ctx: Ctx, *extra: str) -> list[str]:
    return [str(FIXTURE), f"--data_dir={_token_dir(ctx)}", f"--out_dir={ctx.tmp / 'out'}", "--max_iters=100",
            *extra]


def check_nanogpt_data_delay(ctx: Ctx) -> Check:
    c = Check("nanogpt-data-delay")
    if ctx.smoke:
        opts, dev = ["--steps", "3", "--warmup", "1", "--no-samplers"], ["--device=cpu", "--threads=1"]
    else:
        opts, dev = ["--steps", "6", "--warmup", "1"], ["--device=cuda", "--dtype=bfloat16"]
    script = _fixture_args(ctx, *dev, "--data_delay=0.02", *FIXTURE_MODEL)
    proc, prof = ctx.diagnose("data-delay", opts, script, budget_s=90)
    if not _ran(c, proc, prof):
        return c
    truth = data_share_truth(proc.output, [s.get("index") for s in prof.get("steps") or []])
    c.figures = {k: lookup(prof, k) for k in ("analysis.steps.timeline", "analysis.steps.step_s", "analysis.steps.phases.data.seconds",
                                              "analysis.steps.phases.data.share", "measurements.timer.gpu_timeline")}
    for k in ("truth", "lines", "slept_ms_per_iter", "time_ms_per_iter"):
        c.figures[f"injected: {k}"] = truth.get(k) if truth else Missing("no iter line with `slept`")
    c.figures["findings"] = ", ".join(finding_ids(prof)) or "none"
    return c.decide(*judge_data_share(prof, truth, SMOKE_DATA_SHARE_TOLERANCE if ctx.smoke else DATA_SHARE_TOLERANCE))


def check_fp32_tf32(ctx: Ctx) -> Check:
    c = Check("fp32-tf32")
    if ctx.smoke:
        return c.skip("needs CUDA: TF32 is a CUDA matmul mode")
    from gpuprof.hardware import find_gpu, peak_for

    spec = find_gpu(ctx.gpu_name)
    used, tf32_peak = peak_for(spec, "fp32", tf32_allowed=True)
    proc, prof = ctx.diagnose("fp32", ["--steps", "3", "--warmup", "1"],
                              _fixture_args(ctx, "--device=cuda", "--dtype=float32"), budget_s=90)
    if not _ran(c, proc, prof):
        return c
    gpu = spec.name if spec else "unknown GPU"
    c.figures = {"expected peak (gpuprof.hardware)": f"{used} {tf32_peak} TFLOP/s ({gpu})"}
    c.figures.update({k: lookup(prof, k) for k in (
        "run.config.dtype", "run.config.precision", "analysis.mfu.dtype", "analysis.mfu.peak_tflops",
        "analysis.mfu.mfu", "analysis.mfu.warnings", "measurements.probe.dtype", "measurements.probe.tflops",
        "measurements.probe.tf32_during_probe")})
    c.figures["findings"] = ", ".join(finding_ids(prof)) or "none"
    ok, why = judge_tf32(prof, tf32_peak)
    if not ok and "allow_tf32" not in FIXTURE.read_text(encoding="utf-8"):
        why += " (the fixture does not set torch.backends.cuda.matmul.allow_tf32 yet)"
    return c.decide(ok, why)


def check_sync_counts(ctx: Ctx) -> Check:
    c = Check("sync-counts")
    if ctx.smoke:
        return c.skip("needs CUDA: gpuprof counts syncs on CUDA only")
    script = [str(SCRIPTS / "sync_counts.py"), "--device=cuda", f"--k={SYNC_K}", f"--j={SYNC_J}", "--eval_items=5"]
    proc, prof = ctx.diagnose("syncs", ["--steps", "5", "--warmup", "2"], script, budget_s=90)
    if not _ran(c, proc, prof):
        return c
    c.figures = {"expected": f"{SYNC_K} .item() + {SYNC_J} torch.cuda.synchronize per step; 5 .item() in warmup"}
    c.figures.update({k: lookup(prof, k) for k in (
        "measurements.syncs.per_step", "measurements.syncs.measured_steps", "measurements.syncs.calls",
        "measurements.syncs.per_phase", "measurements.syncs.warmup_total", "measurements.syncs.in_copies_per_step",
        "measurements.syncs.method")})
    c.figures["findings"] = ", ".join(finding_ids(prof)) or "none"
    return c.decide(*judge_syncs(prof))


def check_h2d_pageable(ctx: Ctx) -> Check:
    c = Check("h2d-pageable")
    if ctx.smoke:
        return c.skip("needs CUDA: no host-to-device copies on a CPU")
    runs = {}
    for pinned in (False, True):
        label = "pinned" if pinned else "pageable"
        proc, prof = ctx.diagnose(label, ["--steps", "5", "--warmup", "2"],
                                  [str(SCRIPTS / "h2d_copies.py"), "--device=cuda", f"--pinned={pinned}"], budget_s=75)
        if not _ran(c, proc, prof):
            c.reason = f"{label} run: {c.reason}"
            return c
        runs[label] = prof
        for k in ("analysis.steps.step_s", "analysis.steps.phases.h2d.share", "analysis.steps.phases.h2d.seconds",
                  "measurements.script.hooks.counts", "measurements.syncs.per_step",
                  "measurements.syncs.in_copies_per_step", "measurements.copies"):
            c.figures[f"{label}: {k}"] = lookup(prof, k)
        c.figures[f"{label}: findings"] = ", ".join(finding_ids(prof)) or "none"
        h2d = [f for f in findings(prof) if f.get("id") == "h2d-pageable"]
        if h2d:
            c.figures[f"{label}: h2d-pageable saving_s / evidence"] = {"saving_s": h2d[0].get("saving_s"),
                                                                        "evidence": h2d[0].get("evidence")}
    return c.decide(*judge_h2d(runs["pageable"], runs["pinned"]))


def _default_profile(ctx: Ctx, c: Check, smoke_why: str) -> dict | None:
    """The default-diagnose run's profile for a check that reads it; None after deciding `c`
    (SKIP on the CPU smoke run, FAIL when that run wrote none)."""
    if ctx.smoke:
        c.skip(smoke_why)
        return None
    prof = ctx.profiles.get("default")
    if prof is None:
        c.decide(False, "no profile from default-diagnose to read")
    return prof


def check_nvml(ctx: Ctx) -> Check:
    c = Check("nvml")
    prof = _default_profile(ctx, c, "needs CUDA: NVML samples only a CUDA run")
    if prof is None:
        return c
    nv = lookup(prof, "measurements.nvml")
    if isinstance(nv, dict):
        gpu = (nv.get("gpus") or [{}])[0]
        c.figures = {"torch device 0 uuid": ctx.torch_uuid or Missing("torch gave none")}
        for k in ("available", "reason", "samples", "interval_s", "late_ticks", "errors", "unreadable",
                  "field_errors", "cost", "throttle_share"):
            c.figures[k] = lookup(nv, k)
        for k in ("name", "uuid", "via", "memory_total_bytes", "sm_clock_max_mhz", "power_limit_w"):
            c.figures[f"gpus[0].{k}"] = lookup(gpu, k)
        for k in NVML_FIELDS:
            s = lookup(nv, f"summary.{k}")
            c.figures[f"summary.{k}"] = s if isinstance(s, Missing) else (
                {x: s.get(x) for x in ("mean", "min", "max", "n")} if isinstance(s, dict) else s)
    else:
        c.figures = {"measurements.nvml": nv}
    return c.decide(*judge_nvml(prof, ctx.torch_uuid))


def check_cuda_scenarios(ctx: Ctx) -> Check:
    c = Check("cuda-scenarios")
    from gpuprof import scenarios

    found = scenarios.discover(REPO / "scenarios")
    names = [s.name for s in found if s.kind == "run" and str(s.device).startswith("cuda")]
    listing = ctx.run([sys.executable, "-m", "gpuprof", "scenario", "list"], 60)
    c.runs.append(listing)
    c.figures["cuda scenarios"] = ", ".join(names) or "none"
    if listing.rc != 0 or listing.timed_out:
        return c.decide(False, f"`scenario list` exit {listing.rc}" + (" (timed out)" if listing.timed_out else ""))
    unlisted = [n for n in names if n not in listing.output]
    if unlisted:
        return c.decide(False, f"`scenario list` does not show {', '.join(unlisted)}")
    if ctx.smoke:
        return c.skip(f"needs CUDA: would run {', '.join(names)}")
    failed = []
    for name in names:
        proc = ctx.run([sys.executable, "-m", "gpuprof", "scenario", "run", name], 150)
        c.runs.append(proc)
        marks = [ln.strip() for ln in proc.output.splitlines() if ln.strip().startswith(("✓", "✗"))]
        verdict = "MISMATCH" if "MISMATCH" in proc.output else "MATCH" if "MATCH" in proc.output else None
        c.figures[name] = (f"exit {proc.rc}, {verdict or 'no verdict'}, {proc.wall_s:.1f} s"
                           + (" (timed out)" if proc.timed_out else "") + ("; " + "; ".join(marks) if marks else ""))
        if proc.timed_out or proc.rc != 0 or verdict != "MATCH":
            failed.append(name if verdict or proc.rc else f"{name} (skipped?)")
    if failed:
        return c.decide(False, f"did not match: {', '.join(failed)}")
    return c.decide(True, f"{len(names)} MATCH: {', '.join(names)}")


def check_event_overhead(ctx: Ctx) -> Check:
    c = Check("event-overhead")
    if ctx.smoke:
        plan = {"small": ["--device", "cpu", "--config", "small", "--rounds", "2", "--steps", "5"]}
    else:  # the tiny preset (the CPU default) and the README's worst case: steps that are all overhead
        plan = {cfg: ["--device", "cuda", "--config", cfg, "--rounds", "4", "--steps", "30"]
                for cfg in ("default", "small")}
    results = {}
    for cfg, opts in plan.items():
        proc = ctx.run([sys.executable, str(REPO / "benchmarks" / "timing_overhead.py"), *opts], 60)
        c.runs.append(proc)
        if proc.timed_out or proc.rc != 0:
            return c.decide(False, f"{cfg}: " + (f"timed out after {proc.timeout_s:.0f} s" if proc.timed_out
                                                 else f"exit code {proc.rc}"))
        results[cfg] = parse_overhead(proc.output)
        for k, v in (results[cfg] or {"figures": Missing("no summary line")}).items():
            c.figures[f"{cfg}: {k}"] = v
    if ctx.smoke and all(results.values()):
        r = results["small"]
        return c.decide(True, f"cpu smoke: median on/off ratio {r['median_ratio']:.3f} over {len(r['pair_ratios'])} "
                              "pairs, read but not judged (judged on CUDA only)")
    return c.decide(*judge_overhead(results))


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


def check_cudagraphs(ctx: Ctx) -> Check:
    c = Check("cudagraphs")
    if ctx.smoke:
        return c.skip("needs CUDA: torch.compile(mode='reduce-overhead') records CUDA graphs")
    opts = ["--compile-mode", "reduce-overhead", "--n-layer", "4", "--batch-size", "8", "--block-size", "512",
            "--grad-accum", "2", "--steps", "5", "--warmup", "3"]
    proc, prof = ctx.diagnose("cudagraphs", opts, budget_s=240)
    if not _ran(c, proc, prof):
        return c
    c.figures = run_figures(prof)
    for k in ("measurements.timer", "measurements.syncs.per_step", "measurements.syncs.calls",
              "measurements.syncs.torch_own_in_steps", "measurements.syncs.torch_own_places"):
        c.figures[k] = lookup(prof, k)
    return c.decide(*judge_cudagraphs(prof))


def check_gpu_spans(ctx: Ctx) -> Check:
    c = Check("gpu-spans")
    prof = _default_profile(ctx, c, "needs CUDA: the GPU timeline comes from CUDA events")
    if prof is None:
        return c
    steps = prof.get("steps") or []
    c.figures = {"steps": len(steps), "first step gpu_spans": ((steps[0].get("extra") or {}).get("gpu_spans")
                                                               if steps else Missing("no steps"))}
    return c.decide(*judge_gpu_spans(prof))


def check_compute_fixes(ctx: Ctx) -> Check:
    c = Check("compute-fixes")
    if ctx.smoke:  # the same script on the CPU runs in the suite (tests/compute/test_compute_fixes_run.py)
        return c.skip("needs CUDA: the CPU run of this script is in the test suite")
    # GPT-2 124M's widths, 4 layers, bf16 autocast
    opts = ["--steps", "4", "--warmup", "2", "--post-budget", "40"]
    model = ["--device", "cuda", "--dtype", "bf16", "--block", "1024", "--n-embd", "768", "--n-head", "12",
             "--n-layer", "4", "--batch", "8"]
    script = [str(MINGPT), "--attn", "hand", "--vocab", "50257", "--fused", "0", "--dropout", "0.0",
              "--steps", "20", *model]
    proc, prof = ctx.diagnose("compute-fixes", opts, script, budget_s=150)
    if not _ran(c, proc, prof):
        return c
    c.figures = {k: lookup(prof, k) for k in ("analysis.steps.step_s", "measurements.kernels.attention.by_hand",
                                              "measurements.kernels.attention.timing", "measurements.kernels.vocab",
                                              "measurements.kernels.optimizer", "measurements.post_run.parts.kernels")}
    c.figures["findings"] = ", ".join(finding_ids(prof)) or "none"
    return c.decide(*judge_compute_fixes(prof, on_cuda=True))


@dataclass(frozen=True)
class Spec:
    name: str
    fn: Callable[[Ctx], Check]
    min_s: float  # the least time left worth starting it with
    what: str


# Run order: the default run first (nvml reads its profile), the slow compiled run last so that
# a long compile can only cost itself.
CHECKS = [
    Spec("default-diagnose", check_default_diagnose, 40,
         "`gpuprof diagnose` with the CUDA defaults (GPT-2 124M, bf16): step time, phases on the GPU "
         "timeline, true MFU, and the bf16 matmul ceiling at 50-100% of the datasheet peak."),
    Spec("nvml", check_nvml, 0,
         "From the default run's profile: NVML available, every field sampled or named unreadable, and the "
         "sampled GPU's UUID equal to torch's device 0."),
    Spec("gpu-spans", check_gpu_spans, 0,
         "From the default run's profile: per step, the GPU spans add up to the GPU phase totals and lie "
         "inside the step, in order."),
    Spec("nccl-one-rank", check_nccl, 60,
         "tests/fixtures/ddp_train.py with --nproc-per-node 1 on NCCL, DDP on cuda:0: the all-reduce meter "
         "counts one round per step on CUDA events, in flight and exposed measured, busbw not given for one "
         "rank; then SIGINT mid-run: exit 130 within 60 s with the rank's steps kept."),
    Spec("fsdp-one-rank", check_fsdp, 60,
         "tests/fixtures/fsdp_train.py with --nproc-per-node 1 on NCCL, FSDP2 on cuda:0: it finishes, the "
         "sharding is read, every step on the GPU timeline, and no post-run part runs the sharded model."),
    Spec("cudagraphs", check_cudagraphs, 90,
         "The built-in loop with --compile-mode reduce-overhead (CUDA graphs): every measured step on the GPU "
         "timeline, no event recorded during a capture, no sync counted as the loop's own."),
    Spec("nanogpt-data-delay", check_nanogpt_data_delay, 30,
         "tests/fixtures/nanogpt_train.py with 20 ms slept in every get_batch: gpuprof's data share vs the "
         "slept ÷ iteration time the fixture prints, within 5 points."),
    Spec("fp32-tf32", check_fp32_tf32, 30,
         "The fixture with --dtype=float32 (it allows TF32 as nanoGPT does): MFU against the TF32 peak, "
         "and the probe measures TF32."),
    Spec("sync-counts", check_sync_counts, 30,
         f"benchmarks/gpu_scripts/sync_counts.py: {SYNC_K} .item() + {SYNC_J} torch.cuda.synchronize() per "
         "step, 5 .item() in a warmup eval: exactly the per-step counts."),
    Spec("h2d-pageable", check_h2d_pageable, 40,
         "benchmarks/gpu_scripts/h2d_copies.py pageable vs pinned (16 MiB per micro-step): h2d-pageable "
         "fires on the pageable run only, and sync-in-step not for its blocking copies."),
    Spec("event-overhead", check_event_overhead, 30,
         "benchmarks/timing_overhead.py on CUDA: steps with and without the phase timer (ABBA pairs): "
         f"median on/off ratio ≤ {OVERHEAD_LIMIT}."),
    Spec("compute-fixes", check_compute_fixes, 40,
         "tests/fixtures/mingpt_train.py with attention by hand, vocabulary 50257 and AdamW not fused (GPT-2 "
         "widths, 4 layers, bf16): each seen and timed both ways on CUDA events; attention-by-hand found."),
    Spec("cuda-scenarios", check_cuda_scenarios, 40,
         "`gpuprof scenario run NAME` for every scenario whose device is cuda: each MATCHes (exit 0)."),
    Spec("compiled", check_compiled, 120,
         "`gpuprof diagnose --batch-size 16 --block-size 1024 --grad-accum 8 --dtype bf16 --compile`: "
         "the same figures and verdict as the default run."),
]
CHECK_WHAT = {s.name: s.what for s in CHECKS}


def run_check(ctx: Ctx, spec: Spec) -> Check:
    """One check, never raising: a broken check is a FAIL with its traceback in the report."""
    if ctx.left() < spec.min_s:
        return Check(spec.name).skip(f"time budget spent ({max(ctx.left(), 0):.0f} s left, needs {spec.min_s:.0f} s)")
    t0 = time.monotonic()
    try:
        c = spec.fn(ctx)
    except Exception as exc:  # noqa: BLE001 - one broken check must not stop the others
        c = Check(spec.name).decide(False, f"the check raised {exc.__class__.__name__}: {exc}")
        c.error = traceback.format_exc()[-TAIL_CHARS:]
    c.wall_s = time.monotonic() - t0
    return c


# ------------------------------------------------------------------------------- the machine
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _nvml_versions() -> dict:
    out = {}
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001
        return {"nvml": f"not measured ({exc.__class__.__name__})"}
    try:
        for key, fn in (("driver", "nvmlSystemGetDriverVersion"), ("nvml", "nvmlSystemGetNVMLVersion"),
                        ("cuda_driver", "nvmlSystemGetCudaDriverVersion_v2")):
            try:
                v = getattr(pynvml, fn)()
                v = v.decode() if isinstance(v, bytes) else v
                out[key] = f"{v // 1000}.{v % 1000 // 10}" if isinstance(v, int) else str(v)
            except Exception:  # noqa: BLE001
                out[key] = "not measured"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return out


# Read in a child so that this process never creates a CUDA context of its own (a GPU in
# EXCLUSIVE_PROCESS compute mode would then refuse every check's process).
DEVICE_FACTS = """import json, torch
p = torch.cuda.get_device_properties(0)
u = getattr(p, "uuid", None)
print(json.dumps({"name": p.name, "total_memory": p.total_memory, "capability": f"{p.major}.{p.minor}",
                  "uuid": None if u is None else str(u), "count": torch.cuda.device_count(),
                  "torch_cuda": torch.version.cuda}))"""


def device_facts(ctx: Ctx) -> dict:
    """torch's view of device 0 (name, memory, capability, UUID), or {"error": ...}."""
    proc = ctx.run([sys.executable, "-c", DEVICE_FACTS], 90)
    try:
        return json.loads(proc.output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": proc.tail(600).strip() or f"exit code {proc.rc}"}


def describe(ctx: Ctx, torch_version: str, facts: dict | None, budget_s: float) -> dict:
    """Command, date, host, GPU and software lines for the report header; sets ctx.gpu_name/uuid."""
    import gpuprof

    env_pp = os.environ.get("PYTHONPATH")
    cmd = (f"PYTHONPATH={env_pp} " if env_pp else "") + shlex.join([Path(sys.executable).name, *sys.argv])
    try:
        import psutil

        phys, ram = psutil.cpu_count(logical=False), f", {psutil.virtual_memory().total / 2**30:.1f} GiB RAM"
    except Exception:  # noqa: BLE001
        phys, ram = None, ""
    meta = {
        "command": f"`{cmd}`",
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": f"{_cpu_model()}, {os.cpu_count()} logical cores" + (f" ({phys} physical)" if phys else "")
                + f"{ram}, {platform.platform()}",
        "software": (f"torch {torch_version}, Python {platform.python_version()} ({sys.executable}), "
                     f"gpuprof {getattr(gpuprof, '__version__', 'unknown')}, commit {_git_commit()}"),
        "budget_s": budget_s,
    }
    if ctx.smoke or facts is None:
        meta["title"] = "CPU smoke (no GPU figures)"
        meta["gpu"] = "none: --cpu-smoke runs the plumbing on the CPU; checks that need CUDA are SKIPped"
        return meta
    nv = _nvml_versions()
    versions = (f"driver {nv.get('driver', 'not measured')}, CUDA {nv.get('cuda_driver', 'not measured')} (driver) / "
                f"{facts.get('torch_cuda', 'not measured')} (torch build), NVML {nv.get('nvml', 'not measured')}")
    if "error" in facts:
        meta["title"] = "unknown GPU"
        meta["gpu"] = f"not measured: torch could not read device 0 ({facts['error'][-300:]}); {versions}"
        return meta
    ctx.gpu_name, ctx.torch_uuid = facts.get("name"), facts.get("uuid")
    meta["title"] = str(ctx.gpu_name)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    meta["gpu"] = (f"{ctx.gpu_name}, {facts['total_memory'] / 2**30:.1f} GiB, "
                   f"compute capability {facts.get('capability')}, {facts.get('count')} visible "
                   f"(CUDA_VISIBLE_DEVICES={visible}), "
                   f"torch uuid {ctx.torch_uuid}, {versions}")
    return meta


def child_env(tmp: Path) -> dict:
    """The children's environment: gpuprof from this checkout; every cache and temp file in tmp."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    for var, sub in (("XDG_CACHE_HOME", "cache"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                     ("TRITON_CACHE_DIR", "triton"), ("TRITON_HOME", "triton-home"), ("CUDA_CACHE_PATH", "nv"),
                     ("TMPDIR", "tmp")):
        (tmp / sub).mkdir(exist_ok=True)
        env[var] = str(tmp / sub)
    env.update(COLUMNS="200", NO_COLOR="1", TERM="dumb", PYTHONUNBUFFERED="1")
    return env


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
    ctx = Ctx(tmp=tmp, smoke=args.cpu_smoke, deadline=t0 + args.budget, env=child_env(tmp))
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
