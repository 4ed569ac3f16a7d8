"""`gpuprof export PROFILE --trace FILE.json --html FILE.html`: a saved profile as a Perfetto /
chrome://tracing trace and as a self-contained HTML report. Nothing is rerun."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gpuprof.cli.app import app, guarded
from gpuprof.cli.output import FORCE_HELP, exit_for, plan_outputs, report_saved, write_outputs
from gpuprof.errors import GpuprofError


def findings_of(profile) -> list:
    """The profile's stored findings (what the run that wrote it concluded), or, for a profile
    saved without them, a fresh analysis (which also fills summary.mfu and the corrected config)."""
    if profile.findings:
        return profile.findings
    from gpuprof.analysis.pipeline import analyze_profile

    return [f.to_dict() for f in analyze_profile(profile)]


@app.command("export")
@guarded
def export(
    file: Path = typer.Argument(..., help="A saved profile (gpuprof diagnose --out)."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Write Chrome trace-event JSON here (opens in ui.perfetto.dev and chrome://tracing)."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write a self-contained HTML report here (no network requests)."),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
):
    """Export a saved profile as a trace (--trace) and/or an HTML report (--html).

    Uses the findings stored in the profile; a profile without them is analysed first.
    Exit codes: 0 written; 2 bad input (nothing written); 3 a file could
    not be written where asked and went to the fallback file named on stderr.
    """
    from gpuprof import profile as profile_io

    if trace is None and html is None:
        raise GpuprofError("nothing to export: give --trace FILE.json and/or --html FILE.html")
    plan = plan_outputs({"--trace": trace, "--html": html}, force=force, inputs=[("profile", file)])
    prof = profile_io.load(file)
    try:
        saved, _ = write_outputs(plan, prof, findings_of(prof))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a hand-edited or foreign file
        raise GpuprofError(f"{file}: malformed gpuprof profile, cannot export it ({exc!r})") from None
    report_saved(saved)
    exit_for([s for _, s in saved])
