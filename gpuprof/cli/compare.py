"""`gpuprof compare BEFORE.json AFTER.json`: diagnose, apply a fix, diagnose again, compare."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from gpuprof import profile as profile_io
from gpuprof.cli.app import app, guarded
from gpuprof.cli.options import peak_options
from gpuprof.errors import GpuprofError

SLOWER_EXIT_CODE = 1  # --fail-if-slower: AFTER is slower than allowed


def load_analysed(path: Path, *, gpu: Optional[str], peak_tflops: Optional[float]):
    """A saved profile and its analysis: the one saved in the file (what the run predicted), or,
    for a file saved without one, an analysis made here, as `gpuprof analyze` would."""
    from gpuprof.analysis.pipeline import Analysis, analyze

    prof, stored = profile_io.read(path)
    if stored is not None and gpu is None and peak_tflops is None:
        return prof, Analysis.from_dict(stored, prof)
    return prof, analyze(prof, gpu=gpu, peak_tflops=peak_tflops)


def gate(slower_pct: Optional[float], limit: Optional[float], basis: str) -> Optional[dict]:
    """The --fail-if-slower verdict: failed when AFTER is more than `limit` percent slower."""
    if limit is None:
        return None
    failed = slower_pct is not None and slower_pct > limit
    return {"fail_if_slower_pct": limit, "slower_pct": slower_pct, "basis": basis, "failed": failed}


@app.command("compare")
@guarded
def compare(
    before: Path = typer.Argument(..., help="The profile before the change (gpuprof diagnose --out)."),
    after: Path = typer.Argument(..., help="The profile after the change."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON instead of the report."),
    fail_if_slower: Optional[float] = typer.Option(
        None, "--fail-if-slower", metavar="PCT",
        help="Exit 1 when AFTER is more than PCT percent slower than BEFORE (per token when the "
             "tokens per step differ): a CI regression gate."),
    gpu: Optional[str] = typer.Option(None, help="GPU name or key for the peak when a profile is analysed here, e.g. h200."),
    peak_tflops: Optional[float] = typer.Option(None, help="Peak TFLOP/s when a profile is analysed here (overrides the table)."),
):
    """Compare two profiles: step time, tokens/s, MFU and each phase before/after; for each
    finding of BEFORE, its predicted saving against the one achieved.

    Exit codes: 0 done; 1 --fail-if-slower: AFTER is slower than allowed
    (one line on stderr); 2 bad input (a missing file, not a profile, a
    negative PCT); 130 Ctrl-C.
    """
    peak_options(peak_tflops)
    from gpuprof.analysis.compare import compare as compare_profiles
    from gpuprof.render.compare import comparison_json, render_comparison

    if fail_if_slower is not None and not (math.isfinite(fail_if_slower) and fail_if_slower >= 0):
        raise GpuprofError(f"--fail-if-slower must be a percentage of zero or more, got {fail_if_slower}")
    (pb, ab), (pa, aa) = (load_analysed(p, gpu=gpu, peak_tflops=peak_tflops) for p in (before, after))
    result = compare_profiles(pb, ab, pa, aa, before_name=str(before), after_name=str(after))
    verdict = gate(result.slower_pct, fail_if_slower, result.basis)
    if as_json:
        sys.stdout.write(comparison_json(result, verdict) + "\n")
    else:
        render_comparison(result, Console())
    if verdict and verdict["failed"]:
        per = "per token" if result.basis == "token" else "per step"
        typer.echo(f"gpuprof: slower: {after} is {result.slower_pct:.1f}% slower {per} than {before} "
                   f"(--fail-if-slower {fail_if_slower:g})", err=True)
        raise typer.Exit(SLOWER_EXIT_CODE)
