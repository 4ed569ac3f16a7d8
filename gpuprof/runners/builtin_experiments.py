"""Experiment steps in the built-in loop (issue #41): after its measured steps, the loop's own next
steps with each fix gpuprof can switch from outside on and off in ABBA pairs (measure/experiments.py,
the same as a script's: autocast to/from a half precision, TF32 on CUDA, fused AdamW, and with
--measure-compile torch.compile), so the built-in loop's promises are measured on its steps, not on
a copy after the run. Not in a data-parallel run (every rank would have to switch alike) nor with
CUDA graphs (a switch between two graph generations would re-record them)."""

from __future__ import annotations

from typing import Callable

from gpuprof import interrupts
from gpuprof.measure.experiments import Experiments, host_phases_hold, step_figures
from gpuprof.measure.switches import script_switches


class LoopHooks:
    """What Experiments reads of a loop, under the script hooks' names: its timer, its counts (none
    here: the built-in loop's steps are counted by its timer) and the watchers armed around each
    training forward (a per-forward switch: autocast)."""

    def __init__(self, timer):
        self.timer = timer
        self.counts: dict = {}
        self.forward_watchers: list = []

    def arm(self) -> None:
        for w in self.forward_watchers:
            w.arm()

    def disarm(self) -> None:
        for w in reversed(self.forward_watchers):
            w.disarm()


def plan(options: dict | None, *, device: str, precision: dict, autocast_dtype, optimizer, model, compiled: bool,
         budget: Callable, distributed: bool, cudagraphs: bool, timing: bool) -> Experiments | None:
    """The run's experiments, or None where they do not run (see the module doc). options: {"compile":
    bool} (--measure-compile), None: off (--no-experiments)."""
    if options is None or distributed or cudagraphs or not timing:
        return None
    return Experiments(lambda: script_switches(device, precision, autocast_dtype, optimizer, model, compiled=compiled,
                                               measure_compile=bool(options.get("compile"))), budget,
                       host_phases=host_phases_hold(device))


def run(experiments: Experiments, hooks: LoopHooks, one_step: Callable[[], None]) -> bool:
    """The experiment steps, one `one_step()` each while the experiments want another. Returns True
    when Ctrl-C stopped them (the measured steps stand; every switch is restored either way). A step
    that raises (a model that fails under a fix) ends the experiments with that failure recorded."""
    try:
        with interrupts.interruptible():
            while experiments.next_step(hooks):
                one_step()
    except KeyboardInterrupt:
        hooks.timer.abandon_step()
        experiments.finish()
        return True
    except Exception as exc:  # noqa: BLE001 - the fix's failure, kept in its result; the run stands
        hooks.timer.abandon_step()
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        experiments.failed({"type": exc.__class__.__name__, "message": str(exc),
                            "file": tb.tb_frame.f_code.co_filename if tb else None, "line": tb.tb_lineno if tb else None})
    experiments.finish()
    return False


def section(experiments: Experiments | None, every: list, device) -> dict | None:
    """measurements.experiments from the experiment steps' records (GPU timeline where there is one)."""
    if experiments is None or experiments.planned is None:
        return None
    return experiments.section(*step_figures(every, experiments.indices(), device))
