"""`gpuprof diagnose SCRIPT [ARGS]...`: run a training script unmodified and explain its step.

The library (gpuprof.runners.script) runs the script and returns a Profile; this module maps the
ways a run can end onto the CLI's contract: the report or JSON as for the built-in loop, a
partial profile then exit 1 when the script raised, exit 130 on Ctrl-C, a one-line error and
exit 2 for a path that is not a Python script or a script that never steps an optimizer, exit 3
when an output went to a fallback file. The output paths were checked (cli.diagnose) before
the script starts.

Progress (gpuprof.render.live): on a terminal a live panel on stderr, with the script's stdout
and stderr printed whole above it through rich's redirection (a `\\r` progress bar such as tqdm's
then prints its updates as lines); otherwise plain lines on stderr; nothing under --json.
"""

from __future__ import annotations

import sys
from typing import Optional

from rich.console import Console

from gpuprof.cli.output import emit, exit_for
from gpuprof.errors import GpuprofError, ScriptFailed
from gpuprof.files import OutputPlan


def diagnose_script(script: str, script_args: list[str], *, steps: int, warmup: int, stop: bool,
                    as_json: bool, gpu: Optional[str], peak_tflops: Optional[float],
                    reported_mfu: Optional[float], samplers: bool, err: Console, plan: OutputPlan,
                    disk: Optional[dict] = None, details: bool = False,
                    post_budget: Optional[float] = None, verify: bool = False) -> None:
    """Profile `script script_args...`; emit the report/JSON; raise for the failure exits."""
    from gpuprof.analysis.pipeline import analyze_profile
    from gpuprof.measure.instruments import diagnose_instruments
    from gpuprof.measure.opened import OpenedFiles
    from gpuprof.runners.script import check_script, run_script

    check_script(script)
    # --json: stdout is the profile; stderr carries only the script's own output and errors.
    if not as_json:
        err.print(f"gpuprof: profiling {script}: {warmup} warmup + {steps} measured optimizer steps, then "
                  f"the script is stopped (--no-stop lets it finish)" if stop
                  else f"gpuprof: profiling {script} until it finishes", highlight=False)
    made: list = []

    def instruments(dev, data):
        made[:] = diagnose_instruments(dev, data, samplers)
        return made

    def gpu_sample():
        nvml = next((i for i in made if getattr(i, "name", None) == "nvml"), None)
        return nvml.latest() if nvml is not None else None

    from gpuprof.render.live import LiveProgress

    with OpenedFiles() as opened, LiveProgress(err, what=script, warmup=warmup, steps=steps if stop else None,
                                               enabled=not as_json, gpu_sample=gpu_sample) as live:
        # With --json, stdout carries the profile only: the script's stdout goes to stderr. Read
        # here, inside the live display: its redirection prints the script's lines above the panel.
        script_stdout = sys.stderr if as_json else sys.stdout
        result = run_script(script, script_args, steps=steps, warmup=warmup, stop=stop,
                            instruments_factory=instruments, stdout=script_stdout, post_budget_s=post_budget,
                            on_progress=live.on_post,
                            on_step_record=live.on_step)
    profile = result.profile
    if profile is None:
        raise _no_profile_error(script, result)

    reported = profile.measurements.get("script", {}).get("reported", {})
    findings = analyze_profile(profile, gpu=gpu, peak_tflops=peak_tflops,
                               reported_mfu_pct=reported_mfu if reported_mfu is not None
                               else reported.get("mfu_pct_median"), disk=disk)
    saved = emit(profile, findings, plan, as_json=as_json, details=details, opened=opened.protected())
    if verify and result.ended not in ("failed", "interrupted"):
        _verify_script(script, script_args, profile, findings, steps=steps, warmup=warmup, stop=stop,
                       samplers=samplers, post_budget=post_budget, gpu=gpu, peak_tflops=peak_tflops,
                       disk=disk, err=err)
    if result.ended == "failed":
        where = saved[0].path if plan.path("--out") is not None else None  # --out comes first: emit's order
        written = f"; partial profile written to {where}" if where is not None else ""
        raise ScriptFailed(f"{result.error_line} (the script failed after {len(profile.steps) + len(profile.warmup_steps)} "
                           f"complete steps{written})")
    if result.ended == "interrupted":
        raise KeyboardInterrupt
    exit_for(saved)


def _no_profile_error(script: str, result) -> GpuprofError:
    c = result.counts
    seen = (f"saw {c.get('forward', 0)} training forwards, {c.get('eval_forward', 0)} no_grad forwards, "
            f"{c.get('backward', 0)} backward calls, {c.get('optimizer_step', 0)} optimizer steps")
    if result.ended == "failed":
        return ScriptFailed(f"{result.error_line} (before the first complete training step: nothing measured)")
    if result.ended == "interrupted":
        return GpuprofError(f"interrupted before the first complete training step ({seen})")
    return GpuprofError(
        f"{script} ended without a complete training step: gpuprof marks a step at each "
        f"torch.optim.Optimizer.step() (optimizer step hooks) after an nn.Module forward; it {seen}")


def _verify_script(script, script_args, profile, findings, *, steps, warmup, stop, samplers, post_budget,
                   gpu, peak_tflops, disk, err: Console) -> None:
    """--verify for a script: the same command with the top fix's `--key=value` overrides."""
    from gpuprof.analysis.pipeline import analyze_profile
    from gpuprof.cli.verify import script_args_with, verify
    from gpuprof.measure.instruments import diagnose_instruments
    from gpuprof.render.live import LiveProgress
    from gpuprof.runners.script import run_script

    defined = profile.config.get("script_globals") or {}

    def rerun(overrides):
        args, usable = script_args_with(script_args, overrides, defined)
        if usable != overrides:
            missing = ", ".join(k for k in overrides if k not in usable)
            err.print(f"gpuprof: --verify: cannot apply {missing}: the script defines no such setting "
                      f"(apply the fix by hand, diagnose again, and use `gpuprof compare`)", highlight=False)
            return None
        with LiveProgress(err, what=f"{script} (fixed)", warmup=warmup, steps=steps if stop else None) as live:
            again = run_script(script, args, steps=steps, warmup=warmup, stop=stop,
                               instruments_factory=lambda dev, data: diagnose_instruments(dev, data, samplers),
                               stdout=sys.stdout, post_budget_s=post_budget, on_progress=live.on_post,
                               on_step_record=live.on_step)
        if again.profile is None or again.ended == "failed":
            why = again.error_line if again.error else "no complete step"
            err.print(f"gpuprof: --verify: the re-run with {' '.join(args[len(script_args):])} failed: {why}",
                      highlight=False)
            return None
        analyze_profile(again.profile, gpu=gpu, peak_tflops=peak_tflops, disk=disk)
        return again.profile

    verify(profile, findings, rerun, Console(), err, script)
