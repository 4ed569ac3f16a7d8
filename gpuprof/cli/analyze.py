"""`gpuprof analyze FILE`: judge a saved profile again (nothing is rerun), or show the analysis
saved in it (--stored); `gpuprof analyze --log train.log`: what a training log alone says."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from gpuprof import profile as profile_io
from gpuprof.analysis.pipeline import Analysis, AnalysisOptions, analyze as analyze_profile
from gpuprof.cli.app import app, guarded
from gpuprof.cli import options
from gpuprof.cli.options import load_disk_report, peak_options, positive
from gpuprof.cli.output import emit, exit_for, plan_outputs
from gpuprof.errors import GpuprofError


@app.command("analyze")
@guarded
def analyze(
    file: Optional[Path] = typer.Argument(None, help="A saved profile (gpuprof diagnose --out)."),
    stored: bool = typer.Option(False, "--stored", help="Show the analysis saved in the file as it was made, instead of judging the measurements again with this gpuprof's rules."),
    log: Optional[Path] = typer.Option(None, help="A nanoGPT training log to analyse without running anything."),
    gpu: Optional[str] = options.GPU,
    peak_tflops: Optional[float] = options.PEAK_TFLOPS,
    reported_mfu: Optional[float] = options.REPORTED_MFU,
    batch_size: Optional[int] = typer.Option(None, help="Log mode: the run's batch_size."),
    block_size: Optional[int] = typer.Option(None, help="Log mode: the run's block_size."),
    grad_accum: Optional[int] = typer.Option(None, help="Log mode: gradient_accumulation_steps."),
    n_layer: Optional[int] = typer.Option(None, help="Log mode: model layers."),
    n_head: Optional[int] = typer.Option(None, help="Log mode: model heads."),
    n_embd: Optional[int] = typer.Option(None, help="Log mode: model width."),
    vocab_size: Optional[int] = typer.Option(None, help="Log mode: vocabulary size."),
    world_size: Optional[int] = typer.Option(None, help="Log mode: data-parallel ranks."),
    disk_report: Optional[Path] = options.DISK_REPORT,
    write: Optional[Path] = options.WRITE,
    force: bool = options.FORCE,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the report."),
    trace: Optional[Path] = options.TRACE,
    html: Optional[Path] = options.HTML,
    details: bool = options.DETAILS,
):
    """Judge a saved profile again with this gpuprof's rules (nothing is rerun), show the analysis
    saved in it (--stored), or analyse a nanoGPT log (--log)."""
    peak_options(peak_tflops, reported_mfu)
    if log is not None:
        for name, value in (("--batch-size", batch_size), ("--block-size", block_size), ("--grad-accum", grad_accum),
                            ("--n-layer", n_layer), ("--n-head", n_head), ("--n-embd", n_embd),
                            ("--vocab-size", vocab_size), ("--world-size", world_size)):
            positive(name, value)
        _analyze_log(log, gpu, peak_tflops, dict(
            batch_size=batch_size, block_size=block_size, gradient_accumulation_steps=grad_accum,
            n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab_size,
            world_size=world_size), as_json)
        return
    if file is None:
        raise GpuprofError("give a profile file (gpuprof analyze run.gpuprof.json) or --log train.log")
    plan = plan_outputs({"--write": write, "--trace": trace, "--html": html}, force=force,
                        inputs=[("profile", file), ("--disk-report", disk_report)])
    prof, saved_analysis = profile_io.read(file)
    if stored:
        if saved_analysis is None:
            raise GpuprofError(f"{file}: no analysis saved in it (a schema-1 file, or saved without one): "
                               f"drop --stored to analyse it")
        result = Analysis.from_dict(saved_analysis, prof)
    else:
        result = analyze_profile(prof, AnalysisOptions(gpu=gpu, peak_tflops=peak_tflops, reported_mfu_pct=reported_mfu,
                                                       disk=load_disk_report(disk_report)))
    exit_for(emit(prof, result, plan, as_json=as_json, details=details))


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
    if as_json:
        sys.stdout.write(json.dumps({**result.to_dict(), "findings": [f.to_dict() for f in findings]}, indent=2) + "\n")
    else:
        console = Console()
        console.print(log_analysis_panel(result))
        if findings:
            console.print(findings_table(findings))
