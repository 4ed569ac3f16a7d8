"""`gpuprof diagnose` and `gpuprof analyze`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpuprof import profile as profile_io
from gpuprof.cli.app import app, guarded
from gpuprof.errors import GpuprofError

# Per-device defaults for the built-in loop: small enough that the default run finishes in
# well under a minute on a 2-core CPU; nanoGPT's GPT-2 settings on a GPU.
CPU_DEFAULTS = dict(model="tiny", batch_size=8, block_size=256, grad_accum=4, dtype="fp32")
CUDA_DEFAULTS = dict(model="gpt2", batch_size=16, block_size=1024, grad_accum=4, dtype="bf16")


def _progress(console: Console):
    return Progress(TextColumn("[bold]measuring[/bold] {task.description}"), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True)


def _instruments(device: str, data_path: Optional[str], samplers: bool) -> list:
    from gpuprof.measure.instruments import default_instruments

    return default_instruments(device, data_path, samplers=samplers, probe=samplers)


def emit(profile, findings, *, out: Optional[Path], as_json: bool, console: Console,
         write: Optional[Path] = None, force: bool = False) -> None:
    """Write the profile (--out) and the corrected config (--write), then print JSON (--json)
    or the terminal report."""
    from gpuprof.render.terminal import render_diagnosis

    if out is not None:
        profile_io.save(profile, out)
    written = _write_corrected(profile, write, force)
    if as_json:
        sys.stdout.write(profile.to_json() + "\n")
        return
    from gpuprof.render.mfu import mfu_panel, samplers_panel

    extra = []
    if profile.summary.get("mfu"):
        extra.append(mfu_panel(profile.summary["mfu"]))
    if profile.measurements:
        panel = samplers_panel(profile.measurements)
        if panel is not None:
            extra.append(panel)
    render_diagnosis(profile, findings, console, extra)
    if out is not None:
        console.print(f"profile written to {out}")
    if written is not None:
        console.print(f"corrected config written to {written}")


def _write_corrected(profile, write: Optional[Path], force: bool) -> Optional[Path]:
    from gpuprof.analysis.corrected import CorrectedConfig
    from gpuprof.recommend.config import write_config

    if write is None:
        return None
    cc = profile.summary.get("corrected_config") or {}
    if not cc.get("overrides"):
        raise GpuprofError("no config change to write: no finding of this run is a config fix")
    c = CorrectedConfig(cc["overrides"], cc["sources"], cc.get("overridden", []), cc.get("current", {}))
    return write_config(write, c.overrides, c.header(), force=force)


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
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the profile JSON here (atomic)."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile JSON instead of the report."),
    gpu: Optional[str] = typer.Option(None, help="GPU name or key for the peak (overrides detection), e.g. h200."),
    peak_tflops: Optional[float] = typer.Option(None, help="Peak TFLOP/s to compute MFU against (overrides the table)."),
    reported_mfu: Optional[float] = typer.Option(None, help="An MFU %% your script printed, to check against the true one."),
    samplers: bool = typer.Option(True, "--samplers/--no-samplers", help="NVML/host sampling and the matmul ceiling probe."),
    disk_report: Optional[Path] = typer.Option(None, help="A `gpuprof bench-disk --json` result for the data's storage."),
    write: Optional[Path] = typer.Option(None, help="Write the corrected config (nanoGPT `key = value` format) here."),
    force: bool = typer.Option(False, help="Let --write replace an existing file."),
):
    """Run a training loop under measured phases and explain where the step's time goes."""
    import torch

    from gpuprof.analysis.pipeline import analyze_profile

    err = Console(stderr=True)
    disk = _load_disk_report(disk_report)  # before any run: a bad file fails fast
    if write is not None and write.exists() and not force:
        raise GpuprofError(f"{write} already exists; pass --force to replace it")
    if steps <= 0:
        raise GpuprofError(f"--steps must be positive, got {steps}")
    if warmup < 0:
        raise GpuprofError(f"--warmup must be zero or positive, got {warmup}")
    if script is not None:
        from gpuprof.cli.script_mode import diagnose_script

        diagnose_script(script, list(script_args or []), steps=steps, warmup=warmup, stop=stop,
                        out=out, as_json=as_json, gpu=gpu, peak_tflops=peak_tflops,
                        reported_mfu=reported_mfu, samplers=samplers, err=err,
                        disk=disk, write=write, force=force)
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
    instruments = _instruments(dev, cfg.data, samplers)
    with _progress(err) as progress:
        task = progress.add_task(f"{cfg.model} on {dev}", total=cfg.warmup + cfg.steps)
        profile = run_builtin(cfg, instruments=instruments,
                              on_step=lambda i, n: progress.update(task, completed=i))
    findings = analyze_profile(profile, gpu=gpu, peak_tflops=peak_tflops, reported_mfu_pct=reported_mfu,
                               disk=disk)
    emit(profile, findings, out=out, as_json=as_json, console=Console(), write=write, force=force)


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
    reported_mfu: Optional[float] = typer.Option(None, help="An MFU %% the script printed."),
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
    force: bool = typer.Option(False, help="Let --write replace an existing file."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the report."),
):
    """Re-render a saved profile (nothing is rerun), or analyse a nanoGPT log (--log)."""
    from gpuprof.analysis.pipeline import analyze_profile

    if log is not None:
        _analyze_log(log, gpu, peak_tflops, dict(
            batch_size=batch_size, block_size=block_size, gradient_accumulation_steps=grad_accum,
            n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab_size,
            world_size=world_size), as_json)
        return
    if file is None:
        raise GpuprofError("give a profile file (gpuprof analyze run.gpuprof.json) or --log train.log")
    prof = profile_io.load(file)
    findings = analyze_profile(prof, gpu=gpu, peak_tflops=peak_tflops, reported_mfu_pct=reported_mfu,
                               disk=_load_disk_report(disk_report))
    emit(prof, findings, out=None, as_json=as_json, console=Console(), write=write, force=force)


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
