"""The state of one script run, and what starts at its first forward.

_Run is what the hooks' callbacks, the log-line parser and the profile builder
(gpuprof.runners.script_profile) share. At the first forward (the hooks' on_first_forward) it
makes the phase timer on the forward's device, reads the run's configuration and wraps the
script's data functions (gpuprof.runners.script_discovery), starts the stack sampler, reads the
precision the step computes in, and starts the instruments.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
import types
from pathlib import Path
from typing import Callable

import torch

from gpuprof.measure.attention_switch import attention_switch
from gpuprof.measure.budget import PostRunBudget
from gpuprof.measure.data_names import data_like_name
from gpuprof.measure.experiments import Experiments, host_phases_hold
from gpuprof.measure.hooks import TrainingHooks
from gpuprof.measure.instruments import start_instruments
from gpuprof.measure.precision import MatmulDtypeWatch, read_precision
from gpuprof.measure.stacks import StackSampler
from gpuprof.measure.switches import script_switches
from gpuprof.measure.timer import PhaseTimer
from gpuprof.runners.builtin import RunContext
from gpuprof.runners.loader_discovery import discover
from gpuprof.runners.loader_timing import install
from gpuprof.runners.script_discovery import (_find_ddp, _find_model, _gpt_config, _unwrap, read_config,
                                              wrap_data_functions)
from gpuprof.steplog import EvalLine, IterLine, parse_line

MAX_LINES = 2000  # parsed log lines kept in the profile
# Bounded mode (keep_steps set: `gpuprof watch`): the first half of MAX_LINES, then a uniform
# random sample of the later lines (reservoir sampling, seeded), so a long run's log is sampled
# over the whole run as its steps are.


class _Run:
    """State of one run; its first_forward() is the hooks' on_first_forward callback."""

    def __init__(self, path: Path, command: list[str], warmup: int, instruments_factory,
                 sample_interval_s: float):
        self.file = os.path.realpath(path)
        self.command = command
        self.warmup = warmup
        self.instruments_factory = instruments_factory
        self.sample_interval_s = sample_interval_s
        self.stack_rate: tuple[float, float] = (2.0, 0.05)  # the stack sampler's samples per step, longest period
        self.module: types.ModuleType | None = None
        self.hooks: TrainingHooks | None = None
        self.timer: PhaseTimer | None = None
        self.sampler: StackSampler | None = None
        self.ctx: RunContext | None = None
        self.instruments: list = []
        self.not_started: dict[str, str] = {}
        self.matmul_watch = None
        self.loader = None  # gpuprof.runners.loader_discovery.Found, at the first forward
        self.post_budget_s: float | None = None
        self.on_progress: Callable[[str], None] | None = None
        # Experiment steps after the measured ones (gpuprof.measure.experiments): None = off, else
        # {"compile": bool} (torch.compile tried too, --measure-compile); set by the runner.
        self.experiment_options: dict | None = None
        self.t0: float | None = None  # perf_counter at the script's start (the post-run budget's run time)
        self.budget = None  # measure.budget.PostRunBudget, made when the experiments start (or after the run)
        self.compiled = False
        self.on_step_record: Callable[[dict], None] | None = None
        self.instrument_errors: list[str] = []
        self.device = "cpu"
        self.config: dict = {}
        self.sharding: dict | None = None  # measure.sharding.describe_sharding, after the run
        self.source: dict = {}
        self.iter_lines: list[IterLine] = []
        self.eval_lines: list[EvalLine] = []
        self.keep_steps: int | None = None  # bounded mode: see PhaseTimer(keep_steps)
        self._lines_seen = 0
        self._rng = random.Random(0)

    def on_line(self, line: str) -> None:
        hooks = self.hooks
        if hooks is not None and hooks.stop_after is not None and hooks.steps_done >= hooks.stop_after:
            return  # the measured steps are done: what follows is experiment steps' (measure/experiments.py)
        rec = parse_line(line)
        if isinstance(rec, IterLine):
            self._lines_seen += 1
            if len(self.iter_lines) < (MAX_LINES if self.keep_steps is None else MAX_LINES // 2):
                self.iter_lines.append(rec)
            elif self.keep_steps is not None:  # reservoir over the lines after the first MAX_LINES // 2
                late = len(self.iter_lines) - MAX_LINES // 2
                if late < MAX_LINES // 2:
                    self.iter_lines.append(rec)
                else:
                    j = self._rng.randrange(self._lines_seen - MAX_LINES // 2)
                    if j < MAX_LINES // 2:
                        self.iter_lines[MAX_LINES // 2 + j] = rec
        elif isinstance(rec, EvalLine) and len(self.eval_lines) < MAX_LINES:
            self.eval_lines.append(rec)

    # -- first forward ---------------------------------------------------------------------

    def first_forward(self, module, args, kwargs) -> PhaseTimer:
        if module is None:  # no forward seen before the first backward/step: look for the model
            module = _find_model(self.module.__dict__)
            self.source["model"] = ("script globals: no forward was seen (a model compiled in place "
                                    "with Module.compile() hides its forwards); forward time is in `other`")
        eager, compiled = _unwrap(module)
        self.compiled = compiled
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        param = next(eager.parameters(), None)
        dev = first.device if first is not None else (param.device if param is not None else torch.device("cpu"))
        self.device = str(dev)
        bounded = {} if self.keep_steps is None else {"keep_steps": self.keep_steps, "keep_first": self.warmup}
        self.timer = PhaseTimer.for_device(self.device, **bounded)
        self.timer.listener = self.on_step_record
        # Heuristics over arbitrary user objects: a failure here must not end the user's run.
        for step in (lambda: read_config(self, eager, compiled, first), self._find_loader):
            try:
                step()
            except Exception as exc:
                self.source.setdefault("errors", []).append(f"{exc.__class__.__name__}: {exc}")
        hooks = self.hooks
        per_step, longest = self.stack_rate
        loader_codes = frozenset(self.loader.codes) if self.loader is not None else frozenset()
        self.sampler = StackSampler(hooks._tid, self._sample_label, self.sample_interval_s,
                                    marker=data_like_name, code_marker=loader_codes.__contains__,
                                    steps=lambda: hooks.steps_done,
                                    per_step=per_step, max_interval_s=max(longest, self.sample_interval_s))
        self.sampler.start()
        gcfg = _gpt_config(self.config)
        autocast = None
        dev_type = dev.type if dev.type in ("cuda", "cpu") else None
        if dev_type and torch.is_autocast_enabled(dev_type):
            autocast = torch.get_autocast_dtype(dev_type)
        # What the step really computes in (observed: autocast, the weights' dtype, TF32 as the
        # script set it) -- the script's `dtype` global is only a claim.
        try:
            precision = read_precision(eager, autocast, self.device)
        except Exception as exc:  # noqa: BLE001 - never end the user's run over a reading
            precision = {"error": f"{exc.__class__.__name__}: {exc}"}
        # Autocast inside forward (accelerate, precision plugins) shows in the output dtype of the
        # largest matmul layer, read by a hook on it during one forward. Never on a compiled model:
        # dynamo guards on its submodules' hooks, so a hook added and removed by gpuprof would
        # recompile the user's model twice (guard `len(self._modules['lm_head']._forward_hooks)
        # != 1`); its matmul dtype is read after the run from the FLOP count's eager forward.
        if not compiled:
            try:
                self.matmul_watch = MatmulDtypeWatch(eager)
                self.hooks.forward_watchers.append(self.matmul_watch)  # armed from this forward on
            except Exception:  # noqa: BLE001 - an odd module: the precision read at entry stands
                self.matmul_watch = None
        self.ctx = RunContext(self.config, gcfg, eager, tuple(args), dict(kwargs), self.device,
                              self.timer, autocast, precision=precision, ddp=_find_ddp(module))
        self._arm_experiments()
        if self.instruments_factory is not None:
            try:
                wanted = list(self.instruments_factory(self.device, self.config.get("data_path")))
            except Exception as exc:  # noqa: BLE001
                wanted = []
                self.instrument_errors.append(f"instruments: {exc!r}")
            self.instruments, self.not_started = start_instruments(wanted, self.ctx)
        return self.timer

    def _arm_experiments(self) -> None:
        """Experiment steps after the measured ones, when asked for and when the script is stopped
        after its steps in a single process (never under --no-stop, watch or torchrun)."""
        hooks = self.hooks
        if (self.experiment_options is None or hooks.stop_after is None or self.keep_steps is not None
                or int(os.environ.get("WORLD_SIZE", "1") or 1) > 1):
            return
        hooks.experiments = Experiments(self._experiment_switches, self.post_run_budget,
                                        host_phases=host_phases_hold(self.device))

    def _experiment_switches(self) -> list:
        primary = getattr(self.hooks, "_primary_opt", None)
        optimizer = primary() if primary is not None else None
        ctx = self.ctx
        attention = attention_switch(ctx.model, ctx.example_args, ctx.example_kwargs, self.device, ctx.autocast_dtype,
                                     compiled=bool(self.compiled), suspended=self._hooks_suspended)
        return script_switches(self.device, ctx.precision, ctx.autocast_dtype, optimizer, ctx.model,
                               compiled=self.compiled, attention=attention,
                               measure_compile=bool((self.experiment_options or {}).get("compile")))

    @contextlib.contextmanager
    def _hooks_suspended(self):
        """gpuprof's training hooks ignore the forwards run inside (an experiment's own checks)."""
        was = self.hooks.suspended
        self.hooks.suspended = True
        try:
            yield
        finally:
            self.hooks.suspended = was

    def post_run_budget(self):
        """The run's post-run budget, made once: when the experiments start, else after the run."""
        if self.budget is None:
            wall = time.perf_counter() - self.t0 if self.t0 is not None else 0.0
            self.budget = PostRunBudget.for_run(wall, self.post_budget_s, on_progress=self.on_progress)
        return self.budget

    def _find_loader(self) -> None:
        """The `data` phase: the calls that produced the first forward's inputs, followed from its
        call site (gpuprof.runners.loader_discovery); when none could be timed, the script's
        get_batch-like names (gpuprof.runners.script_discovery.wrap_data_functions)."""
        try:
            self.loader, producers = discover()
            install(self.hooks, producers, self.loader)
        finally:
            if self.loader is None or not self.loader.timed:
                wrap_data_functions(self.hooks, self.module.__dict__)

    def _sample_label(self):
        t = self.timer
        hooks = self.hooks
        if t is None or not t.in_step or hooks.steps_done < self.warmup:
            return None
        if hooks.stop_after is not None and hooks.steps_done >= hooks.stop_after:
            return None  # an experiment step (gpuprof.measure.experiments): not the run's
        return t.current
