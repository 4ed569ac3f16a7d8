"""What every verb does with its results: the output files it plans before running (checked
then, written after with the same rules: gpuprof.files.OutputPlan), the report or JSON it
prints, and the exit code a rescued file gives. Below the verbs: they import this module, never
each other.

Exit codes: 0 done; 1 the script or a rank failed; 2 bad input, nothing ran; 3 done, but an
output went to the fallback file named on stderr (files.RESCUED_EXIT_CODE); 130 Ctrl-C.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterable, Optional

import typer
from rich.console import Console

from gpuprof.files import RESCUED_EXIT_CODE, Output, OutputPlan, Saved, check_outputs

# The options that name output files: option -> (kind in files.KINDS, how messages name it).
OUTPUTS = {
    "--out": ("profile", "the profile"),
    "--write": (None, "the corrected config"),  # a config the user trains with: only with --force
    "--trace": ("trace", "the trace"),
    "--html": ("html", "the HTML report"),
}



def plan_outputs(paths: dict[str, Optional[Path]], *, force: bool = False,
                 inputs: Iterable[tuple[str, object]] = ()) -> OutputPlan:
    """Check every output this command will write ({"--out": path or None, ...}) before
    anything runs: a bad path, an existing file that is not gpuprof's or an input is one line,
    exit 2, in a second rather than after the measurement."""
    outs = [Output(opt, Path(p), *OUTPUTS[opt]) for opt, p in paths.items() if p is not None]
    return check_outputs(outs, force=force, inputs=inputs)


def write_outputs(plan: OutputPlan, profile, analysis, *, opened: Optional[dict] = None) -> tuple[list, list]:
    """Render and write every planned output: ([(what, files.Saved)], notes). A write that may
    not happen (a file appeared or was opened by the run) or fails goes to a fallback file."""
    saved, notes = [], []
    opened = {**(opened or {}), **profile_inputs(profile)}
    if plan.path("--out") is not None:
        saved.append(("the profile", plan.save("--out", profile.to_json(analysis.to_dict()), opened=opened)))
    if plan.path("--write") is not None:
        text = corrected_text(analysis)
        if text is None:
            notes.append(f"nothing written to {plan.path('--write')}: no finding of this run is a config fix")
        else:
            saved.append(("the corrected config", plan.save("--write", text, opened=opened)))
    if plan.path("--trace") is not None:
        from gpuprof.render.trace import trace_json

        saved.append(("the trace", plan.save("--trace", trace_json(profile, analysis), opened=opened)))
    if plan.path("--html") is not None:
        from gpuprof.render.html import render_html

        saved.append(("the HTML report", plan.save("--html", render_html(profile, analysis), opened=opened)))
    return saved, notes


def profile_inputs(profile) -> dict[str, str]:
    """The files a profile says its run read (the dataset, the script): protected outputs for
    every command that writes files from it (check_writable's `protected` map)."""
    from gpuprof.files import same_file_key

    run = profile.run or {}
    command = run.get("command") if run.get("mode") == "script" else None
    found = [("the run's dataset", run.get("data_path")), ("the run's dataset", profile.sections.storage.data_path),
             ("the run's dataset", (run.get("config") or {}).get("data_path")),
             ("the run's script", run.get("script_file")),  # a module run's command is ["-m", NAME, ...]
             ("the run's script", command[0] if isinstance(command, list) and command and command[0] != "-m" else None)]
    return {same_file_key(p): what for what, p in found if isinstance(p, str) and p}


def emit(profile, analysis, plan: OutputPlan, *, as_json: bool, details: bool = False,
         opened: Optional[dict] = None) -> list[Saved]:
    """Write the planned outputs, then print JSON (--json: the profile with its analysis, as
    --out writes it) or the terminal report, then one line on stderr for each output that is not
    where it was asked for."""
    from gpuprof.render.terminal import render_diagnosis

    saved, notes = write_outputs(plan, profile, analysis, opened=opened)
    console = Console()
    if as_json:
        sys.stdout.write(profile.to_json(analysis.to_dict()) + "\n")
    else:
        render_diagnosis(profile, analysis, console, details=details)
        for what, s in saved:
            if not s.rescued:
                console.print(f"{what.removeprefix('the ')} written to {s.path}", markup=False, highlight=False)
    # Last, on stderr, one line each: what the user must not miss after a long report.
    for note in notes:
        typer.echo(f"gpuprof: note: {note}", err=True)
    report_saved(saved, written=False)  # the written lines went to the report's console above
    return [s for _, s in saved]


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


def exit_for(saved: list[Saved]) -> None:
    """Exit with files.RESCUED_EXIT_CODE (3) when an output is not where it was asked for."""
    if any(s.rescued for s in saved):
        raise typer.Exit(RESCUED_EXIT_CODE)


def corrected_text(analysis) -> Optional[str]:
    """The corrected config in nanoGPT `key = value` format, or None when no finding is a
    config fix."""
    from gpuprof.recommend.config import format_config

    cc = analysis.corrected
    return format_config(cc.overrides, cc.header()) if cc.overrides else None
