"""`gpuprof export PROFILE --trace FILE.json --html FILE.html`: a saved profile as a Perfetto /
chrome://tracing trace and as a self-contained HTML report. Nothing is rerun."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gpuprof.cli import options
from gpuprof.cli.app import app, guarded
from gpuprof.cli.output import exit_for, plan_outputs, report_saved, write_outputs
from gpuprof.errors import GpuprofError


def stored_or_fresh(path: Path):
    """A saved profile and its analysis: the one saved in the file (what the run concluded), or,
    for a file saved without one (schema 1), a fresh analysis."""
    from gpuprof import profile as profile_io
    from gpuprof.analysis.pipeline import Analysis, analyze

    prof, stored = profile_io.read(path)
    return prof, (Analysis.from_dict(stored, prof) if stored is not None else analyze(prof))


@app.command("export")
@guarded
def export(
    file: Path = typer.Argument(..., help="A saved profile (gpuprof diagnose --out)."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Write Chrome trace-event JSON here (opens in ui.perfetto.dev and chrome://tracing)."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write a self-contained HTML report here (no network requests)."),
    force: bool = options.FORCE,
):
    """Export a saved profile as a trace (--trace) and/or an HTML report (--html).

    Uses the analysis saved in the file; a file without one is analysed first.
    Exit codes: 0 written; 2 bad input (nothing written); 3 a file could
    not be written where asked and went to the fallback file named on stderr.
    """
    if trace is None and html is None:
        raise GpuprofError("nothing to export: give --trace FILE.json and/or --html FILE.html")
    plan = plan_outputs({"--trace": trace, "--html": html}, force=force, inputs=[("profile", file)])
    prof, analysis = stored_or_fresh(file)
    try:
        saved, _ = write_outputs(plan, prof, analysis)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a hand-edited or foreign file
        raise GpuprofError(f"{file}: malformed gpuprof profile, cannot export it ({exc!r})") from None
    report_saved(saved)
    exit_for([s for _, s in saved])
