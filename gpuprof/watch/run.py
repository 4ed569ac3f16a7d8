"""Running a script under `gpuprof watch`: diagnose's script runner in its no-stop mode, its timer
in bounded mode, its samplers bounded, and the recorder (gpuprof.watch.recorder) among the
instruments; the events file and the metrics server around the run. A library: no Typer, no
printing (the display passed in shows what it is given).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gpuprof import session
from gpuprof.errors import GpuprofError
from gpuprof.watch.changes import RULE
from gpuprof.watch.counters import BoundedNvml, bounded_instruments
from gpuprof.watch.events import EventsFile, check_events_path
from gpuprof.watch.recorder import Recorder
from gpuprof.watch.windows import Every

KEEP_STEPS = 1024  # steps kept for the final report: a uniform sample of the whole run
# A run of hours needs fewer samples per second than diagnose's few steps, and pays for each on
# every step: the stack sampler takes one sample per two steps (at most every 0.5 s, diagnose:
# two per step, at most every 50 ms); the host and NVML samplers read every 0.5 s (diagnose:
# 0.1 s; gpuprof.watch.counters.SAMPLE_S). Over a long run they still gather thousands.
STACK_PER_STEP = 0.5
STACK_MAX_INTERVAL_S = 0.5
POST_BUDGET_S = 15.0  # the post-run measurements' default budget (diagnose's 25% of a week is not wanted)


@dataclass(frozen=True)
class WatchOptions:
    every: Every
    warmup: int = 2
    samplers: bool = True
    post_budget: float | None = None
    keep_steps: int = KEEP_STEPS
    gpu: str | None = None
    peak_tflops: float | None = None

    def validate(self) -> "WatchOptions":
        if self.warmup < 0:
            raise GpuprofError(f"--warmup must be zero or positive, got {self.warmup}")
        if self.post_budget is not None and not self.post_budget >= 0:
            raise GpuprofError(f"--post-budget must be zero or positive seconds, got {self.post_budget}")
        return self

    def measure(self) -> session.Measure:
        budget = POST_BUDGET_S if self.post_budget is None else self.post_budget
        return session.Measure(steps=1, warmup=self.warmup, stop=False, samplers=self.samplers,
                               post_budget=budget, keep_steps=self.keep_steps, stack_per_step=STACK_PER_STEP,
                               stack_max_interval_s=STACK_MAX_INTERVAL_S).validate()


def mfu_basis(gpu: str | None, peak_tflops: float | None) -> Callable:
    """ctx -> (FLOPs per token by nanoGPT's formula, peak FLOP/s of the device and dtype in use),
    or why there is no MFU per window (the final report's MFU is the analysis's, as diagnose's)."""

    def basis(ctx):
        from gpuprof.analysis.mfu import resolve_peak
        from gpuprof.dims import gpt_flops_per_token, missing_gpt_dims
        from gpuprof.measure.cuda import is_cuda

        cfg = ctx.config or {}
        dims, n = cfg.get("model_dims"), cfg.get("param_count")
        if not dims or missing_gpt_dims(dims, n):
            return "no FLOP formula: the model is not GPT-shaped as far as gpuprof can see"
        per_token = gpt_flops_per_token(dims, n)
        precision = getattr(ctx, "precision", None) or {}
        name = None
        if is_cuda(ctx.device):
            import torch

            name = torch.cuda.get_device_name(torch.device(ctx.device))
        peak = resolve_peak(ctx.device, name, precision.get("compute_dtype") or "fp32",
                            bool(precision.get("tf32_matmul")), gpu=gpu, peak_tflops=peak_tflops)
        if not peak.get("peak_tflops"):
            return "; ".join(peak.get("warnings") or []) or "no peak for this device and dtype"
        return per_token, peak["peak_tflops"] * 1e12

    return basis


def rank_events_path(path: Path, rank: int) -> Path:
    """Under torchrun each rank writes its own events file: run.events.jsonl -> run.events.rank1.jsonl."""
    path = Path(path)
    suffix = path.suffix
    return path.with_name(f"{path.name[:-len(suffix)] if suffix else path.name}.rank{rank}{suffix}")


def prepare_events(path: Path | None, script: str | None, out: Path | None) -> EventsFile | None:
    """The events file checked before the run (one line, exit 2, for a path that would lose
    something), not yet written."""
    if path is None:
        return None
    return EventsFile(check_events_path(Path(path), protected_paths(script, out)))


def protected_paths(script: str | None, out: Path | None) -> dict[str, str]:
    """The files an events file must never be (same_file_key -> what it is): the script, the profile output."""
    from gpuprof.files import same_file_key

    protected = {same_file_key(script): "the script being watched"} if script else {}
    if out is not None:
        protected[same_file_key(out)] = "the --out profile"
    return protected


def make_sinks(events: EventsFile | None, exporter, display) -> list[Callable[[dict], None]]:
    """Where each event goes: the events file, the metrics (a window's figures; a change's count),
    the display."""
    sinks: list = []
    if events is not None:
        sinks.append(events.write)
    if exporter is not None:
        def to_metrics(ev: dict) -> None:
            if ev["kind"] == "window":
                exporter.update(ev)
            elif ev["kind"] == "change":
                exporter.changed()
            elif ev["kind"] == "straggler":
                exporter.straggler(ev["cause"]["evidence"]["rank"])
        sinks.append(to_metrics)
    if display is not None and hasattr(display, "on_event"):
        sinks.append(display.on_event)
    return sinks


def run_watch(script: str, args: list[str], opts: WatchOptions, *, events: EventsFile | None = None,
              exporter=None, display=None, stdout=None, peers=None, header: dict | None = None,
              module: bool = False, own_options=None) -> tuple[session.RunResult, Recorder]:
    """Run the script to its end under watch; (diagnose's RunResult over the whole run, the
    recorder: its windows, changes and periodic events). The events file is opened (its header
    written, with `header`'s keys: a torchrun rank's number and launch id) and the metrics server
    is expected started by the caller; both are closed here, and `peers` (the other ranks' events
    files, gpuprof.watch.ranks.PeerChanges) with them. module, own_options: as session.run_script's
    (`script` a module name run as python -m runs it; gpuprof's options guarded)."""
    from gpuprof.runners.script import check_script

    check_script(script, module=module)
    sinks = make_sinks(events, exporter, display)
    recorder = Recorder(opts.every, opts.warmup, sinks, mfu_basis=mfu_basis(opts.gpu, opts.peak_tflops),
                        peers=peers)

    def adapt(made: list, device: str, data_path) -> list:
        bounded = bounded_instruments(made)
        recorder.attach_nvml(next((i for i in bounded if isinstance(i, BoundedNvml)), None))
        return [recorder, *bounded]  # the recorder stops first: its last window before the probes

    ended = "failed"
    try:
        if events is not None:
            command = ["-m", script, *args] if module else [script, *args]  # as the profile's
            events.open({"command": command, "every": opts.every.to_dict(), "warmup": opts.warmup,
                         "change_rule": RULE, **(header or {})})
        result = session.run_script(script, args, opts.measure(), display, stdout=stdout or sys.stdout,
                                    adapt_instruments=adapt, module=module, own_options=own_options)
        ended = result.ended
    except KeyboardInterrupt:
        ended = "interrupted"
        raise
    finally:
        recorder.end(ended)
        if events is not None:
            events.close()
        if exporter is not None:
            exporter.stop()
        if peers is not None:
            peers.close()
    return result, recorder
