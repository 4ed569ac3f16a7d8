"""`gpuprof watch SCRIPT ARGS...` (or `-m MODULE ARGS...`): run a training script to its end as a
flight recorder: windows, changes and periodic events as it goes (gpuprof.watch), then diagnose's
report over the whole run with the changes in order."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from gpuprof.analysis.pipeline import AnalysisOptions, analyze
from gpuprof.cli import options
from gpuprof.cli.app import app, guarded
from gpuprof.cli.options import ScriptCommand, launcher_options, own_options, peak_options, script_target
from gpuprof.cli.output import emit, exit_for, plan_outputs
from gpuprof.errors import GpuprofError, InterruptedEmpty, ScriptFailed
from gpuprof.render.watch import WatchDisplay, render_watch_section
from gpuprof.watch.pid import RATE_HZ
from gpuprof.report.watch import watch_section


@app.command(
    "watch",
    cls=ScriptCommand,  # `-m MODULE` ends gpuprof's options (cli.options.split_at_module)
    context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
)
@guarded
def watch(
    ctx: typer.Context,
    script: Optional[str] = typer.Argument(None, help="The training script to run, unmodified, to its end (or --pid)."),
    script_args: Optional[List[str]] = typer.Argument(None, help=options.SCRIPT_ARGS_HELP),
    module: Optional[str] = options.MODULE,
    every: str = typer.Option("30s", "--every", help="Window length: a duration (30s, 5m, 1h) or a step count (100steps)."),
    events: Optional[Path] = typer.Option(None, "--events", help="Write one JSON object per line here: a header, then each window, change and periodic event, flushed and fsync'd as written (an existing file only when it is gpuprof's own events file)."),
    prometheus: Optional[int] = typer.Option(None, "--prometheus", help="Serve the current window's figures as Prometheus metrics on this port (figures only: no command line, environment or path)."),
    prometheus_addr: str = typer.Option("127.0.0.1", "--prometheus-addr", help="The address the metrics port listens on (default: this machine only)."),
    pid: Optional[int] = typer.Option(None, "--pid", help="Watch a training process that is already running, from outside (attach's py-spy sampler, window after window) instead of a script."),
    rate: int = typer.Option(RATE_HZ, "--rate", help="With --pid: py-spy's stack samples per second (attach's default)."),
    grad_accum: Optional[int] = typer.Option(None, "--grad-accum", help="With --pid: micro-steps per optimizer step, when you know them (else inferred, as attach does)."),
    warmup: int = typer.Option(2, help="Steps before the first window (compile, allocator warm-up)."),
    samplers: bool = typer.Option(True, "--samplers/--no-samplers", help="NVML/host sampling and the post-run probes, as diagnose's."),
    post_budget: Optional[float] = typer.Option(None, "--post-budget", help="Seconds the measurements after the run share (default 15)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the whole run's profile JSON here."),
    as_json: bool = typer.Option(False, "--json", help="Print the profile JSON instead of the report (the script's stdout goes to stderr)."),
    gpu: Optional[str] = options.GPU,
    peak_tflops: Optional[float] = options.PEAK_TFLOPS,
    force: bool = options.FORCE,
    details: bool = options.DETAILS,
    nproc_per_node: Optional[int] = options.NPROC_PER_NODE,
    nnodes: Optional[str] = options.NNODES,
    node_rank: Optional[int] = options.NODE_RANK,
    rdzv_endpoint: Optional[str] = options.RDZV_ENDPOINT,
    rdzv_backend: Optional[str] = options.RDZV_BACKEND,
    rdzv_id: Optional[str] = options.RDZV_ID,
    rdzv_conf: Optional[str] = options.RDZV_CONF,
    master_addr: Optional[str] = options.MASTER_ADDR,
    master_port: Optional[int] = options.MASTER_PORT,
    max_restarts: Optional[int] = options.MAX_RESTARTS,
    monitor_interval: Optional[float] = options.MONITOR_INTERVAL,
    local_addr: Optional[str] = options.LOCAL_ADDR,
    standalone: bool = options.STANDALONE,
    rank_timeout: Optional[float] = options.RANK_TIMEOUT,
):
    """Run a training script to its end and record why its step gets slower.

    Every window (--every) gives the typical step, phase shares, tokens/s,
    MFU, the GPU (NVML) and the host; a change of the typical step is
    named with the step where it began, the phase that grew, its likely
    causes and the saving if it were undone; periodic spikes (an eval
    every N steps) are named as periodic, not as changes. At the end (or
    Ctrl-C): diagnose's report over the whole run, then the changes in order.

    -m MODULE ARGS runs a module as `python -m MODULE ARGS` does; gpuprof's
    options come before the script or the module.

    --nproc-per-node N: every rank under watch through torchrun, an events
    file per rank, the rank that fell behind named live (from the ranks'
    events files) and in the report. --pid PID:
    a run that is already going, from outside (attach's py-spy sampler,
    one recording per window).

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
    if pid is not None:
        if script is not None or module is not None:
            raise GpuprofError("give a script to run or --pid PID to watch one that is running, not both")
        return _watch_pid(pid, every=every, events=events, prometheus=prometheus, prometheus_addr=prometheus_addr,
                          rate=rate, grad_accum=grad_accum, out=out, as_json=as_json, gpu=gpu,
                          peak_tflops=peak_tflops, force=force, details=details, err=err)
    script, is_module = script_target(script, module)
    if script is None:
        raise GpuprofError("give the training script to run (gpuprof watch train.py ARGS...) or --pid PID")
    what = f"-m {script}" if is_module else script
    own = own_options(ctx)  # kept out of the script's own argparse (runners.script_inputs)
    opts = WatchOptions(parse_every(every), warmup=warmup, samplers=samplers, post_budget=post_budget,
                        gpu=gpu, peak_tflops=peak_tflops).validate()
    launcher = launcher_options(
        standalone, nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
        rdzv_backend=rdzv_backend, rdzv_id=rdzv_id, rdzv_conf=rdzv_conf, master_addr=master_addr,
        master_port=master_port, max_restarts=max_restarts, monitor_interval=monitor_interval, local_addr=local_addr)
    if nproc_per_node is not None:
        return _watch_ranks(script, list(script_args or []), opts, launcher, standalone, rank_timeout,
                            events=events, prometheus=prometheus, prometheus_addr=prometheus_addr, out=out,
                            as_json=as_json, force=force, details=details, err=err, module=is_module, own=own)
    script_file = str(check_script(script, module=is_module))  # a module: the file python -m would run
    plan = plan_outputs({"--out": out}, force=force, inputs=[("script", script_file)])
    events_file = prepare_events(events, script_file, out)
    exporter = _start_exporter(prometheus, prometheus_addr)
    if not as_json:
        err.print(f"gpuprof: watching {what} until it finishes: "
                  f"{_where(opts.every, events_file, exporter, prometheus_addr, prometheus)}",
                  highlight=False, markup=False)
    try:
        with WatchDisplay(err, what=what, warmup=warmup, steps=None, enabled=not as_json) as live:
            result, _ = run_watch(script, list(script_args or []), opts, events=events_file, exporter=exporter,
                                  display=live, stdout=sys.stderr if as_json else sys.stdout,
                                  module=is_module, own_options=own)
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



class _Lines:
    """watch --pid's display: each window, change and periodic event as a line on stderr."""

    def __init__(self, console: Console, enabled: bool):
        self.console, self.enabled = console, enabled

    def on_event(self, ev: dict) -> None:
        if self.enabled:
            from gpuprof.report.watch import event_lines

            for line in event_lines(ev):
                self.console.print(line, highlight=False, markup=False, soft_wrap=True)


def _where(every, events_file, exporter, addr: str, port: Optional[int]) -> str:
    """'windows of 30s, events to F, metrics on http://ADDR:PORT/metrics': the first line's tail."""
    where = [f"windows of {every.text}"]
    if events_file is not None:
        where.append(f"events to {events_file.path}")
    if exporter is not None:
        where.append(f"metrics on http://{addr}:{port}/metrics")
    return ", ".join(where)


def _start_exporter(prometheus: Optional[int], addr: str):
    if prometheus is None:
        return None
    from gpuprof.watch.prometheus import Exporter

    exporter = Exporter(prometheus, addr)
    exporter.start()  # a port in use: one line, exit 2, before anything runs
    return exporter


def _watch_pid(pid: int, *, every, events, prometheus, prometheus_addr, rate, grad_accum, out, as_json, gpu,
               peak_tflops, force, details, err: Console) -> None:
    """`gpuprof watch --pid PID`: attach's recordings back to back (gpuprof.watch.pid)."""
    from gpuprof.attach.process import open_process
    from gpuprof.watch.changes import RULE
    from gpuprof.watch.pid import check_every, watch_pid
    from gpuprof.watch.run import make_sinks, prepare_events
    from gpuprof.watch.windows import parse_every

    length = check_every(parse_every(every))
    if not 1 <= rate <= 1000:
        raise GpuprofError(f"--rate must be 1 to 1000 samples per second, got {rate}")
    if grad_accum is not None and grad_accum < 1:
        raise GpuprofError(f"--grad-accum must be positive, got {grad_accum}")
    from gpuprof.attach.process import expand_launchers

    ranks, _ = expand_launchers([pid])
    if len(ranks) > 1:
        raise GpuprofError(f"process {pid} is a torchrun launcher of {len(ranks)} ranks (PIDs "
                           f"{', '.join(map(str, ranks))}): watch one rank's PID (`gpuprof attach {pid}` samples them all)")
    if ranks and ranks[0] != pid:
        err.print(f"gpuprof: process {pid} is a torchrun launcher: watching its one rank, process {ranks[0]}",
                  highlight=False, markup=False)
        pid = ranks[0]
    target = open_process(pid, suggest="gpuprof watch --pid {pid}")  # no such process, not Python: one line, exit 2
    plan = plan_outputs({"--out": out}, force=force)
    events_file = prepare_events(events, None, out)
    exporter = _start_exporter(prometheus, prometheus_addr)
    if not as_json:
        err.print(f"gpuprof: watching process {pid} from outside (py-spy, {rate} samples/s) until it ends or "
                  f"Ctrl-C: {_where(length, events_file, exporter, prometheus_addr, prometheus)}",
                  highlight=False, markup=False)
    try:
        if events_file is not None:
            try:
                command = target.cmdline()
            except Exception:  # noqa: BLE001 - the header names what it can
                command = None
            events_file.open({"command": command, "pid": pid, "every": length.to_dict(), "warmup": 0,
                              "change_rule": RULE, "source": "py-spy, from outside the process"})
        result = watch_pid(pid, length, make_sinks(events_file, exporter, _Lines(err, not as_json)), rate=rate,
                           grad_accum=grad_accum)
    finally:
        if events_file is not None:
            events_file.close()
        if exporter is not None:
            exporter.stop()
    if result.last_profile is None:
        why = f" ({result.reasons[-1]})" if result.reasons else ""
        msg = f"process {pid}: no complete training step seen in {result.recorder.windows} windows{why}"
        if result.ended == "interrupted":
            raise InterruptedEmpty(f"interrupted: {msg}")
        raise GpuprofError(msg)
    profile = result.last_profile
    section = result.recorder.section()
    section.update(pid=pid, rate_hz=rate, windows_without_steps=result.windows_without_steps,
                   report_over="the last window with complete steps (attach's profile of it)")
    profile.measurements["watch"] = section
    analysis = analyze(profile, AnalysisOptions(gpu=gpu, peak_tflops=peak_tflops))
    saved = emit(profile, analysis, plan, as_json=as_json, details=details)
    if not as_json:
        render_watch_section(watch_section(section, str(events_file.path) if events_file else None,
                                           events_file.error if events_file else None), Console())
    if result.ended == "interrupted":
        raise KeyboardInterrupt
    exit_for(saved)


def _watch_ranks(script: str, args: list, opts, launcher: dict, standalone: bool, rank_timeout, *, events, prometheus,
                 prometheus_addr, out, as_json, force, details, err: Console, module: bool = False,
                 own=None) -> None:
    """`gpuprof watch --nproc-per-node N train.py`: every rank runs the script under watch
    (gpuprof.runners.rank's watch mode), each with its own events file; this node's ranks are
    merged as diagnose merges them, and each rank's changes follow the report, a rank that fell
    behind named where the others waited for it (gpuprof.watch.ranks)."""
    import uuid

    from gpuprof import session
    from gpuprof.watch.events import check_events_path
    from gpuprof.watch.ranks import rank_sections
    from gpuprof.watch.run import protected_paths, rank_events_path

    from gpuprof.runners.script import check_script

    session.prepare_launch(launcher, standalone, script=script, rank_timeout=rank_timeout, module=module)
    script_file = str(check_script(script, module=module))  # a module: the file python -m would run
    nproc = launcher["nproc_per_node"]
    if prometheus is not None:  # each local rank serves its own port: PORT + LOCAL_RANK, checked free now
        from gpuprof.watch.prometheus import check_ports

        check_ports(prometheus, nproc, prometheus_addr)
    plan = plan_outputs({"--out": out}, force=force, inputs=[("script", script_file)])
    paths = []
    if events is not None:
        protected = protected_paths(script_file, out)
        first = (launcher.get("node_rank") or 0) * nproc  # torchrun gives every node nproc_per_node ranks
        for rank in range(first, first + nproc):
            paths.append(check_events_path(rank_events_path(events, rank), protected))
    if not as_json:
        where = f", events to {rank_events_path(events, 0).name} and one per rank" if events is not None else ""
        if prometheus is not None:
            where += (f", metrics on http://{prometheus_addr}:{prometheus}/metrics (local rank 0) to port "
                      f"{prometheus + nproc - 1} (local rank {nproc - 1})")
        err.print(f"gpuprof: watching {session.shown(script, module)} on {launcher['nproc_per_node']} process(es) "
                  f"per node through torch.distributed.run until it finishes: windows of {opts.every.text}{where}",
                  highlight=False, markup=False)
    # run_id: in every rank's events header; a rank reads only the other ranks' files of this launch
    watch = {"every": opts.every.to_dict(), "events": str(events) if events is not None else None,
             "prometheus_port": prometheus, "prometheus_addr": prometheus_addr, "run_id": uuid.uuid4().hex}
    result = session.run_distributed(launcher, standalone, opts.measure(), script=script, script_args=args,
                                     rank_timeout=rank_timeout, as_json=as_json, watch=watch, module=module,
                                     own_options=own)
    analysis = analyze(result.profile, AnalysisOptions(gpu=opts.gpu, peak_tflops=opts.peak_tflops))
    saved = emit(result.profile, analysis, plan, as_json=as_json, details=details, opened=result.opened)
    if not as_json:
        for rank, section in rank_sections(result.profile):
            path = next((str(p) for p in paths if p.name == rank_events_path(events, rank).name), None) \
                if events is not None else None
            view = watch_section(section, path)
            render_watch_section(dataclasses.replace(view, title=f"{view.title}, rank {rank}"), Console())
    if result.ended == "failed":
        raise ScriptFailed(result.error)
    if result.ended == "interrupted":
        raise KeyboardInterrupt
    exit_for(saved)
