"""A user's training script, unmodified, run in-process under gpuprof's hooks.

The script runs as `__main__` with `sys.argv = [script, *args]` and `sys.path[0]` = its folder,
as `python script.py args` would set them (the working directory is left alone); with
module=True, `script` is a module name run as `python -m script args` runs it
(gpuprof.runners.script_module: sys.path[0] = the working directory, its parent packages
imported, `__spec__`/`__package__` set, sys.argv[0] = its file). While it runs,
gpuprof.runners.script_inputs records what it reads from its command line (argparse) and its
environment, and stops it (exit 2) when gpuprof's own option went after it. The hooks of
gpuprof.measure.hooks turn its own calls into phases and steps; at the first forward the run's
state (gpuprof.runners.script_state) reads its configuration, wraps its data functions and starts
the stack sampler and the instruments. After warmup+steps steps (gpuprof.measure.step_rules: an
optimizer step, or in a loop without one a parameter update or a loop iteration) the script is
stopped (StopScript, a BaseException), and so is a script that shows no step within a bound. Its stdout/stderr are teed: the user sees them live, and nanoGPT
`iter`/`step` lines are parsed. The run ends in a ScriptRun: its profile
(gpuprof.runners.script_profile) and how it ended.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
import types
import warnings
from dataclasses import dataclass, field
from importlib.machinery import SourceFileLoader
from pathlib import Path
from typing import Callable

from gpuprof import interrupts
from gpuprof.errors import GpuprofError
from gpuprof.measure.hooks import StopScript, TrainingHooks
from gpuprof.measure.stacks import is_user_file
from gpuprof.profile import Profile
from gpuprof.runners import script_module
from gpuprof.runners.script_inputs import OptionAfterScript, OwnOptions, ScriptInputs, ScriptOptionError
from gpuprof.runners.script_profile import _build_profile
from gpuprof.runners.script_state import _Run
from gpuprof.units import UNKNOWN


def check_script(script: str, module: bool = False) -> Path:
    """The script path (module=True: the module's source file, found as python -m finds it from
    the working directory), or a one-line GpuprofError (exit 2) if it is not a runnable Python file."""
    return _load(script, module)[0]


def _load(script: str, module: bool = False):
    """(path, compiled code) of the script, or a one-line GpuprofError (exit 2). A module's code
    is read at run time (script_module.module_code): (its file, None)."""
    if module:
        return Path(script_module.find_module(script)), None
    path = Path(script)
    if not path.exists():
        raise GpuprofError(f"{script}: no such file")
    if not path.is_file():
        raise GpuprofError(f"{script}: not a file (give the training script, e.g. train.py)")
    try:
        code = compile(path.read_bytes(), os.path.abspath(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError, UnicodeDecodeError) as exc:
        where = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
        raise GpuprofError(f"{script}: not a Python script{where}: {exc.__class__.__name__}") from None
    except OSError as exc:
        raise GpuprofError(f"{script}: cannot read ({exc.__class__.__name__})") from None
    return path, code


@dataclass
class ScriptRun:
    """The outcome of a script run: the profile (None when no step completed) and how it ended."""

    profile: Profile | None
    ended: str  # finished | stopped | failed | interrupted
    error: dict | None = None  # file, line, type, message (failed)
    counts: dict = field(default_factory=dict)
    no_step: str | None = None  # stopped with no training step seen: what was seen instead

    @property
    def error_line(self) -> str:
        e = self.error or {}
        return f"{e.get('file')}:{e.get('line')}: {e.get('type')}: {e.get('message')}"


class _Tee:
    """Writes through to `target` at once and, while attached, hands each complete line to `on_line`.

    Objects the script made keep the stream they were created with and may write to it long after
    the run: a tqdm bar (HF Trainer's) closes itself from its finalizer, at interpreter shutdown
    when this module's globals are already None; a logging handler or a `from sys import stdout`
    keeps it too. So detach() turns a _Tee into a plain pass-through to the real stream: no line
    parsing, no global lookups, and no reference left to the run (whose script objects can then
    be freed)."""

    def __init__(self, target, on_line: Callable[[str], None]):
        self._target = target
        self._on_line = on_line
        self._buf = ""

    def write(self, s: str) -> int:
        n = self._target.write(s)
        on_line = self._on_line
        if on_line is None:  # detached: the real stream's own answer, nothing else
            return n
        self._buf += s.replace("\r", "\n")  # a `\r` progress bar ends its lines too
        if "\n" in self._buf:
            *lines, self._buf = self._buf.split("\n")
            for line in lines:
                on_line(line)
        return len(s) if n is None else n

    def flush(self) -> None:
        self._target.flush()

    def detach(self) -> None:
        """Hand over the last unterminated line, then pass writes through only."""
        on_line, self._on_line = self._on_line, None
        if on_line is not None and self._buf:
            on_line(self._buf)
        self._buf = ""

    def __getattr__(self, name):  # isatty, fileno, encoding, ... of the real stream
        if name == "_target":  # not set yet (copy/pickle make instances without __init__)
            raise AttributeError(name)
        return getattr(self._target, name)


def _error_location(exc: BaseException) -> dict:
    """The innermost traceback frame in user code (else the innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if is_user_file(f.filename)]
    f = (user or frames or [None])[-1]
    file = f.filename if f else UNKNOWN
    if f and not os.path.relpath(file).startswith(".."):
        file = os.path.relpath(file)
    return {"file": file, "line": f.lineno if f else None, "type": type(exc).__name__,
            "message": str(exc), "time": time.time()}  # when: the first of several ranks to fail


def run_script(script: str, args: list[str], *, steps: int, warmup: int, stop: bool = True,
               instruments_factory: Callable | None = None, on_step: Callable[[int], None] | None = None,
               stdout=None, sample_interval_s: float = 0.01, post_budget_s: float | None = None,
               on_progress: Callable[[str], None] | None = None,
               on_step_record: Callable[[dict], None] | None = None,
               keep_steps: int | None = None, stack_rate: tuple[float, float] | None = None,
               module: bool = False, own_options: OwnOptions | None = None,
               experiments: dict | None = None) -> ScriptRun:
    """Run `script args...` under the hooks; return its profile and how it ended.

    module: `script` is a module name, run as `python -m script args` (its profile's command is
    ["-m", script, *args]). own_options: the verb's own options, for the guard that stops the
    run (ScriptOptionError, exit 2) when one of them went after the script
    (gpuprof.runners.script_inputs).
    instruments_factory(device, data_path) -> instruments, called at the first forward.
    stdout: where the script's stdout goes (default: the current sys.stdout).
    post_budget_s / on_progress: the post-run measurements' shared budget and progress lines.
    keep_steps: bounded memory for a run of any length (`gpuprof watch`): the profile keeps the
    warmup steps and a uniform sample of at most this many measured steps (PhaseTimer).
    stack_rate: the stack sampler's (samples per step, longest period in seconds); default (2, 0.05).
    experiments: experiment steps in the script's loop after its measured steps, within the post-run
    budget ({"compile": bool}: torch.compile tried too); None: none (gpuprof.measure.experiments)."""
    path, code = _load(script, module)
    shown = script_module.shown(script) if module else script
    command = ["-m", script, *args] if module else [script, *args]
    run = _Run(path, command, warmup, instruments_factory, sample_interval_s)
    run.post_budget_s, run.on_progress = post_budget_s, on_progress
    run.on_step_record = on_step_record
    run.keep_steps = keep_steps
    run.experiment_options = experiments
    if stack_rate is not None:
        run.stack_rate = stack_rate
    hooks = TrainingHooks(run.first_forward, on_step=on_step, stop_after=(warmup + steps) if stop else None)
    run.hooks = hooks
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=os.path.abspath(path), __cached__=None, __spec__=None,
                         __loader__=SourceFileLoader("__main__", os.path.abspath(path)),
                         __package__=None, __builtins__=__builtins__)
    run.module = main
    inputs = ScriptInputs(own_options, shown)
    run.inputs = inputs  # read by script_profile (_Run, in script_state, does not declare it)

    saved = (sys.argv, list(sys.path), sys.modules.get("__main__"), sys.stdout, sys.stderr)
    out = _Tee(stdout if stdout is not None else sys.stdout, run.on_line)
    err = _Tee(sys.stderr, run.on_line)
    ended, error, leaked = "finished", None, None
    t0 = run.t0 = time.perf_counter()
    with warnings.catch_warnings():
        # Our global hooks make torch.compile warn that they fire for the wrapper too; we count
        # outermost calls only, so that is intended.
        warnings.filterwarnings("ignore", message=r".*global hooks on modules.*")
        # python -m: argv[0] the module's full path, the working directory first on the path
        sys.argv = [os.path.abspath(path) if module else script, *args]
        sys.path[0:1] = [os.getcwd() if module else os.path.dirname(os.path.realpath(path))]
        sys.modules["__main__"] = main
        sys.stdout, sys.stderr = out, err
        hooks.install()
        try:
            inputs.install()
            with interrupts.interruptible():  # a stop lands in the script, never while its steps are read
                if module:  # its parent packages are imported here, in the run, as python -m does
                    spec, code = script_module.module_code(script)
                    main.__dict__.update(script_module.main_globals(spec))
                    run.file = os.path.realpath(spec.origin)
                exec(code, main.__dict__)
        except OptionAfterScript as exc:  # gpuprof's option after the script: raised once all is restored
            ended, leaked = "failed", str(exc)
        except StopScript:
            ended = "stopped"
        except SystemExit as exc:
            if exc.code not in (None, 0):
                ended = "failed"
                error = _error_location(exc)
                error["message"] = f"script exited with status {exc.code}"
        except KeyboardInterrupt:
            ended = "interrupted"
        except BaseException as exc:  # the script's own error: keep the completed steps
            ended, error = "failed", _error_location(exc)
            if hooks.experiments is not None and hooks.experiments.running():
                # raised in an experiment step, under a fix gpuprof switched on: the fix's failure,
                # kept in its result; the run itself was done with its measured steps
                hooks.experiments.failed(error)
                ended, error = "stopped", None
        finally:
            inputs.remove()
            hooks.remove()
            if run.sampler is not None:
                run.sampler.stop()
            # The script's objects may still hold these streams (see _Tee): detach, not drop.
            out.detach()
            err.detach()
            sys.argv, sys.path[:], before, sys.stdout, sys.stderr = saved
            if before is not None:
                sys.modules["__main__"] = before
    run_wall = time.perf_counter() - t0
    if leaked is not None:
        _stop_instruments(run, run_wall)
        raise ScriptOptionError(leaked)
    if hooks.stopped:
        ended = "stopped"
    profile = _build_profile(run, ended, error, run_wall)
    if profile is not None and profile.run.get("ended") == "interrupted":
        ended = "interrupted"  # Ctrl-C during the post-run measurements
    return ScriptRun(profile, ended, error, dict(hooks.counts), hooks.no_step)


def _stop_instruments(run, run_wall: float) -> None:
    """A run stopped by the option guard after its first forward (a script that parses its
    arguments late): its instruments and samplers are stopped, nothing measured after it."""
    if run.timer is None:  # the usual case: arguments are parsed before the model runs
        return
    run.post_budget_s = 0.0
    try:
        _build_profile(run, "failed", None, run_wall)
    except Exception:  # noqa: BLE001 - the error line is what the user gets
        pass
