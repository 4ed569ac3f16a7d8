"""`gpuprof merge A.json B.json ... --out all.json`: join the profiles of a data-parallel run's
nodes (each written by `gpuprof diagnose --nproc-per-node N --nnodes M --node-rank R --out ...`)
into one, then report it as `analyze` would."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from gpuprof import profile as profile_io
from gpuprof.cli import options
from gpuprof.cli.app import app, guarded
from gpuprof.cli.options import peak_options
from gpuprof.cli.output import emit, exit_for, plan_outputs
from gpuprof.errors import GpuprofError


@app.command("merge")
@guarded
def merge(
    files: List[Path] = typer.Argument(..., help="Profiles to join: each node's merged profile, or single ranks' profiles."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the merged profile here."),
    gpu: Optional[str] = typer.Option(None, help="GPU name or key for the peak, e.g. h200."),
    peak_tflops: Optional[float] = typer.Option(None, help="Peak TFLOP/s (overrides the table)."),
    as_json: bool = typer.Option(False, "--json", help="Print the merged profile JSON instead of the report."),
    force: bool = options.FORCE,
):
    """Join per-node (or per-rank) profiles of one data-parallel run into one profile with every
    rank, then report the merged run (slowest rank, communication, the fixes)."""
    peak_options(peak_tflops)
    from gpuprof.analysis.pipeline import analyze
    from gpuprof.merge import merge_profiles

    if len(files) < 1:
        raise GpuprofError("give the profiles to merge (gpuprof merge node0.json node1.json --out all.json)")
    plan = plan_outputs({"--out": out}, force=force, inputs=[("profile", f) for f in files])
    named = [(str(f), profile_io.load(f)) for f in files]
    merged = merge_profiles(named)
    exit_for(emit(merged, analyze(merged, gpu=gpu, peak_tflops=peak_tflops), plan, as_json=as_json))
