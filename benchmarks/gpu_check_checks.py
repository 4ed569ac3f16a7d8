"""gpu_check's checks on one GPU, one function each: it runs `gpuprof diagnose`, `gpuprof scenario`
or a benchmark through Ctx, reads the profile or the output, and returns a Check decided by its
verdict; on the CPU smoke run a check that needs CUDA SKIPs and says why. The one-rank NCCL/FSDP
launches are in gpu_check_checks_ranks.py, the run order in gpu_check_plan.py."""

from __future__ import annotations

import sys
from pathlib import Path

from gpu_check_profile import Missing, finding_ids, findings, lookup, run_figures
from gpu_check_run import REPO, Check, Ctx, _ran
from gpu_check_verdicts import (judge_compute_fixes, judge_cpu_run, judge_cudagraphs, judge_gpu_run,
                                judge_gpu_spans, judge_tf32)
from gpu_check_verdicts_loop import judge_loop_promise
from gpu_check_verdicts_meters import (DATA_SHARE_TOLERANCE, NVML_FIELDS, SMOKE_DATA_SHARE_TOLERANCE, SYNC_J,
                                       SYNC_K, data_share_truth, iter_times, judge_data_share, judge_h2d, judge_nvml,
                                       judge_overhead, judge_syncs, parse_overhead)

FIXTURE = REPO / "tests" / "fixtures" / "nanogpt_train.py"
MINGPT = REPO / "tests" / "fixtures" / "mingpt_train.py"
SCRIPTS = REPO / "benchmarks" / "gpu_scripts"

# The smoke run's built-in loop: the tiny preset made smaller still (seconds on 2 cores).
SMOKE_BUILTIN = ["--device", "cpu", "--model", "tiny", "--n-layer", "1", "--n-head", "2", "--n-embd", "32",
                 "--batch-size", "2", "--block-size", "32", "--grad-accum", "2", "--steps", "3", "--warmup", "1",
                 "--post-budget", "3"]  # the plumbing, not the post-run timings (the suite tests those)
# The fixture's model for the data-delay check (as tests/script/test_script_run.py): the sleep is
# large against each micro-step's own work, and the GPU forward is too short to hide any of it.
FIXTURE_MODEL = ["--n_layer=4", "--n_head=4", "--n_embd=96", "--block_size=64"]


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
    ctx.profiles["compiled"] = prof  # loop-promises' AFTER for the compile promise
    c.figures = run_figures(prof)
    return c.decide(*judge_gpu_run(prof))


# The seed's shape (issue #42): GPT-2 124M, 16 x 1024, 8 micro-steps.
SEED_SHAPE = ["--batch-size", "16", "--block-size", "1024", "--grad-accum", "8", "--steps", "5", "--warmup", "3"]


def check_loop_promises(ctx: Ctx) -> Check:
    """The compile and precision promises measured on the built-in loop's own steps (experiment
    steps), met by the corrected config: eager bf16 with --measure-compile promises compile-missing,
    judged against the compiled run; fp32 promises precision-slow (bf16 autocast), judged against
    the eager bf16 run."""
    c = Check("loop-promises")
    if ctx.smoke:
        return c.skip("needs CUDA: the compile promise is timed on the built-in GPT-2 loop (minutes on a CPU)")
    proc, eager = ctx.diagnose("loop-eager", [*SEED_SHAPE, "--dtype", "bf16", "--measure-compile", "--post-budget", "150"],
                               budget_s=330)
    if not _ran(c, proc, eager):
        return c
    compiled = ctx.profiles.get("compiled")
    if compiled is None:
        proc, compiled = ctx.diagnose("loop-compiled", [*SEED_SHAPE, "--dtype", "bf16", "--compile"], budget_s=300)
        if not _ran(c, proc, compiled):
            return c
    ok_c, why_c, fig_c = judge_loop_promise(eager, compiled, "compile-missing", "compile")
    proc, fp32 = ctx.diagnose("loop-fp32", [*SEED_SHAPE, "--dtype", "fp32", "--post-budget", "60"], budget_s=240)
    if not _ran(c, proc, fp32):
        return c
    ok_p, why_p, fig_p = judge_loop_promise(fp32, eager, "precision-slow", "precision:bf16")
    c.figures = {**{f"compile {k}": v for k, v in fig_c.items()}, **{f"precision {k}": v for k, v in fig_p.items()}}
    return c.decide(ok_c and ok_p, f"{why_c}; {why_p}")


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
        # --post-budget 0: this check reads the data share only; default-diagnose runs the post-run parts
        opts, dev = ["--steps", "3", "--warmup", "1", "--no-samplers", "--post-budget", "0"], ["--device=cpu", "--threads=1"]
    else:
        opts, dev = ["--steps", "6", "--warmup", "1"], ["--device=cuda", "--dtype=bfloat16"]
    script = _fixture_args(ctx, *dev, "--data_delay=0.02", *FIXTURE_MODEL)
    proc, prof = ctx.diagnose("data-delay", opts, script, budget_s=90)
    if not _ran(c, proc, prof):
        return c
    # the steps gpuprof's share is over: the typical ones (an irregular step, a pause, is reported
    # apart; on an H200 the fixture's 5 lines averaged 157.8 ms where gpuprof's typical step was 140.2)
    typical = lookup(prof, "analysis.steps.typical")
    measured = [s.get("index") for s in prof.get("steps") or []]
    truth = data_share_truth(proc.output, typical if isinstance(typical, list) and typical else measured)
    c.figures = {k: lookup(prof, k) for k in ("analysis.steps.timeline", "analysis.steps.step_s", "analysis.steps.phases.data.seconds",
                                              "analysis.steps.phases.data.share", "measurements.timer.gpu_timeline")}
    c.figures["fixture iter times (ms), measured steps"] = ", ".join(
        f"{i}: {t:.1f}" for i, t in iter_times(proc.output).items() if i in measured) or Missing("no iter lines")
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
        "run.config.dtype", "measurements.precision", "analysis.mfu.dtype", "analysis.mfu.peak_tflops",
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


def check_cudagraphs(ctx: Ctx) -> Check:
    c = Check("cudagraphs")
    if ctx.smoke:
        return c.skip("needs CUDA: torch.compile(mode='reduce-overhead') records CUDA graphs")
    # CUDA graph trees cannot accumulate gradients (pytorch/pytorch#169545): one micro-step per step,
    # and the loop refuses more in one line, before it starts (exit 2, no traceback)
    opts = ["--compile-mode", "reduce-overhead", "--n-layer", "4", "--batch-size", "16", "--block-size", "512",
            "--grad-accum", "1", "--steps", "5", "--warmup", "3"]
    refused = ctx.run([sys.executable, "-m", "gpuprof", "diagnose", "--compile-mode", "reduce-overhead",
                       "--grad-accum", "2", "--steps", "1", "--warmup", "0"], 60)
    c.runs.append(refused)
    c.figures["--grad-accum 2: exit code"] = refused.rc
    if refused.rc != 2 or "Traceback" in refused.output or "cannot accumulate gradients" not in refused.output:
        return c.decide(False, f"--grad-accum 2 under CUDA graphs: exit {refused.rc}, not the one-line refusal")
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
    return c.decide(*judge_compute_fixes(prof, on_cuda=True, layers=int(model[model.index("--n-layer") + 1])))
