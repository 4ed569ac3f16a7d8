"""The instruments a diagnose run carries, in the order they must stop.

Instruments stop in list order: the sync counter first (it only restores a torch setting), the
dynamo records (graph breaks and recompiles; torch's logging restored before anything after the
run compiles), the storage facts (a residency read), the all-reduce meter of a data-parallel rank (arithmetic
over its marks), then the samplers (so later work does not pollute their
samples), then the post-run measurements that compute, which share one time budget
(measure/budget.py): the copy bandwidths, the matmul ceiling and precisions (first: the precision
rule can be the biggest fix), the FLOP count (its forward also traces how attention is computed),
the compute fixes timed changed (attention, vocabulary, optimizer: measure/kernels.py), the
micro-batch curve. The NVML sampler and the copy
bandwidth probe are only added for CUDA devices.

An instrument must never take the run down: `start_instruments` and `stop_instruments` run each
one guarded, and a failure becomes `measurements[name] = {"not_measured": "<reason>"}`, which
the report prints as "not measured: <reason>"."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable

from gpuprof import interrupts
from gpuprof.measure.comm import CommMeter
from gpuprof.measure.compiled import CompileProbe
from gpuprof.measure.copies import CopyBandwidthProbe
from gpuprof.measure.cuda import is_cuda
from gpuprof.measure.dynamo import DynamoRecords
from gpuprof.measure.flops import FlopsInstrument
from gpuprof.measure.host import HostSampler
from gpuprof.measure.kernels import ComputeFixesProbe
from gpuprof.measure.microbatch import MicroBatchProbe
from gpuprof.measure.nvml import NvmlSampler
from gpuprof.measure.probe import CeilingProbe
from gpuprof.measure.storage import StorageFacts
from gpuprof.measure.syncs import SyncCounter


def default_instruments(device: str, data_path: str | None, *, samplers: bool = True,
                        interval_s: float = 0.1, microbatch: bool = True, flops: bool = True,
                        probe: bool = True, measure_compile: bool = False) -> list:
    """Instruments for a run on `device` reading `data_path` (None: taken from the run).
    measure_compile: time the model compiled after everything else (outside the budget)."""
    # DynamoRecords stops early: torch's logging is restored before the post-run work compiles anything.
    out: list = [SyncCounter(), DynamoRecords(), StorageFacts(data_path)]
    # a rank under torchrun, one rank too (its DDP all-reduces, across no link: the GPU check on
    # an H200 found a one-rank NCCL run with no `comm` when this asked for WORLD_SIZE > 1)
    if "WORLD_SIZE" in os.environ:
        out.append(CommMeter())
    if samplers and is_cuda(device):
        out.append(NvmlSampler(interval_s))
    if samplers:
        out.append(HostSampler(interval_s, data_path))
    if probe and is_cuda(device):
        out.append(CopyBandwidthProbe())
    if probe:
        out.append(CeilingProbe())
    if flops:
        out.append(FlopsInstrument())
    if probe:
        out.append(ComputeFixesProbe())
    if microbatch:
        out.append(MicroBatchProbe())
    if measure_compile:
        out.append(CompileProbe())
    return out


def diagnose_instruments(device: str, data_path: str | None, samplers: bool, measure_compile: bool = False) -> list:
    """What `diagnose` carries (one process or a rank): --no-samplers also drops the probes."""
    return default_instruments(device, data_path, samplers=samplers, probe=samplers, measure_compile=measure_compile)


def _reason(exc: BaseException) -> str:
    return f"{exc.__class__.__name__}: {exc}"


def guarded(fn: Callable, problems: dict, name: str):
    """fn() or, when it raises, None with the reason stored at problems[name]."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - post-run work never loses the run
        problems[name] = _reason(exc)
        return None


def start_instruments(instruments: list, ctx) -> tuple[list, dict]:
    """Start each instrument; (those that started, {name: why one did not})."""
    started, problems = [], {}
    for inst in instruments:
        try:
            inst.start(ctx)
            started.append(inst)
        except Exception as exc:  # noqa: BLE001 - an instrument must not take the run down
            problems[getattr(inst, "name", repr(inst))] = f"start failed: {_reason(exc)}"
    return started, problems


@contextlib.contextmanager
def _interrupts_never_lost(budget):
    """Ctrl-C that Python cannot raise where it lands — in a finalizer (`__del__`, a weakref
    callback: torch.library's run while the FLOP count tears down) — is "ignored" there with a
    traceback on stderr, and the work went on. Here it is the post-run budget's interrupt: no
    traceback, the remaining parts skip, the run ends interrupted."""
    before = sys.unraisablehook

    def hook(unraisable):
        if budget is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            budget.interrupt()
            return
        before(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = before


def stop_instruments(instruments: list, ctx, budget=None) -> dict:
    """Stop each instrument in order; {name: its section, or {"not_measured": reason}}.

    budget: a PostRunBudget the post-run measurements share (set as ctx.budget); its report is
    the `post_run` section."""
    with _interrupts_never_lost(budget):
        return _stop_each(instruments, ctx, budget)


def _stop_noted(budget) -> None:
    """A stop noted since the run ended (gpuprof.interrupts): the post-run parts get no more time."""
    if interrupts.take() and budget is not None:
        budget.interrupt()


def _stop_each(instruments: list, ctx, budget) -> dict:
    sections = {}
    if budget is not None:
        ctx.budget = budget
    _stop_noted(budget)
    for inst in instruments:
        name = getattr(inst, "name", repr(inst))
        _stop_noted(budget)
        try:
            with interrupts.interruptible():  # a stop during a part ends that part, not the profile
                section = inst.stop(ctx)
        except KeyboardInterrupt:  # Ctrl-C, or torchrun stopping this rank: keep what was measured
            section = {"not_measured": "interrupted (Ctrl-C or the launcher) after the run"}
            if budget is not None:
                budget.interrupt()  # the remaining parts still stop (restore settings), with no time
        except Exception as exc:  # noqa: BLE001 - e.g. a CUDA error in a post-run probe
            section = {"not_measured": f"{name} failed: {_reason(exc)}"}
        if budget is not None:
            budget.close_open(f"{name} stopped early: {(section or {}).get('not_measured', 'no report')}")
        if section is not None:
            sections[name] = section
    if budget is not None:
        _settle(sections, ctx, budget)
        sections["post_run"] = budget.report()
    return sections


def _settle(sections: dict, ctx, budget) -> None:
    """What is left of the budget, on the rounds that would order two tied fixes (measure/settle.py)."""
    from gpuprof.measure.settle import NAME, settle

    _stop_noted(budget)
    if budget.interrupted:
        return
    try:
        with interrupts.interruptible():
            out = settle(sections, ctx, budget)
    except KeyboardInterrupt:
        out = {"not_measured": "interrupted (Ctrl-C or the launcher) after the run"}
        budget.interrupt()
    except Exception as exc:  # noqa: BLE001 - the rounds already measured stand
        out = {"not_measured": f"{NAME} failed: {_reason(exc)}"}
    budget.close_open(f"{NAME} stopped early")
    if out is not None:
        sections[NAME] = out
