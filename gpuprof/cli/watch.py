"""`gpuprof watch SCRIPT ARGS...`: run a training script to its end as a flight recorder: windows,
changes and periodic events as it goes (gpuprof.watch), then diagnose's report over the whole
run with the changes in order."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from gpuprof.analysis.pipeline import AnalysisOptions, analyze
from gpuprof.cli import options
from gpuprof.cli.app import app, guarded
from gpuprof.cli.options import peak_options
from gpuprof.cli.output import emit, exit_for, plan_outputs
from gpuprof.errors import ScriptFailed
from gpuprof.render.watch import WatchDisplay, render_watch_section
from gpuprof.report.watch import watch_section


@app.command(
    "watch",
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
)
@guarded
def watch(
    script: str = typer.Argument(..., help="The training script to run, unmodified, to its end."),
    script_args: Optional[List[str]] = typer.Argument(None, help="Arguments passed to the script untouched."),
    every: str = typer.Option("30s", "--every", help="Window length: a duration (30s, 5m, 1h) or a step count (100steps)."),
    events: Optional[Path] = typer.Option(None, "--events", help="Write one JSON object per line here: a header, then each window, change and periodic event, flushed and fsync'd as written (an existing file only when it is gpuprof's own events file)."),
    prometheus: Optional[int] = typer.Option(None, "--prometheus", help="Serve the current window's figures as Prometheus metrics on this port (figures only: no command line, environment or path)."),
    prometheus_addr: str = typer.Option("127.0.0.1", "--prometheus-addr", help="The address the metrics port listens on (default: this machine only)."),
    warmup: int = typer.Option(2, help="Steps before the first window (compile, allocator warm-up)."),
    samplers: bool = typer.Option(True, "--samplers/--no-samplers", help="NVML/host sampling and the post-run probes, as diagnose's."),
    post_budget: Optional[float] = typer.Option(None, "--post-budget", help="Seconds the measurements after the run share (default 15)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the whole run's profile JSON here."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile JSON instead of the report (the script's stdout goes to stderr)."),
    gpu: Optional[str] = options.GPU,
    peak_tflops: Optional[float] = options.PEAK_TFLOPS,
    force: bool = options.FORCE,
    details: bool = options.DETAILS,
):
    """Run a training script to its end and record why its step gets slower.

    Every window (--every) gives the typical step, phase shares, tokens/s,
    MFU, the GPU (NVML) and the host; a change of the typical step is
    named with the step where it began, the phase that grew, its likely
    causes and the saving if it were undone; periodic spikes (an eval
    every N steps) are named as periodic, not as changes. At the end (or
    Ctrl-C): diagnose's report over the whole run, then the changes in order.

    Exit codes: 0 done; 1 the script raised (what was measured is
    reported); 2 bad input, nothing ran (an events file that is not
    gpuprof's, a port in use); 3 an output went to a fallback file;
    130 Ctrl-C.
    """
    from gpuprof.runners.script import check_script
    from gpuprof.watch.run import WatchOptions, prepare_events, run_watch
    from gpuprof.watch.windows import parse_every

    err = Console(stderr=True)
    peak_options(peak_tflops)
    opts = WatchOptions(parse_every(every), warmup=warmup, samplers=samplers, post_budget=post_budget,
                        gpu=gpu, peak_tflops=peak_tflops).validate()
    check_script(script)
    plan = plan_outputs({"--out": out}, force=force, inputs=[("script", script)])
    events_file = prepare_events(events, script, out)
    exporter = None
    if prometheus is not None:
        from gpuprof.watch.prometheus import Exporter

        exporter = Exporter(prometheus, prometheus_addr)
        exporter.start()  # a port in use: one line, exit 2, before the script starts
    where = [f"windows of {opts.every.text}"]
    if events_file is not None:
        where.append(f"events to {events_file.path}")
    if exporter is not None:
        where.append(f"metrics on http://{prometheus_addr}:{prometheus}/metrics")
    if not as_json:
        err.print(f"gpuprof: watching {script} until it finishes: {', '.join(where)}", highlight=False, markup=False)
    try:
        with WatchDisplay(err, what=script, warmup=warmup, steps=None, enabled=not as_json) as live:
            result, _ = run_watch(script, list(script_args or []), opts, events=events_file, exporter=exporter,
                                  display=live, stdout=sys.stderr if as_json else sys.stdout)
    except BaseException:
        if exporter is not None:
            exporter.stop()
        raise
    analysis = analyze(result.profile, AnalysisOptions(gpu=gpu, peak_tflops=peak_tflops))
    saved = emit(result.profile, analysis, plan, as_json=as_json, details=details, opened=result.opened)
    if not as_json:
        section = result.profile.measurements.get("watch") or {}
        render_watch_section(watch_section(section, str(events_file.path) if events_file else None,
                                           events_file.error if events_file else None), Console())
    if result.ended == "failed":
        raise ScriptFailed(result.error)
    if result.ended == "interrupted":
        raise KeyboardInterrupt
    exit_for(saved)

