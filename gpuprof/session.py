"""Running a target under gpuprof — the built-in loop, a training script, or a torchrun job of
either — into a RunResult: the Profile, how the run ended, and the files it opened. A library:
no Typer, no report (the CLI analyses and prints); what it shows while a run goes is the live
display the caller passes in (gpuprof.render.live).

Ends: "finished" or "stopped" (the script was stopped after its steps) are successes;
"failed" (the script or a rank raised: `error` is one line naming it) and "interrupted"
(Ctrl-C, SIGTERM) keep the steps already measured. Bad input is a GpuprofError before anything
runs.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

from gpuprof.errors import GpuprofError, ScriptFailed, one_line
from gpuprof.measure.cuda import is_cuda
from gpuprof.profile import Profile

# Per-device defaults for the built-in loop: small enough that the default run finishes in
# well under a minute on a 2-core CPU; nanoGPT's GPT-2 settings on a GPU.
CPU_DEFAULTS = dict(model="tiny", batch_size=8, block_size=256, grad_accum=4, dtype="fp32")
CUDA_DEFAULTS = dict(model="gpt2", batch_size=16, block_size=1024, grad_accum=4, dtype="bf16")
DEFAULT_RANK_TIMEOUT_S = 600.0


@dataclass
class RunResult:
    """How a run ended and what it measured (profile None: not one complete step)."""

    profile: Profile | None
    ended: str  # finished | stopped | failed | interrupted
    error: str | None = None  # the failure in one line ("rank 1 failed first at ...: ...")
    opened: dict = field(default_factory=dict)  # files the run opened: outputs never replace them


@dataclass(frozen=True)
class Measure:
    """How much to measure: warmup + measured steps, whether a script is stopped after them,
    the samplers and probes, the seconds the post-run measurements share."""

    steps: int = 10
    warmup: int = 2
    stop: bool = True
    samplers: bool = True
    post_budget: float | None = None
    measure_compile: bool = False  # time the eager model compiled after the run (outside the budget)
    # experiment steps in the run's own loop (a script's or the built-in one) after its measured steps (gpuprof.measure.experiments)
    experiments: bool = True
    keep_steps: int | None = None  # bounded memory (watch): a uniform sample of this many steps is kept
    # the stack sampler's rate: samples per step, and its longest period (watch samples less)
    stack_per_step: float = 2.0
    stack_max_interval_s: float = 0.05

    def validate(self) -> "Measure":
        if self.steps <= 0:
            raise GpuprofError(f"--steps must be positive, got {self.steps}")
        if self.warmup < 0:
            raise GpuprofError(f"--warmup must be zero or positive, got {self.warmup}")
        if self.post_budget is not None and not self.post_budget >= 0:
            raise GpuprofError(f"--post-budget must be zero or positive seconds, got {self.post_budget}")
        return self


def builtin_config(measure: Measure, *, device: str | None = None, model: str | None = None,
                   dtype: str | None = None, **options):
    """The built-in loop's LoopConfig: the device's defaults, then what the user gave (a None
    option takes the default; any value given, 0 included, is validated by LoopConfig)."""
    import torch

    from gpuprof.runners.builtin import LoopConfig, bf16_native, default_device

    dev = device or default_device()
    defaults = CUDA_DEFAULTS if is_cuda(dev) else CPU_DEFAULTS
    if is_cuda(dev) and torch.cuda.is_available() and not bf16_native(dev):
        defaults = dict(defaults, dtype="fp16")
    given = {k: v for k, v in options.items() if v is not None}
    sizes = {k: given.pop(k, defaults[k]) for k in ("batch_size", "block_size", "grad_accum")}
    cfg = LoopConfig(model=model or defaults["model"], dtype=dtype or defaults["dtype"], device=dev,
                     steps=measure.steps, warmup=measure.warmup, **sizes, **given)
    cfg.validate()
    return cfg


def _instruments(samplers: bool, measure_compile: bool = False):
    from gpuprof.measure.instruments import diagnose_instruments

    return lambda dev, data: diagnose_instruments(dev, data, samplers, measure_compile)


def run_builtin(cfg, measure: Measure, display=None) -> RunResult:
    """The built-in GPT loop in this process. `display`: a render.live.LiveProgress (or None)."""
    from gpuprof.runners.builtin import run_builtin as loop

    instruments = _instruments(measure.samplers, measure.measure_compile)(cfg.device, cfg.data)
    if display is not None and hasattr(display, "watch"):
        display.watch(instruments)
    profile = loop(cfg, instruments=instruments, post_budget_s=measure.post_budget,
                   on_step_record=getattr(display, "on_step", None), on_progress=getattr(display, "on_post", None),
                   experiments={"compile": measure.measure_compile} if measure.experiments else None)
    ended = "interrupted" if profile.run.get("ended") == "interrupted" else "finished"
    return RunResult(profile, ended)


def shown(script: str, module: bool = False) -> str:
    """The script as the user wrote it: `train.py`, or `-m scripts.base_train` for a module."""
    from gpuprof.runners.script_module import shown as module_shown

    return module_shown(script) if module else script


def run_script(script: str, args: list[str], measure: Measure, display=None, *, stdout=None,
               adapt_instruments: Callable[[list, str, str | None], list] | None = None,
               module: bool = False, own_options=None) -> RunResult:
    """A training script, unmodified, in this process under the hooks; the files it opened are
    recorded (gpuprof.measure.opened). GpuprofError when it is not a runnable script or never
    completes a training step without failing or being stopped. adapt_instruments(instruments,
    device, data_path) -> the instruments to run instead of diagnose's (`watch` adds its recorder
    and bounds the samplers' memory). module: `script` is a module name, run as python -m runs it.
    own_options (runners.script_inputs.OwnOptions): the verb's options, guarded against going to
    the script (ScriptOptionError, exit 2) and named in the error of a script that failed on one."""
    from gpuprof.measure.opened import OpenedFiles
    from gpuprof.runners.script import check_script, run_script as run

    check_script(script, module=module)
    made: list = []

    def instruments(dev, data):
        made[:] = _instruments(measure.samplers, measure.measure_compile)(dev, data)
        if adapt_instruments is not None:
            made[:] = adapt_instruments(list(made), dev, data)
        if display is not None and hasattr(display, "watch"):
            display.watch(made)
        return made

    with OpenedFiles() as opened:
        result = run(script, args, steps=measure.steps, warmup=measure.warmup, stop=measure.stop,
                     instruments_factory=instruments, stdout=stdout or sys.stdout,
                     post_budget_s=measure.post_budget, on_progress=getattr(display, "on_post", None),
                     on_step_record=getattr(display, "on_step", None), keep_steps=measure.keep_steps,
                     stack_rate=(measure.stack_per_step, measure.stack_max_interval_s),
                     module=module, own_options=own_options,
                     experiments={"compile": measure.measure_compile} if measure.experiments else None)
    if result.profile is None:
        raise _no_profile_error(script, result, module=module, args=args, own_options=own_options)
    steps = len(result.profile.steps) + len(result.profile.warmup_steps)
    error = (f"{result.error_line} (the script failed after {steps} complete steps)"
             if result.ended == "failed" else None)
    return RunResult(result.profile, result.ended, error, opened.protected())


def _no_profile_error(script: str, result, *, module: bool = False, args: list[str] = (),
                      own_options=None) -> GpuprofError:
    c = result.counts
    seen = (f"saw {c.get('forward', 0)} training forwards, {c.get('eval_forward', 0)} no_grad forwards, "
            f"{c.get('backward', 0)} backward calls, {c.get('optimizer_step', 0)} optimizer steps")
    script = shown(script, module)
    if result.ended == "failed":
        message = (result.error or {}).get("message")
        hints = [own_options.hint(list(args), message) if own_options is not None else None,
                 None if module else import_hint(script, result.error)]
        hints = [h for h in hints if h]
        return ScriptFailed(f"{result.error_line} (before the first complete training step: nothing measured)"
                            + "".join(f"; {h}" for h in hints))
    if result.ended == "interrupted":
        return GpuprofError(f"interrupted before the first complete training step ({seen})")
    if result.no_step:
        return GpuprofError(
            f"{script}: no training step seen, so the script was stopped: {result.no_step} (an inference "
            f"script, or a loop gpuprof cannot follow); it {seen}")
    return GpuprofError(
        f"{script} ended without a complete training step: gpuprof ends a step at an optimizer step, "
        f"or without an optimizer at a zero_grad or the next forward after a backward; it {seen}")


def import_hint(script: str, error: dict | None) -> str | None:
    """A script run by its path that cannot import a package that is in the working directory
    (`from nanochat.gpt import GPT` in scripts/base_train.py): python -m would find it."""
    import re

    found = re.match(r"No module named '([^'.]+)", str((error or {}).get("message") or ""))
    if not found or (error or {}).get("type") != "ModuleNotFoundError":
        return None
    top = found.group(1)
    if not (os.path.isdir(top) or os.path.isfile(f"{top}.py")):
        return None
    rel = os.path.relpath(os.path.abspath(script))
    if rel.startswith("..") or not rel.endswith(".py"):
        return None
    name = rel[:-3].replace(os.sep, ".")
    return (f"'{top}' is in the current folder, which `python -m` puts first on the path: run the script "
            f"as a module, -m {name}")


# ------------------------------------------------------------------------------ data parallel
def check_world_divides(grad_accum: int, nproc: int, nnodes: Optional[str]) -> None:
    """The built-in loop divides grad_accum by the world size (nanoGPT): refuse it before launching
    when a fixed world size does not divide it."""
    try:
        lo, _, hi = str(nnodes or "1").partition(":")
        nodes = int(lo) if not hi or lo == hi else None
    except ValueError:
        raise GpuprofError(f"--nnodes must be N or MIN:MAX, got {nnodes!r}") from None
    if nodes is not None and grad_accum % (nproc * nodes):
        raise GpuprofError(f"--grad-accum {grad_accum} is not a multiple of the world size {nproc * nodes} "
                           f"(each rank runs grad_accum / world_size micro-steps, as nanoGPT)")


def prepare_launch(launcher: dict, standalone: bool, *, script: str | None, builtin=None,
                   rank_timeout: float | None = None, module: bool = False) -> None:
    """Everything a data-parallel launch is refused for, before anything starts: the launcher
    options (torchrun's own validation), the rank timeout, the script, what the node can run."""
    from gpuprof.runners.launch import check_capacity, check_launcher

    nproc = launcher.get("nproc_per_node")
    if nproc is None or nproc < 1:
        raise GpuprofError(f"--nproc-per-node must be a positive number of processes, got {nproc}")
    if rank_timeout is not None and not rank_timeout > 0:
        raise GpuprofError(f"--rank-timeout must be positive seconds, got {rank_timeout}")
    if script is not None:
        from gpuprof.runners.script import check_script

        check_script(script, module=module)
    else:
        check_world_divides(builtin.grad_accum, nproc, launcher.get("nnodes"))
    check_launcher(launcher, standalone)
    check_capacity(nproc, **_rank_needs(builtin))


def _rank_needs(builtin) -> dict:
    """What one rank of this node needs (runners.launch.check_capacity): a GPU of its own when it
    runs on CUDA (the built-in loop's device; a script's whenever CUDA is here), and for a CPU rank
    of the built-in loop the memory model's estimate of its model, batch and optimizer state."""
    import torch

    if builtin is None:
        return {"cuda": torch.cuda.is_available()}
    if is_cuda(builtin.device):
        return {"cuda": True}
    from gpuprof.preflight import check_memory

    est = check_memory(builtin, capacity=(2**62, "unbounded")).estimate
    return {"cuda": False, "rank_bytes": int(est.total_bytes),
            "rank_bytes_source": "for the model, its batch and its optimizer state (memory model)"}


def run_distributed(launcher: dict, standalone: bool, measure: Measure, *, script: str | None = None,
                    script_args: list[str] = (), builtin=None, rank_timeout: float | None = None,
                    as_json: bool = False, watch: dict | None = None, module: bool = False,
                    own_options=None) -> RunResult:
    """A torchrun launch of the script or the built-in loop (in DDP) on every local rank, this
    node's ranks merged (gpuprof.merge). `error`: the rank that failed first, where every rank
    was. watch: each rank runs the script under `gpuprof watch` instead (gpuprof.runners.rank's
    watch mode: {"every", "warmup", "events"}). module: `script` is a module name, each rank runs
    it as python -m does, from this process's working directory (the ranks inherit it; the spec
    names it too). own_options: as run_script's. Call prepare_launch first."""
    from gpuprof.merge import merge_entries
    from gpuprof.runners.launch import first_failure, launch

    spec = {"steps": measure.steps, "warmup": measure.warmup, "stop": measure.stop, "samplers": measure.samplers,
            "post_budget": measure.post_budget, "measure_compile": measure.measure_compile, "rank_timeout": rank_timeout or DEFAULT_RANK_TIMEOUT_S,
            "json": as_json}
    if script is not None:
        spec.update(module=module, cwd=os.getcwd(),
                    own_options=own_options.to_dict() if own_options is not None else None)
    if watch is not None:
        spec.update(mode="watch", script=script, args=list(script_args), watch=watch)
    elif script is not None:
        spec.update(mode="script", script=script, args=list(script_args))
    else:
        spec.update(mode="builtin", builtin=asdict(builtin))
    result = launch(spec, launcher, standalone=standalone)
    if not result.entries:
        raise ScriptFailed(result.problem or "no rank of this node reported (torchrun's messages are above)")
    leaked = next((e["error"] for e in result.entries
                   if (e.get("error") or {}).get("type") == "ScriptOptionError"), None)
    if leaked is not None:  # gpuprof's option after the script: bad input, as in one process
        from gpuprof.runners.script_inputs import ScriptOptionError

        raise ScriptOptionError(one_line(leaked.get("message")))
    try:
        merged = merge_entries(result.entries)
    except GpuprofError as exc:  # no rank has a step: each rank's error, exit 1 as a failed script
        hint = own_options.hint(list(script_args), str(exc)) if own_options is not None and script else None
        raise ScriptFailed(str(exc) + (f"; {hint}" if hint else "")) from None
    if result.interrupted:  # gpuprof was stopped: a rank that failed after that lost its peers to the stop
        return RunResult(merged, "interrupted", opened=result.opened)
    first = first_failure(result.entries)
    if first is not None:
        failed = [e for e in result.entries if e["status"] in ("failed", "missing")]
        err = first.get("error") or {}
        where = f" at {err['file']}:{err['line']}" if err.get("file") else ""
        others = f"; {len(failed) - 1} other rank(s) failed after it" if len(failed) > 1 else ""
        return RunResult(merged, "failed",
                         f"rank {first['rank']} failed first{where}: {err.get('type', 'error')}: "
                         f"{one_line(err.get('message'))}{others}{_stuck(result.entries)} "
                         f"(what every rank measured is merged)", opened=result.opened)
    ended = "interrupted" if any(e["status"] == "interrupted" for e in result.entries) else "finished"
    return RunResult(merged, ended, opened=result.opened)


def _stuck(entries: list[dict]) -> str:
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


# ------------------------------------------------------------------------------------ verify
# nanoGPT config key -> (built-in loop option, value mapping); LoopConfig.validate normalises
# the dtype ('bfloat16' -> 'bf16') and refuses an unknown one
LOOP_KEYS = {"batch_size": ("batch_size", int), "gradient_accumulation_steps": ("grad_accum", int),
             "block_size": ("block_size", int), "dtype": ("dtype", str),
             "compile": ("compile", bool), "pin_memory": ("pin_memory", bool)}


def top_config_fix(analysis):
    """The highest-ranked fix with a saving and nanoGPT config overrides: what --verify applies."""
    return next((f for f in analysis.findings
                 if f.kind == "fix" and f.config_overrides and (f.saving_s or 0) > 0), None)


def loop_config_with(cfg, overrides: dict):
    """The built-in loop's config with the overrides applied; GpuprofError for a key it has not."""
    import dataclasses

    changes = {}
    for key, value in overrides.items():
        if key not in LOOP_KEYS:
            raise GpuprofError(f"--verify: the built-in loop has no option for `{key}`")
        name, conv = LOOP_KEYS[key]
        changes[name] = conv(value)
    fixed = dataclasses.replace(cfg, **changes)
    fixed.validate()
    return fixed


def script_change(args: list[str], overrides: dict, config: dict, world_size: int = 1) -> tuple[list[str], dict] | None:
    """The script's arguments and environment with a fix applied in its own terms
    (analysis/script_knobs.py): `--flag=value` appended for an argparse flag (the last occurrence
    wins), an environment variable it reads set; None when a setting has no knob, or a store_true
    flag would have to be removed."""
    from gpuprof.analysis.script_knobs import find_knobs, in_script_terms

    knobs = find_knobs(config, world_size)
    terms = in_script_terms(overrides, knobs)
    if terms is None:
        return None
    env_names = {k.name for k in knobs.by_setting.values() if k.kind == "env"}
    args2, env = list(args), {}
    for name, value in terms[1].items():
        if name in env_names:
            env[name] = str(value)
        elif value is True:
            args2.append(name)
        elif value is False:
            return None
        elif name.startswith("-"):
            args2.append(f"{name}={value}")
        else:
            args2.append(f"--{name}={value}")
    return args2, env


def script_args_with(args: list[str], overrides: dict, defined: dict) -> tuple[list[str], dict]:
    """The script's arguments with `--key=value` appended for the keys the script defines
    (nanoGPT's configurator convention: later overrides win)."""
    usable = {k: v for k, v in overrides.items() if k in defined}
    return [*args, *(f"--{k}={v}" for k, v in usable.items())], usable

