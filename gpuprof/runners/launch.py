"""Launching a data-parallel run through torch.distributed.run (torchrun), never a launcher of
our own.

gpuprof builds torchrun's own argument list (the launcher options the user gave, unchanged) with
`-m gpuprof.runners.rank SPEC` as the program, and runs torchrun's `run()` in this process: its
elastic agent starts one process per rank, watches them, stops the others when one fails, and
raises ChildFailedError naming each failed rank with its exit code. Each rank writes its entry
(gpuprof.runners.rank) into a temporary folder; this node's entries are read back, a rank that
wrote none is marked missing with what torchrun saw, and the folder is removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass, field

from gpuprof.errors import GpuprofError

# The launcher options gpuprof passes through to torchrun (CLI name -> torchrun flag).
AGENT_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, n))
AGENT_ENV = ("OMP_NUM_THREADS", "TORCHELASTIC_SIGNALS_TO_HANDLE")

LAUNCHER_FLAGS = ("nproc-per-node", "nnodes", "node-rank", "rdzv-endpoint", "rdzv-backend", "rdzv-id",
                  "rdzv-conf", "master-addr", "master-port", "max-restarts", "monitor-interval",
                  "local-addr")


@dataclass
class LaunchResult:
    entries: list[dict]  # this node's ranks (gpuprof.merge entries)
    interrupted: bool = False
    failures: dict = field(default_factory=dict)  # global rank -> what torchrun reported
    problem: str | None = None  # a launcher-level failure (rendezvous, bad option)


def torchrun_args(launcher: dict, standalone: bool, spec_path: str, log_dir: str | None = None) -> list[str]:
    """torchrun's argv: the launcher options as given, then our rank module and its spec.
    log_dir: where torchrun's agent keeps its per-run folder (else it leaves one in /tmp)."""
    argv = []
    for flag in LAUNCHER_FLAGS:
        value = launcher.get(flag.replace("-", "_"))
        if value is not None:
            argv += [f"--{flag}", str(value)]
    if standalone:
        argv.append("--standalone")
    if log_dir is not None:
        argv += ["--log-dir", log_dir]
    return argv + ["-m", "gpuprof.runners.rank", spec_path]


def launch(spec: dict, launcher: dict, *, standalone: bool = False) -> LaunchResult:
    """Run `spec` (see gpuprof.runners.rank) on every local rank through torchrun."""
    folder = tempfile.mkdtemp(prefix="gpuprof-ranks-")
    # torchrun's agent installs handlers for these (raising SignalException) and sets these
    # environment variables for its workers; gpuprof's own process gets its own back afterwards.
    saved = {s: signal.getsignal(s) for s in AGENT_SIGNALS}
    result = LaunchResult(entries=[])
    with _agent_env_kept():
        try:
            _launch(spec, launcher, standalone, folder, result)
        finally:
            for sig, h in saved.items():  # torchrun's agent replaces them and does not put them back
                if h is not None:
                    signal.signal(sig, h)
            shutil.rmtree(folder, ignore_errors=True)
    return result


def _launch(spec: dict, launcher: dict, standalone: bool, folder: str, result: LaunchResult) -> None:
    """Write the spec, run torchrun, record what it reported and read the ranks' entries."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    spec_path = os.path.join(folder, "spec.json")
    with open(spec_path, "w", encoding="utf-8") as f:
        json.dump({**spec, "folder": folder}, f)
    args = _checked_args(parse_args, torchrun_args(launcher, standalone, spec_path,
                                                   log_dir=os.path.join(folder, "torchrun")))
    try:
        run(args)
    except ChildFailedError as exc:
        for rank, failure in exc.failures.items():
            result.failures[int(rank)] = {
                "exitcode": failure.exitcode, "local_rank": failure.local_rank,
                "message": _failure_text(failure), "time": getattr(failure, "timestamp", None)}
    except SignalException:
        result.interrupted = True
    except KeyboardInterrupt:
        result.interrupted = True
    except Exception as exc:  # rendezvous and agent errors: nothing of the ranks to merge
        result.problem = f"torchrun: {exc.__class__.__name__}: {exc}"
    result.entries = _read_entries(folder, result.failures, int(launcher.get("node_rank") or 0))


def check_launcher(launcher: dict, standalone: bool = False) -> None:
    """Validate the launcher options as torchrun would, before anything starts (GpuprofError)."""
    from torch.distributed.run import parse_args

    with _agent_env_kept():
        _checked_args(parse_args, torchrun_args(launcher, standalone, "spec.json"))


@contextlib.contextmanager
def _agent_env_kept():
    """torchrun sets these for its workers in the launching process; put them back after."""
    env = {k: os.environ.get(k) for k in AGENT_ENV}
    try:
        yield
    finally:
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _checked_args(parse_args, argv: list[str]):
    """torchrun's parsed arguments, its own validation run first (config_from_args on a copy):
    a bad launcher option is a one-line error (exit 2) before anything starts."""
    import copy

    from torch.distributed.run import config_from_args

    try:
        args = parse_args(argv)
    except SystemExit:
        raise GpuprofError("torchrun refused the launcher options (its message is above)") from None
    quiet = logging.getLogger("torch.distributed.run")  # its warnings come once, from run() itself
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        config_from_args(copy.deepcopy(args))
    except (ValueError, AssertionError, TypeError, RuntimeError) as exc:
        raise GpuprofError(f"torchrun refused the launcher options: {exc.__class__.__name__}: "
                           f"{str(exc) or 'invalid value'}") from None
    finally:
        quiet.setLevel(level)
    port = getattr(args, "master_port", None)
    if port is not None and not 0 <= int(port) <= 65535:
        raise GpuprofError(f"--master-port must be a port number 0-65535, got {port}")
    if getattr(args, "monitor_interval", 1) <= 0:
        raise GpuprofError(f"--monitor-interval must be positive seconds, got {args.monitor_interval}")
    return args


def _failure_text(failure) -> str:
    code = failure.exitcode
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _read_entries(folder: str, failures: dict, node_rank: int) -> list[dict]:
    entries = {}
    for name in os.listdir(folder):
        if name.startswith("rank") and name.endswith(".json"):
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    e = json.load(f)
                entries[int(e["rank"])] = e
            except (OSError, ValueError, KeyError):
                continue
    for rank, f in failures.items():
        e = entries.get(rank)
        if e is None:  # died without writing its entry: what torchrun saw
            entries[rank] = {"rank": rank, "local_rank": f["local_rank"], "node_rank": node_rank, "host": None,
                             "world_size": None, "status": "missing", "profile": None,
                             "error": {"type": "RankDied", "file": None, "line": None, "time": f["time"],
                                       "message": f"the rank ended without a profile ({f['message']})"}}
        elif e.get("error") is None and e.get("status") != "ok":
            e["error"] = {"type": "RankFailed", "file": None, "line": None, "message": f["message"],
                          "time": f["time"]}
    return [entries[r] for r in sorted(entries)]


def first_failure(entries: list[dict]) -> dict | None:
    """The rank that failed first (the root cause: the others fail after it, e.g. their
    collective loses its peer), by the time each error was recorded; lowest rank on a tie."""
    failed = [e for e in entries if e.get("status") in ("failed", "missing")]
    if not failed:
        return None
    return min(failed, key=lambda e: ((e.get("error") or {}).get("time") or float("inf"), e["rank"]))
