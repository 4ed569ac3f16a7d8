"""`gpuprof diagnose` and `gpuprof analyze`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from gpuprof import profile as profile_io
from gpuprof.cli.app import app, guarded
from gpuprof.cli.options import peak_options
from gpuprof.cli.output import FORCE_HELP, emit, exit_for, plan_outputs
from gpuprof.errors import GpuprofError

# Per-device defaults for the built-in loop: small enough that the default run finishes in
# well under a minute on a 2-core CPU; nanoGPT's GPT-2 settings on a GPU.
CPU_DEFAULTS = dict(model="tiny", batch_size=8, block_size=256, grad_accum=4, dtype="fp32")
CUDA_DEFAULTS = dict(model="gpt2", batch_size=16, block_size=1024, grad_accum=4, dtype="bf16")


@app.command(
    "diagnose",
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
)
@guarded
def diagnose(
    script: Optional[str] = typer.Argument(None, help="A training script to profile unmodified; omit for the built-in GPT loop."),
    script_args: Optional[List[str]] = typer.Argument(None, help="Arguments passed to the script untouched."),
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
    tf32: bool = typer.Option(True, "--tf32/--no-tf32", help="fp32 on CUDA: allow TF32 matmuls, as nanoGPT's train.py does."),
    device: Optional[str] = typer.Option(None, help="cpu, cuda or cuda:N (default: cuda if available)."),
    pin_memory: bool = typer.Option(True, "--pin-memory/--no-pin-memory", help="Pinned host buffers + non_blocking copies (CUDA)."),
    data: Optional[Path] = typer.Option(None, help="A uint16 token file (nanoGPT train.bin); default: a generated one."),
    steps: int = typer.Option(10, help="Measured optimizer steps."),
    warmup: int = typer.Option(2, help="Steps run before measuring (compile, allocator warm-up)."),
    stop: bool = typer.Option(True, "--stop/--no-stop", help="Script mode: stop the script after warmup+steps optimizer steps."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the profile JSON here (atomic; checked before the run; a write that still fails goes to a fallback file, exit 3)."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile JSON instead of the report."),
    gpu: Optional[str] = typer.Option(None, help="GPU name or key for the peak (overrides detection), e.g. h200."),
    peak_tflops: Optional[float] = typer.Option(None, help="Peak TFLOP/s to compute MFU against (overrides the table)."),
    reported_mfu: Optional[float] = typer.Option(None, help="An MFU % your script printed, to check against the true one."),
    samplers: bool = typer.Option(True, "--samplers/--no-samplers", help="NVML/host sampling and the matmul ceiling probe."),
    disk_report: Optional[Path] = typer.Option(None, help="A `gpuprof bench-disk --json` result for the data's storage."),
    write: Optional[Path] = typer.Option(None, help="Write the corrected config (nanoGPT `key = value` format) here."),
    force: bool = typer.Option(False, help=FORCE_HELP),
    allow_slow: bool = typer.Option(False, "--allow-slow", help="Built-in loop: run even when the run is estimated at an hour or more (refused otherwise)."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Also write a Chrome trace-event JSON here (opens in ui.perfetto.dev and chrome://tracing)."),
    html: Optional[Path] = typer.Option(None, "--html", help="Also write a self-contained HTML report here (no network requests)."),
    details: bool = typer.Option(False, "--details", help="Show everything: the MFU table, the GPU and host samplers, user-code attribution."),
    verify: bool = typer.Option(False, "--verify", help="Then run again with the top config fix applied (built-in loop, or a script taking --key=value) and show predicted vs achieved."),
    post_budget: Optional[float] = typer.Option(None, "--post-budget", help="Seconds the measurements after the run share (ceiling and precisions, FLOP count, micro-batch curve); default max(15, 25% of the run)."),
    nproc_per_node: Optional[int] = typer.Option(None, "--nproc-per-node", "--nproc_per_node", help="Data parallel: launch this many ranks per node through torch.distributed.run (torchrun); every rank is profiled and this node's ranks merged.", rich_help_panel="torchrun"),
    nnodes: Optional[str] = typer.Option(None, "--nnodes", help="torchrun --nnodes (N or MIN:MAX); each node runs gpuprof, `gpuprof merge` joins the nodes' files.", rich_help_panel="torchrun"),
    node_rank: Optional[int] = typer.Option(None, "--node-rank", "--node_rank", help="torchrun --node-rank.", rich_help_panel="torchrun"),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", "--rdzv_endpoint", help="torchrun --rdzv-endpoint HOST:PORT.", rich_help_panel="torchrun"),
    rdzv_backend: Optional[str] = typer.Option(None, "--rdzv-backend", "--rdzv_backend", help="torchrun --rdzv-backend (static, c10d, ...).", rich_help_panel="torchrun"),
    rdzv_id: Optional[str] = typer.Option(None, "--rdzv-id", "--rdzv_id", help="torchrun --rdzv-id.", rich_help_panel="torchrun"),
    rdzv_conf: Optional[str] = typer.Option(None, "--rdzv-conf", "--rdzv_conf", help="torchrun --rdzv-conf.", rich_help_panel="torchrun"),
    master_addr: Optional[str] = typer.Option(None, "--master-addr", "--master_addr", help="torchrun --master-addr.", rich_help_panel="torchrun"),
    master_port: Optional[int] = typer.Option(None, "--master-port", "--master_port", help="torchrun --master-port.", rich_help_panel="torchrun"),
    max_restarts: Optional[int] = typer.Option(None, "--max-restarts", "--max_restarts", help="torchrun --max-restarts (default 0).", rich_help_panel="torchrun"),
    monitor_interval: Optional[float] = typer.Option(None, "--monitor-interval", "--monitor_interval", help="torchrun --monitor-interval.", rich_help_panel="torchrun"),
    local_addr: Optional[str] = typer.Option(None, "--local-addr", "--local_addr", help="torchrun --local-addr.", rich_help_panel="torchrun"),
    standalone: bool = typer.Option(False, "--standalone", help="torchrun --standalone (one node, a free local port).", rich_help_panel="torchrun"),
    rank_timeout: Optional[float] = typer.Option(None, "--rank-timeout", help="Seconds a rank waits on a collective before it fails (init_process_group's timeout when the script sets none; default 600).", rich_help_panel="torchrun"),
):
    """Run a training loop under measured phases and explain where the step's time goes.

    Checked before anything runs: every output path; for the built-in loop,
    its memory (refused when it cannot fit) and its step time (said up front
    when a step takes minutes; a run estimated at an hour or more needs
    --allow-slow). After the run, the measurements that follow it share one
    time budget (--post-budget) and say what they skipped.

    Data parallel: --nproc-per-node N launches through torch.distributed.run
    (torchrun's launcher options pass through unchanged); every rank is
    profiled and this node's ranks merged (gpuprof merge joins nodes).

    Exit codes: 0 done; 1 the script raised, or a rank failed (the one that
    failed first is named; the profile keeps what every rank measured);
    2 bad input, nothing ran; 3 done, but an output could not be written
    where asked and went to the fallback file named on stderr; 130 Ctrl-C
    (what was measured is written).
    """
    import torch

    from gpuprof.analysis.pipeline import analyze_profile
    from gpuprof.measure.instruments import diagnose_instruments
    from gpuprof.preflight import preflight_run
    from gpuprof.render.live import live_progress

    err = Console(stderr=True)
    peak_options(peak_tflops, reported_mfu)
    disk = _load_disk_report(disk_report)  # before any run: a bad file fails fast
    if steps <= 0:
        raise GpuprofError(f"--steps must be positive, got {steps}")
    if warmup < 0:
        raise GpuprofError(f"--warmup must be zero or positive, got {warmup}")
    if post_budget is not None and not post_budget >= 0:
        raise GpuprofError(f"--post-budget must be zero or positive seconds, got {post_budget}")
    # Every output path before anything runs: a bad one costs a second, not the measurement.
    plan = plan_outputs({"--out": out, "--write": write, "--trace": trace, "--html": html}, force=force,
                        inputs=[("script", script), ("--data", data), ("--disk-report", disk_report)])
    if verify and as_json:
        raise GpuprofError("--verify prints a comparison report: use it without --json "
                           "(or save both runs with --out and use `gpuprof compare --json`)")
    if verify and nproc_per_node is not None:
        raise GpuprofError("--verify is not available for data-parallel runs yet: diagnose twice and "
                           "use `gpuprof compare`")
    launcher = dict(nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank,
                    rdzv_endpoint=rdzv_endpoint, rdzv_backend=rdzv_backend, rdzv_id=rdzv_id,
                    rdzv_conf=rdzv_conf, master_addr=master_addr, master_port=master_port,
                    max_restarts=max_restarts, monitor_interval=monitor_interval, local_addr=local_addr)
    if nproc_per_node is None and (standalone or any(v is not None for v in launcher.values())):
        raise GpuprofError("torchrun options need --nproc-per-node N (the ranks to launch on this node)")
    distributed = nproc_per_node is not None
    if distributed and script is not None:
        from gpuprof.cli.distributed_mode import diagnose_distributed

        diagnose_distributed(script=script, script_args=list(script_args or []), launcher=launcher,
                             standalone=standalone, builtin=None, steps=steps, warmup=warmup, stop=stop,
                             samplers=samplers, post_budget=post_budget, rank_timeout=rank_timeout,
                             as_json=as_json, gpu=gpu, peak_tflops=peak_tflops, reported_mfu=reported_mfu,
                             disk=disk, plan=plan, details=details, err=err)
        return
    if script is not None:
        from gpuprof.cli.script_mode import diagnose_script

        diagnose_script(script, list(script_args or []), steps=steps, warmup=warmup, stop=stop,
                        as_json=as_json, gpu=gpu, peak_tflops=peak_tflops,
                        reported_mfu=reported_mfu, samplers=samplers, err=err,
                        disk=disk, plan=plan, details=details, post_budget=post_budget, verify=verify)
        return

    from gpuprof.runners.builtin import LoopConfig, bf16_native, default_device, run_builtin

    dev = device or default_device()
    defaults = CUDA_DEFAULTS if dev.startswith("cuda") else CPU_DEFAULTS
    if dev.startswith("cuda") and torch.cuda.is_available() and not bf16_native(dev):
        defaults = dict(defaults, dtype="fp16")
    cfg = LoopConfig(
        model=model or defaults["model"], n_layer=n_layer, n_head=n_head, n_embd=n_embd,
        vocab_size=vocab_size, batch_size=batch_size or defaults["batch_size"],
        block_size=block_size or defaults["block_size"],
        grad_accum=grad_accum or defaults["grad_accum"], dtype=(dtype or defaults["dtype"]).lower(),
        compile=compile, tf32=tf32, device=dev, pin_memory=pin_memory, data=str(data) if data else None,
        steps=steps, warmup=warmup,
    )
    for key, val in (("batch-size", batch_size), ("block-size", block_size), ("grad-accum", grad_accum)):
        if val is not None and val <= 0:
            raise GpuprofError(f"--{key} must be positive, got {val}")
    cfg.validate()
    # Memory (refused when it cannot fit) and step time (refused at minutes unless
    # --allow-slow), before the loop and its progress bar start.
    warning = preflight_run(cfg, allow_slow=allow_slow, gpu=gpu, peak_tflops=peak_tflops)
    if warning is not None:
        typer.echo(f"gpuprof: warning: {warning}", err=True)
    if distributed:
        from dataclasses import asdict

        from gpuprof.cli.distributed_mode import check_world_divides, diagnose_distributed

        check_world_divides(cfg.grad_accum, nproc_per_node, nnodes)
        diagnose_distributed(script=None, script_args=[], launcher=launcher, standalone=standalone,
                             builtin=asdict(cfg), steps=steps, warmup=warmup, stop=stop, samplers=samplers,
                             post_budget=post_budget, rank_timeout=rank_timeout, as_json=as_json,
                             gpu=gpu, peak_tflops=peak_tflops, reported_mfu=reported_mfu, disk=disk,
                             plan=plan, details=details, err=err)
        return
    instruments = diagnose_instruments(dev, cfg.data, samplers)
    with live_progress(err, f"{cfg.model} on {dev}", cfg.warmup, cfg.steps, as_json, instruments) as live:
        profile = run_builtin(cfg, instruments=instruments, on_step_record=live.on_step,
                              post_budget_s=post_budget, on_progress=live.on_post)
    findings = analyze_profile(profile, gpu=gpu, peak_tflops=peak_tflops, reported_mfu_pct=reported_mfu,
                               disk=disk)
    saved = emit(profile, findings, plan, as_json=as_json, details=details)
    if profile.run.get("ended") == "interrupted":  # Ctrl-C: what was measured is above; exit 130
        raise KeyboardInterrupt
    if verify:
        from gpuprof.cli.verify import loop_config_with, verify as run_verify

        def rerun(overrides):
            cfg2 = loop_config_with(cfg, overrides)
            cfg2.validate()
            # The fixed run passes the same checks as the first: memory, and an hour-long run.
            warn2 = preflight_run(cfg2, allow_slow=allow_slow, gpu=gpu, peak_tflops=peak_tflops)
            if warn2 is not None:
                typer.echo(f"gpuprof: warning: {warn2}", err=True)
            inst2 = diagnose_instruments(dev, cfg2.data, samplers)
            with live_progress(err, f"{cfg2.model} on {dev}, fixed", cfg2.warmup, cfg2.steps, False, inst2) as live:
                prof2 = run_builtin(cfg2, instruments=inst2, on_step_record=live.on_step,
                                    post_budget_s=post_budget, on_progress=live.on_post)
            analyze_profile(prof2, gpu=gpu, peak_tflops=peak_tflops, disk=disk)
            return prof2

        run_verify(profile, findings, rerun, Console(), err, "the built-in loop")
    exit_for(saved)


def _load_disk_report(path: Optional[Path]) -> Optional[dict]:
    """A bench-disk JSON result, validated enough for the storage rule to read it."""
    import json

    from gpuprof.files import read_user_text

    if path is None:
        return None
    try:
        data = json.loads(read_user_text(path))
    except json.JSONDecodeError as exc:
        raise GpuprofError(f"{path}: not a bench-disk JSON result ({exc.__class__.__name__})") from None
    if not isinstance(data, dict) or "random" not in data or "loader" not in data:
        raise GpuprofError(f"{path}: not a bench-disk JSON result (no random/loader sections)")
    return data


@app.command("analyze")
@guarded
def analyze(
    file: Optional[Path] = typer.Argument(None, help="A saved profile (gpuprof diagnose --out)."),
    log: Optional[Path] = typer.Option(None, help="A nanoGPT training log to analyse without running anything."),
    gpu: Optional[str] = typer.Option(None, help="GPU name or key for the peak, e.g. h200."),
    peak_tflops: Optional[float] = typer.Option(None, help="Peak TFLOP/s (overrides the table)."),
    reported_mfu: Optional[float] = typer.Option(None, help="An MFU % the script printed."),
    batch_size: Optional[int] = typer.Option(None, help="Log mode: the run's batch_size."),
    block_size: Optional[int] = typer.Option(None, help="Log mode: the run's block_size."),
    grad_accum: Optional[int] = typer.Option(None, help="Log mode: gradient_accumulation_steps."),
    n_layer: Optional[int] = typer.Option(None, help="Log mode: model layers."),
    n_head: Optional[int] = typer.Option(None, help="Log mode: model heads."),
    n_embd: Optional[int] = typer.Option(None, help="Log mode: model width."),
    vocab_size: Optional[int] = typer.Option(None, help="Log mode: vocabulary size."),
    world_size: Optional[int] = typer.Option(None, help="Log mode: data-parallel ranks."),
    disk_report: Optional[Path] = typer.Option(None, help="A `gpuprof bench-disk --json` result for the data's storage."),
    write: Optional[Path] = typer.Option(None, help="Write the corrected config (nanoGPT `key = value` format) here."),
    force: bool = typer.Option(False, help=FORCE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the report."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Also write a Chrome trace-event JSON here."),
    html: Optional[Path] = typer.Option(None, "--html", help="Also write a self-contained HTML report here."),
    details: bool = typer.Option(False, "--details", help="Show everything: the MFU table, samplers, attribution."),
):
    """Re-render a saved profile (nothing is rerun), or analyse a nanoGPT log (--log)."""
    peak_options(peak_tflops, reported_mfu)
    from gpuprof.analysis.pipeline import analyze_profile

    if log is not None:
        for name, value in (("batch-size", batch_size), ("block-size", block_size), ("grad-accum", grad_accum),
                            ("n-layer", n_layer), ("n-head", n_head), ("n-embd", n_embd),
                            ("vocab-size", vocab_size), ("world-size", world_size)):
            if value is not None and value <= 0:
                raise GpuprofError(f"--{name} must be positive, got {value}")
        _analyze_log(log, gpu, peak_tflops, dict(
            batch_size=batch_size, block_size=block_size, gradient_accumulation_steps=grad_accum,
            n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab_size,
            world_size=world_size), as_json)
        return
    if file is None:
        raise GpuprofError("give a profile file (gpuprof analyze run.gpuprof.json) or --log train.log")
    plan = plan_outputs({"--write": write, "--trace": trace, "--html": html}, force=force,
                        inputs=[("profile", file), ("--disk-report", disk_report)])
    prof = profile_io.load(file)
    findings = analyze_profile(prof, gpu=gpu, peak_tflops=peak_tflops, reported_mfu_pct=reported_mfu,
                               disk=_load_disk_report(disk_report))
    exit_for(emit(prof, findings, plan, as_json=as_json, details=details))


def _analyze_log(log: Path, gpu, peak_tflops, config: dict, as_json: bool) -> None:
    import json

    from gpuprof.analysis.engine import rank
    from gpuprof.analysis.logs import analyze_log
    from gpuprof.analysis.rules.logs import log_findings
    from gpuprof.render.mfu import log_analysis_panel
    from gpuprof.render.terminal import findings_table

    result = analyze_log(log, gpu=gpu, peak_tflops=peak_tflops,
                         config={k: v for k, v in config.items() if v is not None})
    findings = rank(log_findings(result))
    result["findings"] = [f.to_dict() for f in findings]
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        console = Console()
        console.print(log_analysis_panel(result))
        if findings:
            console.print(findings_table(findings))
