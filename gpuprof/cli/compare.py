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


def gate(result, limit: Optional[float], significant: bool = False) -> Optional[dict]:
    """The --fail-if-slower verdict: failed when AFTER's typical step (per token on that basis) is
    more than `limit` percent slower; with `significant`, only when the whole interval of the
    change is (its low end above `limit`), falling back to the typical step when the runs have
    too few steps for an interval."""
    if limit is None:
        return None
    slower_pct = result.slower_pct
    failed = slower_pct is not None and slower_pct > limit
    verdict = {"fail_if_slower_pct": limit, "slower_pct": slower_pct, "basis": result.basis, "failed": failed}
    if not significant:
        return verdict
    sc = result.step_change
    if sc is None or not sc.enough:
        return {**verdict, "significant": True, "judged_by": "typical step (too few steps for an interval)",
                "slower_low_pct": None, "slower_high_pct": None, "interval_level": None}
    low, high = (sc.low - 1) * 100, (sc.high - 1) * 100
    return {**verdict, "failed": low > limit, "significant": True, "judged_by": "interval",
            "slower_low_pct": low, "slower_high_pct": high, "interval_level": sc.level}


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
    significant: bool = typer.Option(
        False, "--significant",
        help="With --fail-if-slower: exit 1 only when the whole 90% interval of the change is more than "
             "PCT percent slower, so the gate does not flap on noise."),
    gpu: Optional[str] = typer.Option(None, help="GPU name or key for the peak when a profile is analysed here, e.g. h200."),
    peak_tflops: Optional[float] = typer.Option(None, help="Peak TFLOP/s when a profile is analysed here (overrides the table)."),
):
    """Compare two profiles: step time, tokens/s, MFU and each phase before/after; for each
    finding of BEFORE, its predicted saving against the one achieved.

    Exit codes: 0 done; 1 --fail-if-slower: AFTER is slower than allowed
    (with --significant: its whole interval is; one line on stderr); 2 bad
    input (a missing file, not a profile, a negative PCT, --significant
    without --fail-if-slower); 130 Ctrl-C.
    """
    peak_options(peak_tflops)
    from gpuprof.analysis.compare import compare as compare_profiles
    from gpuprof.render.compare import comparison_json, render_comparison

    if fail_if_slower is not None and not (math.isfinite(fail_if_slower) and fail_if_slower >= 0):
        raise GpuprofError(f"--fail-if-slower must be a percentage of zero or more, got {fail_if_slower}")
    if significant and fail_if_slower is None:
        raise GpuprofError("--significant needs --fail-if-slower PCT (the slowdown the interval must exceed)")
    (pb, ab), (pa, aa) = (load_analysed(p, gpu=gpu, peak_tflops=peak_tflops) for p in (before, after))
    result = compare_profiles(pb, ab, pa, aa, before_name=str(before), after_name=str(after))
    verdict = gate(result, fail_if_slower, significant)
    if as_json:
        sys.stdout.write(comparison_json(result, verdict) + "\n")
    else:
        render_comparison(result, Console())
    if verdict and verdict["failed"]:
        per = "per token" if result.basis == "token" else "per step"
        how = f"--fail-if-slower {fail_if_slower:g}"
        if verdict.get("judged_by") == "interval":
            how = (f"its {verdict['interval_level']:.0%} interval {verdict['slower_low_pct']:+.1f}% to "
                   f"{verdict['slower_high_pct']:+.1f}% is all above {fail_if_slower:g}%; {how} --significant")
        elif significant:
            how += " --significant: too few steps for an interval, judged on the typical step"
        typer.echo(f"gpuprof: slower: {after} is {result.slower_pct:.1f}% slower {per} than {before} ({how})",
                   err=True)
        raise typer.Exit(SLOWER_EXIT_CODE)
