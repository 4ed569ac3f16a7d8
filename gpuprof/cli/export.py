"""`gpuprof export PROFILE --trace FILE.json --html FILE.html`: a saved profile as a Perfetto /
chrome://tracing trace and as a self-contained HTML report. Nothing is rerun."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gpuprof.cli.app import app, guarded
from gpuprof.errors import GpuprofError


def export_outputs(trace: Optional[Path], html: Optional[Path]) -> list:
    """The files export (or diagnose --trace/--html) will write, for gpuprof.preflight.check_outputs.
    Both replace an existing file, as --out does: they are derived from the profile."""
    from gpuprof.preflight import Output

    found = []
    if trace is not None:
        found.append(Output("--trace", trace, overwrite=True, what="the trace"))
    if html is not None:
        found.append(Output("--html", html, overwrite=True, what="the HTML report"))
    return found


def findings_of(profile) -> list:
    """The profile's stored findings (what the run that wrote it concluded), or, for a profile
    saved without them, a fresh analysis (which also fills summary.mfu and the corrected config)."""
    if profile.findings:
        return profile.findings
    from gpuprof.analysis.pipeline import analyze_profile

    return [f.to_dict() for f in analyze_profile(profile)]


def write_exports(profile, findings, *, trace: Optional[Path], html: Optional[Path]) -> list:
    """Render and write the requested files; [(what, files.Saved)]. A write that fails goes to a
    fallback file (gpuprof.files.save_or_rescue) and the Saved says where."""
    from gpuprof.files import save_or_rescue

    saved = []
    if trace is not None:
        from gpuprof.render.trace import trace_json

        saved.append(("the trace", save_or_rescue(trace, trace_json(profile, findings))))
    if html is not None:
        from gpuprof.render.html import render_html

        saved.append(("the HTML report", save_or_rescue(html, render_html(profile, findings))))
    return saved


def report_saved(saved: list, written: bool = True) -> None:
    """One line per file: written (stdout; only when `written`), or where it went instead (stderr)."""
    for what, s in saved:
        if s.path is None:
            typer.echo(f"gpuprof: error: could not write {what} to {s.requested} ({s.error})", err=True)
        elif s.rescued:
            typer.echo(f"gpuprof: warning: could not write {what} to {s.requested} ({s.error}); "
                       f"saved it to {s.path} instead", err=True)
        elif written:
            typer.echo(f"{what.removeprefix('the ')} written to {s.path}")


@app.command("export")
@guarded
def export(
    file: Path = typer.Argument(..., help="A saved profile (gpuprof diagnose --out)."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Write Chrome trace-event JSON here (opens in ui.perfetto.dev and chrome://tracing)."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write a self-contained HTML report here (no network requests)."),
):
    """Export a saved profile as a trace (--trace) and/or an HTML report (--html).

    Uses the findings stored in the profile; a profile without them is analysed first.
    Exit codes: 0 written; 2 bad input (nothing written); 3 a file could
    not be written where asked and went to the fallback file named on stderr.
    """
    from gpuprof import profile as profile_io
    from gpuprof.cli.diagnose import exit_for
    from gpuprof.preflight import check_outputs

    if trace is None and html is None:
        raise GpuprofError("nothing to export: give --trace FILE.json and/or --html FILE.html")
    check_outputs(export_outputs(trace, html), inputs=[("profile", file)])
    prof = profile_io.load(file)
    try:
        saved = write_exports(prof, findings_of(prof), trace=trace, html=html)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a hand-edited or foreign file
        raise GpuprofError(f"{file}: malformed gpuprof profile, cannot export it ({exc!r})") from None
    report_saved(saved)
    exit_for([s for _, s in saved])
