"""A user's training script, unmodified, run in-process under gpuprof's hooks.

The script runs as `__main__` with `sys.argv = [script, *args]` and `sys.path[0]` = its folder,
as `python script.py args` would set them (the working directory is left alone). The hooks of
gpuprof.measure.hooks turn its own calls into phases and steps; at the first forward the run's
configuration is read (script globals, then the model, then the inputs), the script's
get_batch-like functions are wrapped as the `data` phase, the stack sampler and the instruments
start. After warmup+steps optimizer steps the script is stopped (StopScript, a BaseException).
Its stdout/stderr are teed: the user sees them live, and nanoGPT `iter`/`step` lines are parsed.
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

import torch
from torch.utils.data import Dataset

from gpuprof.steplog import EvalLine, IterLine, parse_line
from gpuprof.errors import GpuprofError
from gpuprof.measure.hooks import StopScript, TrainingHooks, data_like_name
from gpuprof.measure.instruments import start_instruments
from gpuprof.measure.precision import MatmulDtypeWatch, read_precision
from gpuprof.measure.stacks import StackSampler, is_user_file
from gpuprof.measure.timer import PhaseTimer
from gpuprof.profile import Profile
from gpuprof.runners.script_profile import _build_profile
from gpuprof.runners.builtin import RunContext

DTYPE_NAMES = {"float32": "fp32", "fp32": "fp32", "float": "fp32", "bfloat16": "bf16", "bf16": "bf16",
               "float16": "fp16", "fp16": "fp16", "half": "fp16"}
DIMS = ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")
# Scalar nanoGPT config names kept verbatim (for a corrected config written back later).
SCRIPT_KEYS = ("batch_size", "block_size", "gradient_accumulation_steps", "dtype", "compile", "device",
               "n_layer", "n_head", "n_embd", "vocab_size", "bias", "dropout", "learning_rate",
               "max_iters", "eval_interval", "eval_iters", "log_interval", "dataset", "data_dir", "init_from")
MAX_LINES = 2000  # parsed log lines kept in the profile


def check_script(script: str) -> Path:
    """The script path, or a one-line GpuprofError (exit 2) if it is not a runnable Python file."""
    return _load(script)[0]


def _load(script: str):
    """(path, compiled code) of the script, or a one-line GpuprofError (exit 2)."""
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


class _Run:
    """State of one run; its first_forward() is the hooks' on_first_forward callback."""

    def __init__(self, path: Path, command: list[str], warmup: int, instruments_factory,
                 sample_interval_s: float):
        self.path = path
        self.file = os.path.realpath(path)
        self.command = command
        self.warmup = warmup
        self.instruments_factory = instruments_factory
        self.sample_interval_s = sample_interval_s
        self.module: types.ModuleType | None = None
        self.hooks: TrainingHooks | None = None
        self.timer: PhaseTimer | None = None
        self.sampler: StackSampler | None = None
        self.ctx: RunContext | None = None
        self.instruments: list = []
        self.not_started: dict[str, str] = {}
        self.matmul_watch = None
        self.post_budget_s: float | None = None
        self.on_progress: Callable[[str], None] | None = None
        self.on_step_record: Callable[[dict], None] | None = None
        self.instrument_errors: list[str] = []
        self.device = "cpu"
        self.config: dict = {}
        self.source: dict = {}
        self.iter_lines: list[IterLine] = []
        self.eval_lines: list[EvalLine] = []

    def on_line(self, line: str) -> None:
        rec = parse_line(line)
        if isinstance(rec, IterLine) and len(self.iter_lines) < MAX_LINES:
            self.iter_lines.append(rec)
        elif isinstance(rec, EvalLine) and len(self.eval_lines) < MAX_LINES:
            self.eval_lines.append(rec)

    # -- first forward ---------------------------------------------------------------------

    def first_forward(self, module, args, kwargs) -> PhaseTimer:
        if module is None:  # no forward seen before the first backward/step: look for the model
            module = _find_model(self.module.__dict__)
            self.source["model"] = ("script globals: no forward was seen (a model compiled in place "
                                    "with Module.compile() hides its forwards); forward time is in `other`")
        eager, compiled = _unwrap(module)
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        param = next(eager.parameters(), None)
        dev = first.device if first is not None else (param.device if param is not None else torch.device("cpu"))
        self.device = str(dev)
        self.timer = PhaseTimer.for_device(self.device)
        self.timer.listener = self.on_step_record
        # Heuristics over arbitrary user objects: a failure here must not end the user's run.
        for step in (lambda: self._read_config(eager, compiled, first), self._wrap_data_functions):
            try:
                step()
            except Exception as exc:
                self.source.setdefault("errors", []).append(f"{exc.__class__.__name__}: {exc}")
        hooks = self.hooks
        self.sampler = StackSampler(hooks._tid, self._sample_label, self.sample_interval_s,
                                    marker=data_like_name, steps=lambda: hooks.steps_done)
        self.sampler.start()
        gcfg = _gpt_config(self.config)
        autocast = None
        dev_type = dev.type if dev.type in ("cuda", "cpu") else None
        if dev_type and torch.is_autocast_enabled(dev_type):
            autocast = torch.get_autocast_dtype(dev_type)
        self.config["autocast_dtype"] = str(autocast).replace("torch.", "") if autocast else None
        # What the step really computes in (observed: autocast, the weights' dtype, TF32 as the
        # script set it) -- the script's `dtype` global is only a claim.
        try:
            precision = read_precision(eager, autocast, self.device)
        except Exception as exc:  # noqa: BLE001 - never end the user's run over a reading
            precision = {"error": f"{exc.__class__.__name__}: {exc}"}
        self.config["precision"] = precision
        self.config["tf32_matmul"] = bool(precision.get("tf32_matmul"))
        try:  # autocast inside forward (accelerate, precision plugins) shows in the output dtype
            self.matmul_watch = MatmulDtypeWatch(eager)
        except Exception:  # noqa: BLE001 - an odd module: the precision read at entry stands
            self.matmul_watch = None
        self.ctx = RunContext(self.config, gcfg, eager, tuple(args), dict(kwargs), self.device,
                              self.timer, autocast, precision=precision, ddp=_find_ddp(module))
        if self.instruments_factory is not None:
            try:
                wanted = list(self.instruments_factory(self.device, self.config.get("data_path")))
            except Exception as exc:  # noqa: BLE001
                wanted = []
                self.instrument_errors.append(f"instruments: {exc!r}")
            self.instruments, self.not_started = start_instruments(wanted, self.ctx)
        return self.timer

    def _sample_label(self):
        t = self.timer
        if t is None or not t.in_step or self.hooks.steps_done < self.warmup:
            return None
        return t.current

    def _namespaces(self) -> list[tuple[str, dict]]:
        """Where the run's settings live: the script's globals, then the locals of its frames
        on the stack (a `main()` holding them), innermost last."""
        spaces = [("script global", self.module.__dict__)]
        f = sys._getframe()
        frames = []
        while f is not None:
            if os.path.realpath(f.f_code.co_filename) == self.file and f.f_locals is not self.module.__dict__:
                frames.append(f)
            f = f.f_back
        for fr in reversed(frames):
            spaces.append((f"local of {fr.f_code.co_name}()", dict(fr.f_locals)))
        return spaces

    def _lookup(self, spaces, name):
        for where, ns in spaces:
            v = ns.get(name)
            if isinstance(v, (bool, int, float, str, torch.dtype)):
                return v, f"{where} `{name}`"
            if isinstance(v, torch.device):
                return str(v), f"{where} `{name}`"
        for where, ns in spaces:
            args = ns.get("model_args")
            if isinstance(args, dict) and isinstance(args.get(name), (int, float, bool)):
                return args[name], f"{where} `model_args['{name}']`"
        return None, None

    def _read_config(self, eager, compiled: bool, first) -> None:
        spaces = self._namespaces()
        cfg, src = self.config, self.source
        cfg["model"] = f"{type(eager).__name__} (script)"

        def put(key, value, where):
            if value is not None and cfg.get(key) is None:
                cfg[key] = value
                src[key] = where

        for key, name in (("batch_size", "batch_size"), ("block_size", "block_size"),
                          ("grad_accum", "gradient_accumulation_steps"), ("device", "device"),
                          ("compile", "compile")):
            put(key, *self._lookup(spaces, name))
        raw_dtype, where = self._lookup(spaces, "dtype")
        if raw_dtype is not None:
            name = str(raw_dtype).replace("torch.", "")
            put("dtype", DTYPE_NAMES.get(name, name), where)
        if compiled:
            cfg["compile"], src["compile"] = True, "observed: the model is compiled (torch.compile)"
        put("compile", False, "observed: the model is not a torch.compile wrapper")
        put("device", self.device, "observed: device of the first forward's input" if first is not None
            else "observed: device of the model's parameters")
        if first is not None and first.dim() == 2 and not first.is_floating_point():
            put("batch_size", int(first.shape[0]), "observed: first forward's input shape (B, T)")
            put("block_size", int(first.shape[1]), "observed: first forward's input shape (B, T)")

        dims, dim_src = {}, {}
        mcfg = getattr(eager, "config", None)
        for d in DIMS:
            v = getattr(mcfg, d, None) if mcfg is not None and not isinstance(mcfg, dict) else \
                (mcfg.get(d) if isinstance(mcfg, dict) else None)
            if isinstance(v, int):
                dims[d], dim_src[d] = v, "model.config"
                continue
            for name in (d, "meta_vocab_size") if d == "vocab_size" else (d,):
                v, where = self._lookup(spaces, name)
                if isinstance(v, int) and not isinstance(v, bool):
                    dims[d], dim_src[d] = v, where
                    break
        emb = _embeddings(eager)
        if "vocab_size" not in dims and "wte" in emb:
            dims["vocab_size"], dim_src["vocab_size"] = emb["wte"].num_embeddings, "model: wte embedding rows"
        if "block_size" not in dims and cfg.get("block_size"):
            dims["block_size"], dim_src["block_size"] = cfg["block_size"], src["block_size"]
        if dims:
            cfg["model_dims"] = dims
            src["model_dims"] = dim_src
        params = {id(p): p.numel() for p in eager.parameters()}
        n = sum(params.values())
        note = "model parameters (unique tensors)"
        if "wpe" in emb and id(emb["wpe"].weight) in params:
            n -= emb["wpe"].weight.numel()
            note += ", without position embeddings as nanoGPT's estimate_mfu"
        cfg["param_count"], src["param_count"] = n, note
        cfg["script_globals"] = {k: v for k in SCRIPT_KEYS
                                 for v in [self.module.__dict__.get(k)]
                                 if isinstance(v, (bool, int, float, str))}
        data_dir = self.module.__dict__.get("data_dir")
        if isinstance(data_dir, str) and os.path.isfile(os.path.join(data_dir, "train.bin")):
            cfg["data_path"] = os.path.join(data_dir, "train.bin")

    def _wrap_data_functions(self) -> None:
        """Wrap the script's get_batch-like functions (and methods of its own classes) as `data`."""
        g = self.module.__dict__
        seen_classes = set()
        for name, obj in list(g.items()):
            if isinstance(obj, types.FunctionType):
                if data_like_name(name) and is_user_file(obj.__code__.co_filename):
                    self.hooks.wrap_attr(g, name, f"{name} ({_where(obj)})")
                continue
            cls = obj if isinstance(obj, type) else type(obj)
            if cls in seen_classes or cls.__module__ in ("builtins",):
                continue
            seen_classes.add(cls)
            # Dunders (__getitem__, __next__, __iter__) only of a Dataset or a data-named class:
            # a config class's __getitem__ is not data loading.
            loader = issubclass(cls, Dataset) or data_like_name(cls.__name__)
            for attr, fn in list(vars(cls).items()):
                dunder = attr.startswith("__")
                if (isinstance(fn, types.FunctionType) and is_user_file(fn.__code__.co_filename)
                        and (loader if dunder and attr in ("__getitem__", "__next__", "__iter__")
                             else not dunder and data_like_name(attr))):
                    self.hooks.wrap_attr(cls, attr, f"{cls.__name__}.{attr} ({_where(fn)})")


def _where(fn) -> str:
    code = fn.__code__
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"


def _unwrap(module) -> tuple[torch.nn.Module, bool]:
    """The eager module under torch.compile / DDP wrappers, and whether it was compiled."""
    compiled = getattr(module, "_compiled_call_impl", None) is not None  # Module.compile()
    for _ in range(4):
        inner = getattr(module, "_orig_mod", None)
        if isinstance(inner, torch.nn.Module):
            module, compiled = inner, True
            continue
        inner = getattr(module, "module", None)
        if isinstance(inner, torch.nn.Module) and type(module).__name__ in (
                "DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"):
            module = inner
            continue
        break
    return module, compiled


def _find_ddp(module):
    """The DistributedDataParallel wrapper in the chain the forward was called through
    (nanoGPT: DDP(torch.compile(model)); also compile(DDP(model))), or None."""
    for _ in range(4):
        if type(module).__name__ == "DistributedDataParallel":
            return module
        inner = getattr(module, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return None
        module = inner
    return None


def _find_model(namespace: dict) -> torch.nn.Module:
    """The module with the most parameters among the script's globals (an empty Module if none)."""
    mods = [v for v in namespace.values() if isinstance(v, torch.nn.Module)]
    if not mods:
        return torch.nn.Module()
    return max(mods, key=lambda m: sum(p.numel() for p in _unwrap(m)[0].parameters()))


def _embeddings(model: torch.nn.Module) -> dict:
    out = {}
    for name, mod in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("wte", "wpe") and isinstance(mod, torch.nn.Embedding):
            out.setdefault(leaf, mod)
    return out


def _gpt_config(cfg: dict):
    dims = cfg.get("model_dims") or {}
    if not all(isinstance(dims.get(d), int) for d in DIMS):
        return None
    from gpuprof.dims import GPTConfig

    return GPTConfig(**{d: dims[d] for d in DIMS})


def _error_location(exc: BaseException) -> dict:
    """The innermost traceback frame in user code (else the innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if is_user_file(f.filename)]
    f = (user or frames or [None])[-1]
    file = f.filename if f else "?"
    if f and not os.path.relpath(file).startswith(".."):
        file = os.path.relpath(file)
    return {"file": file, "line": f.lineno if f else None, "type": type(exc).__name__,
            "message": str(exc), "time": time.time()}  # when: the first of several ranks to fail


def run_script(script: str, args: list[str], *, steps: int, warmup: int, stop: bool = True,
               instruments_factory: Callable | None = None, on_step: Callable[[int], None] | None = None,
               stdout=None, sample_interval_s: float = 0.01, post_budget_s: float | None = None,
               on_progress: Callable[[str], None] | None = None,
               on_step_record: Callable[[dict], None] | None = None) -> ScriptRun:
    """Run `script args...` under the hooks; return its profile and how it ended.

    instruments_factory(device, data_path) -> instruments, called at the first forward.
    stdout: where the script's stdout goes (default: the current sys.stdout).
    post_budget_s / on_progress: the post-run measurements' shared budget and progress lines."""
    path, code = _load(script)
    run = _Run(path, [script, *args], warmup, instruments_factory, sample_interval_s)
    run.post_budget_s, run.on_progress = post_budget_s, on_progress
    run.on_step_record = on_step_record
    hooks = TrainingHooks(run.first_forward, on_step=on_step, stop_after=(warmup + steps) if stop else None)
    run.hooks = hooks
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=os.path.abspath(path), __cached__=None, __spec__=None,
                           __loader__=SourceFileLoader("__main__", os.path.abspath(path)),
                           __package__=None, __builtins__=__builtins__)
    run.module = module

    saved = (sys.argv, list(sys.path), sys.modules.get("__main__"), sys.stdout, sys.stderr)
    out = _Tee(stdout if stdout is not None else sys.stdout, run.on_line)
    err = _Tee(sys.stderr, run.on_line)
    ended, error = "finished", None
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        # Our global hooks make torch.compile warn that they fire for the wrapper too; we count
        # outermost calls only, so that is intended.
        warnings.filterwarnings("ignore", message=r".*global hooks on modules.*")
        sys.argv = [script, *args]
        sys.path[0:1] = [os.path.dirname(os.path.realpath(path))]
        sys.modules["__main__"] = module
        sys.stdout, sys.stderr = out, err
        hooks.install()
        try:
            exec(code, module.__dict__)
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
        finally:
            hooks.remove()
            if run.sampler is not None:
                run.sampler.stop()
            # The script's objects may still hold these streams (see _Tee): detach, not drop.
            out.detach()
            err.detach()
            sys.argv, sys.path[:], main, sys.stdout, sys.stderr = saved
            if main is not None:
                sys.modules["__main__"] = main
    run_wall = time.perf_counter() - t0
    if hooks.stopped:
        ended = "stopped"
    profile = _build_profile(run, ended, error, run_wall)
    if profile is not None and profile.run.get("ended") == "interrupted":
        ended = "interrupted"  # Ctrl-C during the post-run measurements
    return ScriptRun(profile, ended, error, dict(hooks.counts))
