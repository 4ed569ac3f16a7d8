"""`gpuprof recommend`: batch_size × gradient_accumulation_steps for a token target that fits
and runs fastest. Parses options, calls gpuprof.recommend, hands the result to the renderer."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gpuprof.cli import options
from gpuprof.cli.app import app, guarded, stdout_is_tty
from gpuprof.cli.options import positive
from gpuprof.cli.output import exit_for, plan_outputs, report_saved
from gpuprof.errors import GpuprofError


@app.command("recommend")
@guarded
def recommend_cmd(
    target_tokens: str = typer.Option(..., "--target-tokens", "-t", help="Tokens per optimizer step: 524288, 0.5Mi, 1M (=1,000,000), 1Mi (=2^20), 2^20, 1e6. K/M/G = 10^3/10^6/10^9, Ki/Mi/Gi = 2^10/2^20/2^30."),
    tolerance: float = typer.Option(0.05, "--tolerance", help="Accept configs within ±this fraction of the target."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Preset: tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl (default gpt2)."),
    n_layer: Optional[int] = typer.Option(None, "--n-layer"),
    n_head: Optional[int] = typer.Option(None, "--n-head"),
    n_embd: Optional[int] = typer.Option(None, "--n-embd"),
    vocab_size: Optional[int] = typer.Option(None, "--vocab-size"),
    config: list[Path] = typer.Option([], "--config", "-c", help="nanoGPT config file (repeatable; read, never executed)."),
    from_profile: Optional[Path] = typer.Option(None, "--from", help="A run.gpuprof.json: model, current config, GPU and measured step timing."),
    block_size: Optional[int] = typer.Option(None, "--block-size"),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU name or key (h200, h100, a100, …); default: the profile's or the detected one."),
    memory_gb: Optional[float] = typer.Option(None, "--memory-gb", help="Override GPU memory capacity (decimal GB)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="fp32, bf16 or fp16 (nanoGPT names accepted)."),
    compile: Optional[bool] = typer.Option(None, "--compile/--no-compile", help="torch.compile (nanoGPT default: on)."),
    flash: Optional[bool] = typer.Option(None, "--flash/--no-flash", help="Fused (flash) attention (default on)."),
    checkpointing: Optional[bool] = typer.Option(None, "--checkpointing/--no-checkpointing", help="Activation recomputation per block."),
    world_size: Optional[int] = typer.Option(None, "--world-size", help="Data-parallel ranks (multiply tokens per step)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Your current batch_size (to compare against)."),
    grad_accum: Optional[int] = typer.Option(None, "--grad-accum", help="Your current gradient_accumulation_steps (nanoGPT's, all ranks)."),
    measure: bool = typer.Option(False, "--measure", help="Time forward+backward at micro-batch 1, 2, 4, … on this machine's device."),
    measure_budget: float = typer.Option(60.0, "--measure-budget", help="Seconds the --measure sweep may take."),
    write: Optional[Path] = typer.Option(None, "--write", help="Write the corrected config (nanoGPT format) to this new file."),
    force: bool = options.FORCE,
    as_json: bool = typer.Option(False, "--json", help="Print JSON (keys documented in docs/recommend.md)."),
) -> None:
    """Which batch_size × gradient_accumulation_steps reaches a token target, fits in memory,
    and runs fastest — with the memory breakdown and the reason."""
    from gpuprof.recommend import plan, sources
    from gpuprof.recommend.config import format_config
    from gpuprof.recommend.tokens import parse_tokens
    from gpuprof.render.recommend import render_json, render_text

    target = parse_tokens(target_tokens)
    positive("--tolerance", tolerance, zero=True)
    positive("--memory-gb", memory_gb)
    positive("--measure-budget", measure_budget)
    written_to = plan_outputs({"--write": write}, force=force,
                        inputs=[("--config", c) for c in config] + [("--from", from_profile)])
    detect = sources.detected_cuda
    cuda_here = detect() is not None
    if measure and not cuda_here:
        if gpu:
            raise GpuprofError(f"--measure times this machine's device (CPU, no CUDA here), "
                               f"not a {gpu}; drop --measure or --gpu")
        detect = _host_ram
    inputs = sources.resolve(
        model=model, n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab_size,
        config_files=config, profile_path=str(from_profile) if from_profile else None,
        block_size=block_size, gpu=gpu, memory_gb=memory_gb, dtype=dtype, compile=compile,
        flash=flash, checkpointing=checkpointing, world_size=world_size,
        batch_size=batch_size, grad_accum=grad_accum, detect=detect)
    device = "cuda" if (cuda_here or not measure) else "cpu"

    throughput, notes, sweep_result = sources.throughput_for(
        inputs, target, measure=measure, budget_s=measure_budget, device=device,
        tolerance=tolerance)
    rec = plan.recommend(
        inputs.model, target, inputs.gpu, inputs.dtype, inputs.compile, inputs.flash,
        inputs.checkpointing, inputs.world_size, capacity_bytes=inputs.capacity_bytes,
        throughput=throughput, tolerance=tolerance, current=inputs.current, device=device)
    rec.capacity_source = inputs.capacity_source
    rec.notes[:0] = [f"model from {inputs.model_source}"] + notes

    written, saved = None, []
    if write is not None:
        if rec.best is None:
            raise GpuprofError("nothing fits, so no corrected config was written")
        header = (f"written by gpuprof recommend --target-tokens {target_tokens}\n"
                  f"{rec.best.tokens:,} tokens per optimizer step; {rec.reason}")
        saved = [("the corrected config", written_to.save("--write", format_config(rec.overrides(), header)))]
        written = None if saved[0][1].rescued else str(saved[0][1].path)
    if as_json:
        typer.echo(render_json(rec, written=written, sweep=sweep_result))
    else:
        typer.echo(render_text(rec, color=stdout_is_tty(), written=written, sweep=sweep_result),
                   nl=False)
    report_saved(saved, written=False)
    exit_for([s for _, s in saved])


def _host_ram():
    import psutil

    return "CPU (host RAM)", psutil.virtual_memory().total
