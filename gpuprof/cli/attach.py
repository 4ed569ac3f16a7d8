"""`gpuprof attach PID [PID ...]`: diagnose a training run that is already going, from outside it,
without stopping or changing it (gpuprof.attach)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from gpuprof.cli import options
from gpuprof.cli.app import app, guarded
from gpuprof.cli.options import peak_options
from gpuprof.cli.output import emit, exit_for, plan_outputs
from gpuprof.units import count


@app.command("attach")
@guarded
def attach(
    pids: List[int] = typer.Argument(..., help="The PID of the running training process (several: each one's profile, merged as ranks; a torchrun launcher's PID: its ranks; a wrapper's such as `bash run.sh`: refused, naming its Python child)."),
    duration: float = typer.Option(30.0, "--duration", "-d", help="Seconds to sample (Ctrl-C ends it early). Needs two steps or more in it."),
    rate: int = typer.Option(200, "--rate", help="Stack samples per second (py-spy). A step boundary is seen when a sample lands in the loop's once-per-step code (the optimizer step, zero_grad, logging: a few ms): more samples see more of them, and cost the target more CPU."),
    grad_accum: Optional[int] = typer.Option(None, "--grad-accum", help="Micro-steps (backward calls) per optimizer step, when you know them: otherwise inferred from the micro-steps between the step boundaries seen (the report says how sure)."),
    blocking: bool = typer.Option(False, "--blocking/--nonblocking", help="py-spy pauses the target for each sample (exact stacks) instead of reading it while it runs (the default: the target does not notice)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the profile JSON here."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile JSON instead of the report."),
    gpu: Optional[str] = options.GPU,
    peak_tflops: Optional[float] = options.PEAK_TFLOPS,
    force: bool = options.FORCE,
    trace: Optional[Path] = options.TRACE,
    html: Optional[Path] = options.HTML,
    details: bool = options.DETAILS,
):
    """Sample a running training process from outside (py-spy stacks, psutil, NVML) and explain
    where its step's time goes, with the same analysis and report as `diagnose`.

    Nothing is injected into the process and nothing in it changes. Exit codes: 0 done; 2 bad
    target (no such process; not Python, checked before sampling starts: a wrapper's PID such as
    `bash run.sh`'s, and the line names its Python child to give instead, never attached to in its
    place; no permission to read it; no optimizer step in the window), nothing written; 3 an
    output went to the fallback file; 130 Ctrl-C (what was sampled is reported and written)."""
    from gpuprof.analysis.pipeline import AnalysisOptions, analyze
    from gpuprof.attach.run import attach as run_attach, merged

    from gpuprof.attach.process import expand_launchers

    peak_options(peak_tflops)
    plan = plan_outputs({"--out": out, "--trace": trace, "--html": html}, force=force)
    err = Console(stderr=True)
    pids, notes = expand_launchers(list(pids))
    for note in notes:
        err.print(f"gpuprof: {note}", highlight=False, markup=False)
    who = ", ".join(str(p) for p in pids)
    live = err.is_terminal and not as_json
    status = err.status("sampling") if live else None

    def started() -> None:  # after the targets' 2-s baseline without gpuprof (attach.cost)
        err.print(f"gpuprof: attaching to {who} for {duration:g} s (py-spy, {rate} samples/s; Ctrl-C ends it early)",
                  highlight=False, markup=False)
        if status is not None:
            status.start()

    def tick(t: dict) -> None:
        if status is not None:
            left = max(0.0, t["duration_s"] - t["elapsed_s"])
            gone = f"; ended: {', '.join(map(str, t['ended']))}" if t["ended"] else ""
            now = "".join(f"; {pid}: " + ", ".join(filter(None, (
                f"{f['cpu_cores']:.2f} cores" if f.get("cpu_cores") is not None else None,
                f"reads {count(f['read_bytes_s'])}B/s" if f.get("read_bytes_s") is not None else None)))
                for pid, f in (t.get("so_far") or {}).items())
            status.update(f"sampling {who}: {left:.0f} s left{gone}{now} (phase shares come when sampling ends)")

    try:
        result = run_attach(list(pids), duration, rate=rate, nonblocking=not blocking, on_tick=tick,
                            grad_accum=grad_accum, on_start=started)
    finally:
        if status is not None:
            status.stop()
    for pid in result.ended:
        err.print(f"gpuprof: note: process {pid} ended during the attach: what was sampled is reported",
                  highlight=False, markup=False)
    profile = merged(result)
    analysis = analyze(profile, AnalysisOptions(gpu=gpu, peak_tflops=peak_tflops))
    saved = emit(profile, analysis, plan, as_json=as_json, details=details)
    if result.interrupted:
        raise KeyboardInterrupt
    exit_for(saved)
