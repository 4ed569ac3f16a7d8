"""`gpuprof diagnose [SCRIPT ARGS... | -m MODULE ARGS...]`: parse the options, run the target
(gpuprof.session), analyse it (gpuprof.analysis.pipeline), print and write the result (cli.output)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from gpuprof import session
from gpuprof.analysis.pipeline import AnalysisOptions, analyze
from gpuprof.cli.app import app, guarded
from gpuprof.cli import options
from gpuprof.cli.options import (ScriptCommand, launcher_options, load_disk_report, own_options, peak_options,
                                 script_target)
from gpuprof.cli.output import emit, exit_for, plan_outputs
from gpuprof.cli.verify import run_verify
from gpuprof.errors import GpuprofError, ScriptFailed
from gpuprof.render.live import LiveProgress
from gpuprof.session import Measure


@app.command(
    "diagnose",
    cls=ScriptCommand,  # `-m MODULE` ends gpuprof's options (cli.options.split_at_module)
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
)
@guarded
def diagnose(
    ctx: typer.Context,
    script: Optional[str] = typer.Argument(None, help="A training script to profile unmodified; omit for the built-in GPT loop."),
    script_args: Optional[List[str]] = typer.Argument(None, help=options.SCRIPT_ARGS_HELP),
    module: Optional[str] = options.MODULE,
    model: Optional[str] = typer.Option(None, help="Preset: tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl (default tiny on CPU, gpt2 on CUDA)."),
    n_layer: Optional[int] = typer.Option(None, help="Override the preset's layer count."),
    n_head: Optional[int] = typer.Option(None, help="Override the preset's head count."),
    n_embd: Optional[int] = typer.Option(None, help="Override the preset's embedding width."),
    vocab_size: Optional[int] = typer.Option(None, help="Override the preset's vocabulary size."),
    batch_size: Optional[int] = typer.Option(None, help="Micro-batch size (sequences)."),
    block_size: Optional[int] = typer.Option(None, help="Sequence length."),
    grad_accum: Optional[int] = typer.Option(None, help="Gradient accumulation steps per optimizer step."),
    dtype: Optional[str] = typer.Option(None, help="bf16, fp16 or fp32 (autocast dtype)."),
    compile: bool = typer.Option(False, "--compile/--no-compile", help="torch.compile the model."),
    compile_mode: Optional[str] = typer.Option(None, help="torch.compile's mode (implies --compile): default, reduce-overhead (CUDA graphs), max-autotune, max-autotune-no-cudagraphs."),
    tf32: bool = typer.Option(True, "--tf32/--no-tf32", help="fp32 on CUDA: allow TF32 matmuls, as nanoGPT's train.py does."),
    device: Optional[str] = typer.Option(None, help="cpu, cuda or cuda:N (default: cuda if available)."),
    pin_memory: bool = typer.Option(True, "--pin-memory/--no-pin-memory", help="Pinned host buffers + non_blocking copies (CUDA)."),
    data: Optional[Path] = typer.Option(None, help="A uint16 token file (nanoGPT train.bin); default: a generated one."),
    steps: int = typer.Option(10, help="Measured steps (optimizer steps; in a loop without an optimizer, parameter updates or loop iterations)."),
    warmup: int = typer.Option(2, help="Steps run before measuring (compile, allocator warm-up)."),
    stop: bool = typer.Option(True, "--stop/--no-stop", help="Script mode: stop the script after warmup+steps steps (and one that shows no training step within a bound)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the profile JSON here (atomic; checked before the run; a write that still fails goes to a fallback file, exit 3)."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile JSON instead of the report."),
    gpu: Optional[str] = options.GPU,
    peak_tflops: Optional[float] = options.PEAK_TFLOPS,
    reported_mfu: Optional[float] = options.REPORTED_MFU,
    samplers: bool = typer.Option(True, "--samplers/--no-samplers", help="NVML/host sampling and the matmul ceiling probe."),
    disk_report: Optional[Path] = options.DISK_REPORT,
    write: Optional[Path] = options.WRITE,
    force: bool = options.FORCE,
    allow_slow: bool = typer.Option(False, "--allow-slow", help="Built-in loop: run even when the run is estimated at an hour or more (refused otherwise)."),
    trace: Optional[Path] = options.TRACE,
    html: Optional[Path] = options.HTML,
    details: bool = options.DETAILS,
    verify: bool = typer.Option(False, "--verify", help="Then run again with the top config fix applied (built-in loop, or a script taking --key=value) and show predicted vs achieved."),
    post_budget: Optional[float] = typer.Option(None, "--post-budget", help="Seconds the measurements after the run share (ceiling and precisions, FLOP count, compute fixes, micro-batch curve); default max(15, 25% of the run)."),
    experiments: bool = typer.Option(True, "--experiments/--no-experiments", help="After the measured steps, time each fix gpuprof can switch from outside (autocast, TF32, fused Adam/AdamW; with --measure-compile torch.compile) on the loop's own next steps (your script's, or the built-in one), paired with and without it, within --post-budget; then a script is stopped. Never with --no-stop, nor in a data-parallel run."),
    measure_compile: bool = typer.Option(False, "--measure-compile", help="An eager run: then compile its model (torch.compile) and time forward+backward compiled vs eager, outside --post-budget (a compile takes about a minute for GPT-2 on a GPU); compile-missing's saving is then measured."),
    nproc_per_node: Optional[int] = options.NPROC_PER_NODE,
    nnodes: Optional[str] = options.NNODES,
    node_rank: Optional[int] = options.NODE_RANK,
    rdzv_endpoint: Optional[str] = options.RDZV_ENDPOINT,
    rdzv_backend: Optional[str] = options.RDZV_BACKEND,
    rdzv_id: Optional[str] = options.RDZV_ID,
    rdzv_conf: Optional[str] = options.RDZV_CONF,
    master_addr: Optional[str] = options.MASTER_ADDR,
    master_port: Optional[int] = options.MASTER_PORT,
    max_restarts: Optional[int] = options.MAX_RESTARTS,
    monitor_interval: Optional[float] = options.MONITOR_INTERVAL,
    local_addr: Optional[str] = options.LOCAL_ADDR,
    standalone: bool = options.STANDALONE,
    rank_timeout: Optional[float] = options.RANK_TIMEOUT,
):
    """Run a training loop under measured phases and explain where the step's time goes.

    Checked before anything runs: every output path; for the built-in loop,
    its memory (refused when it cannot fit) and its step time (said up front
    when a step takes minutes; a run estimated at an hour or more needs
    --allow-slow). After the run, the measurements that follow it share one
    time budget (--post-budget) and say what they skipped.

    A script: `gpuprof diagnose [OPTIONS] train.py ARGS` runs it as `python
    train.py ARGS`; `gpuprof diagnose [OPTIONS] -m scripts.base_train ARGS`
    as `python -m scripts.base_train ARGS` (from the repo's root). gpuprof's
    options come before the script: what follows it is the script's.

    Data parallel: --nproc-per-node N launches through torch.distributed.run
    (torchrun's launcher options pass through unchanged); every rank is
    profiled and this node's ranks merged (gpuprof merge joins nodes).

    Exit codes: 0 done; 1 the script raised, or a rank failed (the one that
    failed first is named; the profile keeps what every rank measured);
    2 bad input, nothing ran; 3 done, but an output could not be written
    where asked and went to the fallback file named on stderr; 130 Ctrl-C
    (what was measured is written).
    """
    err = Console(stderr=True)
    script, is_module = script_target(script, module)
    what = session.shown(script, is_module) if script is not None else None
    own = own_options(ctx)  # kept out of the script's own argparse (runners.script_inputs)
    peak_options(peak_tflops, reported_mfu)
    disk = load_disk_report(disk_report)  # before any run: a bad file fails fast
    measure = Measure(steps=steps, warmup=warmup, stop=stop, samplers=samplers, post_budget=post_budget,
                      measure_compile=measure_compile, experiments=experiments).validate()
    script_file = script
    if is_module:  # the module's file, found as python -m finds it (one line, exit 2, when it is not)
        from gpuprof.runners.script import check_script

        script_file = str(check_script(script, module=True))
    # Every output path before anything runs: a bad one costs a second, not the measurement.
    plan = plan_outputs({"--out": out, "--write": write, "--trace": trace, "--html": html}, force=force,
                        inputs=[("script", script_file), ("--data", data), ("--disk-report", disk_report)])
    options = AnalysisOptions(gpu=gpu, peak_tflops=peak_tflops, reported_mfu_pct=reported_mfu, disk=disk)
    launcher = launcher_options(
        standalone, nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
        rdzv_backend=rdzv_backend, rdzv_id=rdzv_id, rdzv_conf=rdzv_conf, master_addr=master_addr,
        master_port=master_port, max_restarts=max_restarts, monitor_interval=monitor_interval, local_addr=local_addr)
    distributed = nproc_per_node is not None
    if verify and as_json:
        raise GpuprofError("--verify prints a comparison report: use it without --json "
                           "(or save both runs with --out and use `gpuprof compare --json`)")
    if verify and distributed:
        raise GpuprofError("--verify is not available for data-parallel runs yet: diagnose twice and "
                           "use `gpuprof compare`")
    cfg = None
    if script is None:
        cfg = session.builtin_config(measure, device=device, model=model, dtype=dtype, n_layer=n_layer,
                                     n_head=n_head, n_embd=n_embd, vocab_size=vocab_size, batch_size=batch_size,
                                     block_size=block_size, grad_accum=grad_accum, compile=compile,
                                     compile_mode=compile_mode, tf32=tf32,
                                     pin_memory=pin_memory, data=str(data) if data else None)
    if distributed:
        session.prepare_launch(launcher, standalone, script=script, builtin=cfg, rank_timeout=rank_timeout,
                               module=is_module)
    if cfg is not None:
        # Memory (refused when it cannot fit) and step time (refused at minutes unless
        # --allow-slow), before the loop and its progress bar start.
        _preflight(cfg, allow_slow, gpu, peak_tflops)
    args = list(script_args or [])
    if distributed:
        launched = what or f"the built-in loop ({cfg.model}, DDP)"
        err.print(f"gpuprof: launching {launched} on {nproc_per_node} process(es) per node, {nnodes or 1} node(s), "
                  f"through torch.distributed.run; {warmup} warmup + {steps} measured steps per rank",
                  highlight=False, markup=False)
        result = session.run_distributed(launcher, standalone, measure, script=script, script_args=args,
                                         builtin=cfg, rank_timeout=rank_timeout, as_json=as_json,
                                         module=is_module, own_options=own)
    elif script is not None:
        from gpuprof.runners.script import check_script

        check_script(script, module=is_module)  # not a script: one line, before saying it is profiled
        if not as_json:  # --json: stdout is the profile; stderr carries only the script's own output
            err.print(f"gpuprof: profiling {what}: {warmup} warmup + {steps} measured steps, then "
                      f"the script is stopped (--no-stop lets it finish)" if stop
                      else f"gpuprof: profiling {what} until it finishes", highlight=False, markup=False)
        with LiveProgress(err, what=what, warmup=warmup, steps=steps if stop else None, enabled=not as_json) as live:
            # With --json, stdout carries the profile only: the script's stdout goes to stderr. Read
            # here, inside the live display: its redirection prints the script's lines above the panel.
            result = session.run_script(script, args, measure, live, stdout=sys.stderr if as_json else sys.stdout,
                                        module=is_module, own_options=own)
    else:
        with LiveProgress(err, what=f"{cfg.model} on {cfg.device}", warmup=warmup, steps=steps,
                          enabled=not as_json) as live:
            result = session.run_builtin(cfg, measure, live)
    analysis = analyze(result.profile, options)
    saved = emit(result.profile, analysis, plan, as_json=as_json, details=details, opened=result.opened)
    if result.ended == "failed":
        where = saved[0].path if plan.path("--out") is not None and saved else None  # --out is written first
        raise ScriptFailed(result.error + (f"; partial profile written to {where}" if where else ""))
    if result.ended == "interrupted":  # Ctrl-C: what was measured is above; exit 130
        raise KeyboardInterrupt
    if verify:
        run_verify(result.profile, analysis, options, err,
                   rerun_builtin(cfg, measure, allow_slow, gpu, peak_tflops, err) if cfg is not None
                   else rerun_script(script, args, result.profile, measure, err, module=is_module, own=own),
                   "the built-in loop" if cfg is not None else what)
    exit_for(saved)


def _preflight(cfg, allow_slow: bool, gpu: Optional[str], peak_tflops: Optional[float]) -> None:
    from gpuprof.preflight import preflight_run

    warning = preflight_run(cfg, allow_slow=allow_slow, gpu=gpu, peak_tflops=peak_tflops)
    if warning is not None:
        typer.echo(f"gpuprof: warning: {warning}", err=True)


def rerun_builtin(cfg, measure, allow_slow, gpu, peak_tflops, err):
    """--verify for the built-in loop: the same run with the fix's options."""
    def rerun(overrides):
        cfg2 = session.loop_config_with(cfg, overrides)
        _preflight(cfg2, allow_slow, gpu, peak_tflops)  # the same checks as the first run
        with LiveProgress(err, what=f"{cfg2.model} on {cfg2.device}, fixed", warmup=cfg2.warmup,
                          steps=cfg2.steps) as live:
            return session.run_builtin(cfg2, measure, live).profile
    return rerun


def rerun_script(script, args, profile, measure, err, *, module: bool = False, own=None):
    """--verify for a script: the same command with the fix's `--key=value` overrides appended
    (nanoGPT's configurator convention), for the keys the script defines. module: `script` is a
    module name (-m), run again as one."""
    defined = profile.config.get("script_globals") or {}

    def rerun(overrides):
        args2, usable = session.script_args_with(args, overrides, defined)
        env = {}
        if usable != overrides:  # not nanoGPT's keys: the script's own flags or environment variables
            own_terms = session.script_change(args, overrides, profile.config, int(profile.run.get("world_size") or 1))
            if own_terms is None:
                missing = ", ".join(k for k in overrides if k not in usable)
                err.print(f"gpuprof: --verify: cannot apply {missing}: the script has no setting gpuprof found for it "
                          f"(apply the fix by hand, diagnose again, and use `gpuprof compare`)",
                          highlight=False, markup=False)
                return None
            args2, env = own_terms
        change = " ".join([*(f"{k}={v}" for k, v in env.items()), *args2[len(args):]])
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            with LiveProgress(err, what=f"{session.shown(script, module)} (fixed)", warmup=measure.warmup,
                              steps=measure.steps if measure.stop else None) as live:
                try:
                    again = session.run_script(script, args2, measure, live, module=module, own_options=own)
                except GpuprofError as exc:
                    err.print(f"gpuprof: --verify: the re-run with {change} failed: {exc}",
                              highlight=False, markup=False)
                    return None
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        if again.ended == "failed":
            err.print(f"gpuprof: --verify: the re-run with {change} failed: {again.error}",
                      highlight=False, markup=False)
            return None
        return again.profile
    return rerun
