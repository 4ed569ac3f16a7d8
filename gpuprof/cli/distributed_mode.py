"""`gpuprof diagnose --nproc-per-node N [launcher options] [SCRIPT ARGS...]`: a data-parallel run
launched through torch.distributed.run, every rank instrumented, this node's ranks merged.

Exit codes as for one process: 0 done; 1 a rank failed (the others' profiles are merged and the
failed rank is named with its error); 2 bad input; 3 an output went to a fallback file; 130
Ctrl-C (what was measured is still merged and written).
"""

from __future__ import annotations

from typing import Optional

from rich.console import Console

from gpuprof.cli.output import emit, exit_for
from gpuprof.errors import GpuprofError, ScriptFailed
from gpuprof.files import OutputPlan

DEFAULT_RANK_TIMEOUT_S = 600.0


def check_world_divides(grad_accum: int, nproc: int, nnodes: Optional[str]) -> None:
    """The built-in loop divides grad_accum by the world size (nanoGPT): refuse it before launching
    when a fixed world size does not divide it."""
    if nproc is None or nproc < 1:
        raise GpuprofError(f"--nproc-per-node must be a positive number of processes, got {nproc}")
    try:
        lo, _, hi = str(nnodes or "1").partition(":")
        nodes = int(lo) if not hi or lo == hi else None
    except ValueError:
        raise GpuprofError(f"--nnodes must be N or MIN:MAX, got {nnodes!r}") from None
    if nodes is not None and grad_accum % (nproc * nodes):
        raise GpuprofError(f"--grad-accum {grad_accum} is not a multiple of the world size {nproc * nodes} "
                           f"(each rank runs grad_accum / world_size micro-steps, as nanoGPT)")


def diagnose_distributed(*, script: Optional[str], script_args: list[str], launcher: dict, standalone: bool,
                         builtin: Optional[dict], steps: int, warmup: int, stop: bool, samplers: bool,
                         post_budget: Optional[float], rank_timeout: Optional[float], plan: OutputPlan,
                         as_json: bool, gpu: Optional[str], peak_tflops: Optional[float],
                         reported_mfu: Optional[float], disk: Optional[dict], err: Console,
                         details: bool = False) -> None:
    from gpuprof.analysis.pipeline import analyze_profile
    from gpuprof.merge import merge_entries, one_line
    from gpuprof.runners.launch import check_capacity, check_launcher, first_failure, launch

    nproc = launcher.get("nproc_per_node")
    if nproc is None or nproc < 1:
        raise GpuprofError(f"--nproc-per-node must be a positive number of processes, got {nproc}")
    if rank_timeout is not None and not rank_timeout > 0:
        raise GpuprofError(f"--rank-timeout must be positive seconds, got {rank_timeout}")
    spec = {"steps": steps, "warmup": warmup, "stop": stop, "samplers": samplers, "post_budget": post_budget,
            "rank_timeout": rank_timeout or DEFAULT_RANK_TIMEOUT_S, "json": as_json}
    if script is not None:
        from gpuprof.runners.script import check_script

        check_script(script)
        spec.update(mode="script", script=script, args=script_args)
        what = script
    else:
        spec.update(mode="builtin", builtin=builtin)
        what = f"the built-in loop ({builtin['model']}, DDP)"
    check_launcher(launcher, standalone)  # a bad option: one line, exit 2, before the banner
    check_capacity(nproc, **_rank_needs(builtin))  # what this node cannot run: exit 2, nothing started
    nodes = launcher.get("nnodes") or "1"
    err.print(f"gpuprof: launching {what} on {nproc} process(es) per node, {nodes} node(s), through "
              f"torch.distributed.run; {warmup} warmup + {steps} measured steps per rank", highlight=False)
    result = launch(spec, launcher, standalone=standalone)
    if not result.entries:
        raise ScriptFailed(result.problem or "no rank of this node reported (torchrun's messages are above)")
    try:
        merged = merge_entries(result.entries)
    except GpuprofError as exc:  # no rank has a step: each rank's error, exit 1 as a failed script
        raise ScriptFailed(str(exc)) from None
    findings = analyze_profile(merged, gpu=gpu, peak_tflops=peak_tflops, reported_mfu_pct=reported_mfu,
                               disk=disk)
    saved = emit(merged, findings, plan, as_json=as_json, details=details, opened=result.opened)
    if result.interrupted:  # gpuprof was stopped: a rank that failed after that lost its peers to the stop
        raise KeyboardInterrupt
    first = first_failure(result.entries)
    if first is not None:
        failed = [e for e in result.entries if e["status"] in ("failed", "missing")]
        err_ = first.get("error") or {}
        where = f" at {err_['file']}:{err_['line']}" if err_.get("file") else ""
        others = (f"; {len(failed) - 1} other rank(s) failed after it" if len(failed) > 1 else "")
        raise ScriptFailed(f"rank {first['rank']} failed first{where}: {err_.get('type', 'error')}: "
                           f"{one_line(err_.get('message'))}{others}{_stuck(result.entries, first)} "
                           f"(what every rank measured is merged)")
    if any(e["status"] == "interrupted" for e in result.entries):
        raise KeyboardInterrupt
    exit_for(saved)


def _rank_needs(builtin: Optional[dict]) -> dict:
    """What one rank of this node needs (runners.launch.check_capacity): a GPU of its own when it
    runs on CUDA (the built-in loop's device; a script's whenever CUDA is here), and for a CPU rank
    of the built-in loop the memory model's estimate of its model, batch and optimizer state."""
    import torch

    if builtin is None:
        return {"cuda": torch.cuda.is_available()}
    if str(builtin.get("device", "")).startswith("cuda"):
        return {"cuda": True}
    from gpuprof.preflight import check_memory
    from gpuprof.runners.builtin import LoopConfig

    est = check_memory(LoopConfig(**builtin), capacity=(2**62, "unbounded")).estimate
    return {"cuda": False, "rank_bytes": int(est.total_bytes),
            "rank_bytes_source": "for the model, its batch and its optimizer state (memory model)"}


def _stuck(entries: list[dict], first: dict) -> str:
    """Where each rank was in its unfinished step when the run ended (the phase that took its
    time): a collective timeout fails the rank that waited, not the one that hung, so the facts
    of every rank are given, not a guess."""
    where = []
    for e in entries:
        at = ((e.get("profile") or {}).get("run") or {}).get("ended_in")
        if at:
            where.append(f"rank {e['rank']} {at['longest']} {at['longest_s']:.1f} s")
    if len(where) < 2:
        return ""
    return "; in the unfinished step: " + ", ".join(where)
