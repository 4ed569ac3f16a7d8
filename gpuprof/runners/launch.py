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
from gpuprof.units import gib

# The launcher options gpuprof passes through to torchrun (CLI name -> torchrun flag).
AGENT_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, n))
AGENT_ENV = ("OMP_NUM_THREADS", "TORCHELASTIC_SIGNALS_TO_HANDLE")
# What a rank does when an NCCL collective times out (--rank-timeout) or fails, read by each
# ProcessGroupNCCL when it is made (torch 2.11, ProcessGroupNCCL.hpp/.cpp). torchrun sets mode 1
# (TearDown) unless it is set: the watchdog aborts the communicators and then SIGABRTs the
# process from its own thread, so the rank never writes its entry. Mode 2 (CleanUpOnly) aborts
# the communicators and lets the process live: a sync stuck behind the aborted kernel returns,
# and the next collective raises DistBackendError in Python, where the rank's script fails and
# its entry is written. DUMP_ON_TIMEOUT=0: otherwise the heartbeat monitor still SIGABRTs the
# process after a timeout (it dumps, sleeps, then terminates). WAIT_TIMEOUT_DUMP_MILSEC: the
# watchdog sleeps 4x this per failed collective before aborting (default 15 s: 60 s). A value the
# user set is kept. Gloo ignores all three.
NCCL_RANK_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
                 "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "250"}

LAUNCHER_FLAGS = ("nproc-per-node", "nnodes", "node-rank", "rdzv-endpoint", "rdzv-backend", "rdzv-id",
                  "rdzv-conf", "master-addr", "master-port", "max-restarts", "monitor-interval",
                  "local-addr")


@dataclass
class LaunchResult:
    entries: list[dict]  # this node's ranks (gpuprof.merge entries)
    interrupted: bool = False
    failures: dict = field(default_factory=dict)  # global rank -> what torchrun reported
    problem: str | None = None  # a launcher-level failure (rendezvous, bad option)
    opened: dict = field(default_factory=dict)  # files the ranks opened: files.check_writable's `protected`


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


FOLDER_PREFIX = "gpuprof-ranks-"


def launch(spec: dict, launcher: dict, *, standalone: bool = False) -> LaunchResult:
    """Run `spec` (see gpuprof.runners.rank) on every local rank through torchrun.

    No rank outlives gpuprof: each rank asks the kernel to kill it when gpuprof's process dies
    (gpuprof.runners.rank, even when gpuprof is killed with SIGKILL), and whatever rank is still
    running when torchrun returns or raises is killed with its process group here. The ranks'
    folder is removed on every way out this process controls; one a SIGKILL left behind is
    removed by the next launch (its name holds the pid of the gpuprof that made it)."""
    sweep_stale_folders()
    folder = tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-")
    # torchrun's agent installs handlers for these (raising SignalException) and sets these
    # environment variables for its workers; gpuprof's own process gets its own back afterwards.
    saved = {s: signal.getsignal(s) for s in AGENT_SIGNALS}
    result = LaunchResult(entries=[])
    with _agent_env_kept():
        try:
            _launch({**spec, "launcher_pid": os.getpid()}, launcher, standalone, folder, result)
        finally:
            kill_leftover_ranks(folder)
            for sig, h in saved.items():  # torchrun's agent replaces them and does not put them back
                if h is not None:
                    signal.signal(sig, h)
            shutil.rmtree(folder, ignore_errors=True)
    return result


def kill_leftover_ranks(folder: str) -> list[int]:
    """Kill (SIGKILL, with their process groups: torchrun starts each rank in a session of its
    own, with its DataLoader workers) the rank processes of this launch still alive; their pids."""
    import psutil

    killed = []
    for p in psutil.Process().children(recursive=True):
        try:
            if not any(folder in part for part in p.cmdline()):
                continue
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                p.kill()
            killed.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return killed


def sweep_stale_folders(tmp: str | None = None) -> list[str]:
    """Remove the ranks' folders that a killed gpuprof (SIGKILL: nothing of it ran) left in the
    temp folder: this user's gpuprof-ranks-PID-* whose PID is no longer running."""
    import psutil

    tmp = tmp or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(tmp)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(FOLDER_PREFIX):
            continue
        pid = name[len(FOLDER_PREFIX):].partition("-")[0]
        path = os.path.join(tmp, name)
        try:
            if not pid.isdigit() or psutil.pid_exists(int(pid)) or os.stat(path).st_uid != os.geteuid():
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def check_capacity(nproc: int, *, cuda: bool, rank_bytes: int = 0, rank_bytes_source: str = "") -> None:
    """Refuse (GpuprofError, with the numbers) more ranks on this node than it can run: on CUDA
    more ranks than visible GPUs (each NCCL rank needs its own); on a CPU more ranks than the
    cores this process may use; anywhere more ranks than the memory available holds, at one
    Python process with torch loaded (this process's resident memory, measured now) plus
    `rank_bytes` (the model's estimate for a CPU rank of the built-in loop) each."""
    import psutil

    if cuda:
        import torch

        gpus = torch.cuda.device_count()
        if nproc > gpus:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            seen = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
            raise GpuprofError(f"--nproc-per-node {nproc}: this node has {gpus} visible CUDA GPU(s){seen}, "
                               f"and each NCCL rank needs a GPU of its own; use at most {gpus}")
    else:
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        if nproc > cores:
            raise GpuprofError(f"--nproc-per-node {nproc}: this machine has {cores} CPU core(s) for "
                               f"gpuprof, and a CPU rank computes on at least one; more ranks than cores "
                               f"only wait on each other; use at most {cores}")
    floor = psutil.Process().memory_info().rss
    per_rank = floor + rank_bytes
    available = psutil.virtual_memory().available
    if nproc * per_rank > available:
        extra = f" + {gib(rank_bytes)} {rank_bytes_source}" if rank_bytes else ""
        raise GpuprofError(f"--nproc-per-node {nproc}: {nproc} ranks need at least {gib(nproc * per_rank)} "
                           f"of memory ({gib(floor)} each for a Python process with torch loaded, as "
                           f"gpuprof's own is now{extra}), and {gib(available)} is available; use at most "
                           f"{max(0, available // per_rank)}")


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
        with rank_env():
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
    for e in result.entries:
        for path in e.pop("files_opened", None) or ():
            result.opened[os.path.realpath(path)] = f"a file rank {e['rank']} opened"


def check_launcher(launcher: dict, standalone: bool = False) -> None:
    """Validate the launcher options as torchrun would, before anything starts (GpuprofError)."""
    from torch.distributed.run import parse_args

    with _agent_env_kept():  # log_dir os.devnull: torchrun's check makes no torchelastic_* folder
        _checked_args(parse_args, torchrun_args(launcher, standalone, "spec.json", log_dir=os.devnull))


@contextlib.contextmanager
def rank_env():
    """NCCL_RANK_ENV for the ranks torchrun starts (they inherit this process's environment),
    where the user has not set them; this process's environment is put back after."""
    added = [k for k in NCCL_RANK_ENV if k not in os.environ]
    os.environ.update({k: NCCL_RANK_ENV[k] for k in added})
    try:
        yield added
    finally:
        for k in added:
            os.environ.pop(k, None)


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
