"""One rank of a data-parallel run: `python -m gpuprof.runners.rank SPEC.json`, started by
torch.distributed.run (torchrun) for every rank; never run by hand.

The rank runs the same instrumented code as a single process (the user's script under the hooks,
or the built-in loop in DDP), then writes `rank<RANK>.json` into the spec's folder: the rank's
identity, how it ended, its error, and its whole profile (gpuprof.merge joins them). Files are
the meeting point, as in torch.distributed.elastic's error files: a rank that dies without
writing one is reported by the launcher as missing, with the exit code torchrun saw.

Signals: the launcher (torchrun's agent) stops the surviving ranks with SIGTERM when one fails,
and forwards Ctrl-C as SIGINT (the terminal also sends it to every rank). The first of either is
raised in the rank as StoppedByLauncher (a KeyboardInterrupt: the run ends "interrupted" and its
completed steps are kept, with no post-run measurements) where gpuprof.interrupts allows it: in
the training loop and in a post-run part. One that arrives after the loop ended (this rank's
collective failed first) is noted, and the post-run parts skip; later ones are ignored so the
profile is written. A rank blocked inside a collective runs no Python until the collective returns:
`--rank-timeout` bounds that (the default timeout of init_process_group when the script gives
none), and torchrun kills what is left after its shutdown timeout.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import traceback
from datetime import timedelta

from gpuprof import interrupts
from gpuprof.files import atomic_write
from gpuprof.runners.launch import NCCL_RANK_ENV
from gpuprof.measure.opened import OpenedFiles


class StoppedByLauncher(KeyboardInterrupt):
    """SIGTERM/SIGINT from torchrun's agent (another rank failed, or Ctrl-C)."""


def identity() -> dict:
    env = os.environ
    return {"rank": int(env.get("RANK", 0)), "local_rank": int(env.get("LOCAL_RANK", 0)),
            "node_rank": int(env.get("GROUP_RANK", env.get("NODE_RANK", 0))),
            "world_size": int(env.get("WORLD_SIZE", 1)), "host": socket.gethostname()}


def rank_file(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rank{rank}.json")


_signalled: list[str] = []


def _on_signal(signum, frame):
    name = signal.Signals(signum).name
    _signalled.append(name)
    if not interrupts.may_raise():  # the run has ended: its steps are being read (gpuprof.interrupts)
        interrupts.note(name)
        return
    for s in (signal.SIGINT, signal.SIGTERM):  # one is enough: the profile must get written
        signal.signal(s, signal.SIG_IGN)
    raise StoppedByLauncher(f"stopped by {signal.Signals(signum).name}")


def default_timeout(seconds: float):
    """Give torch.distributed.init_process_group a timeout when the script passes none, so a
    rank waiting on a dead or hung peer raises instead of waiting gloo's 30 minutes."""
    import torch.distributed as dist

    orig = dist.init_process_group
    if getattr(orig, "_gpuprof", False):
        return

    def init_process_group(*args, **kwargs):
        kwargs.setdefault("timeout", timedelta(seconds=seconds))
        return orig(*args, **kwargs)

    init_process_group._gpuprof = True
    dist.init_process_group = init_process_group


def _instruments(samplers: bool, measure_compile: bool = False):
    from gpuprof.measure.instruments import diagnose_instruments

    return lambda dev, data: diagnose_instruments(dev, data, samplers, measure_compile)


def _script_target(spec: dict) -> dict:
    """run_script's keywords for the spec's script: a module (`-m`) is run from the launching
    process's working directory (torchrun's workers inherit it; a rank started elsewhere moves
    there first, as python -m looks for the module in it), and gpuprof's own options, guarded."""
    from gpuprof.runners.script_inputs import OwnOptions

    module = bool(spec.get("module"))
    if module and spec.get("cwd") and os.path.realpath(os.getcwd()) != os.path.realpath(spec["cwd"]):
        os.chdir(spec["cwd"])
    return {"module": module, "own_options": OwnOptions.from_dict(spec.get("own_options"))}


def _run_script(spec: dict) -> tuple[dict | None, str, dict | None]:
    from gpuprof.runners.script import run_script

    out = sys.stderr if spec.get("json") else sys.stdout
    result = run_script(spec["script"], spec.get("args", []), steps=spec["steps"], warmup=spec["warmup"],
                        stop=spec.get("stop", True), instruments_factory=_instruments(spec.get("samplers", True),
                                                                   spec.get("measure_compile", False)),
                        stdout=out, post_budget_s=spec.get("post_budget"), **_script_target(spec))
    prof = result.profile.to_dict() if result.profile is not None else None
    error = result.error
    if result.ended == "interrupted" and _signalled:
        error = _stopped()
    if prof is None and error is None:
        c = result.counts
        why = f"stopped: {result.no_step}; " if result.no_step else ""
        error = {"type": "NoStep", "file": None, "line": None,
                 "message": (f"no complete training step ({why}saw {c.get('forward', 0)} forwards, "
                             f"{c.get('backward', 0)} backwards, {c.get('optimizer_step', 0)} optimizer steps)")}
    return prof, result.ended, error


class _StragglerLines:
    """A rank's live line on stderr (through torchrun to the terminal): only the rank that fell
    behind says so, once per change of its own (the ranks that waited for it would say it N−1 times)."""

    def on_event(self, ev: dict) -> None:
        if ev.get("kind") == "straggler" and ev["cause"]["evidence"].get("self"):
            from gpuprof.report.watch import PLAIN, straggler_line

            print(PLAIN + straggler_line(ev), file=sys.stderr, flush=True)


def _run_watch(spec: dict) -> tuple[dict | None, str, dict | None]:
    """The script under `gpuprof watch` in this rank: its windows, changes and periodic events in
    its own events file (gpuprof.watch.run.rank_events_path), its whole-run profile (with the
    recorder's section) in its entry."""
    from pathlib import Path

    from gpuprof.watch.events import EventsFile
    from gpuprof.watch.run import WatchOptions, rank_events_path, run_watch
    from gpuprof.watch.windows import Every

    target = _script_target(spec)  # first: a module's rank may move to the launching folder
    w = spec["watch"]
    opts = WatchOptions(Every(**w["every"]), warmup=spec["warmup"], samplers=spec.get("samplers", True),
                        post_budget=spec.get("post_budget")).validate()
    me = identity()
    events = EventsFile(rank_events_path(Path(w["events"]), me["rank"])) if w.get("events") else None
    peers = None
    if events is not None and me["world_size"] > 1 and w.get("run_id"):
        # the other ranks' events files, read once per window: a rank that fell behind, named live
        from gpuprof.watch.ranks import PeerChanges

        peers = PeerChanges(me["rank"], {r: rank_events_path(Path(w["events"]), r) for r in range(me["world_size"])},
                            w["run_id"])
    out = sys.stderr if spec.get("json") else sys.stdout
    exporter = None
    if w.get("prometheus_port") is not None:  # this rank's port: the first + its local rank
        from gpuprof.errors import GpuprofError
        from gpuprof.watch.prometheus import Exporter

        port = int(w["prometheus_port"]) + me["local_rank"]
        exporter = Exporter(port, w.get("prometheus_addr") or "127.0.0.1")
        try:
            exporter.start()
        except GpuprofError as exc:  # taken since the launcher checked it: no metrics, the run goes on
            print(f"gpuprof: rank {me['rank']}: no metrics: {exc}", file=sys.stderr, flush=True)
            exporter = None
    try:
        result, _ = run_watch(spec["script"], spec.get("args", []), opts, events=events, exporter=exporter,
                              stdout=out, peers=peers, header={"rank": me["rank"], "run_id": w.get("run_id")},
                              display=_StragglerLines(), **target)
    except KeyboardInterrupt:
        return None, "interrupted", _stopped()
    prof = result.profile.to_dict() if result.profile is not None else None
    error = None
    if result.ended == "failed":
        error = {"type": "ScriptFailed", "file": None, "line": None, "message": result.error, "time": time.time()}
    elif result.ended == "interrupted" and _signalled:
        error = _stopped()
    return prof, result.ended, error


def _run_builtin(spec: dict) -> tuple[dict | None, str, dict | None]:
    from gpuprof.runners.builtin import LoopConfig, run_builtin

    cfg = LoopConfig(**spec["builtin"])
    try:
        profile = run_builtin(cfg, instruments=_instruments(spec.get("samplers", True),
                                                           spec.get("measure_compile", False))(cfg.device, cfg.data),
                              post_budget_s=spec.get("post_budget"), rank_timeout_s=spec.get("rank_timeout"))
    except KeyboardInterrupt:  # before a measured step completed
        return None, "interrupted", _stopped()
    if profile.run.get("ended") == "interrupted":
        return profile.to_dict(), "interrupted", _stopped()
    return profile.to_dict(), "finished", None


def _stopped() -> dict:
    """The error of a rank the launcher stopped, naming the signal it got (read after the run)."""
    return {"type": "StoppedByLauncher", "file": None, "line": None, "time": time.time(),
            "message": f"stopped by {(_signalled or ['SIGINT'])[0]} from the launcher "
                       "(another rank failed, or Ctrl-C)"}


def die_with_launcher(launcher_pid: int | None) -> bool:
    """Ask the kernel to SIGKILL this rank when the process that started it dies (Linux
    prctl(PR_SET_PDEATHSIG)): torchrun starts each rank in a session of its own, so without this
    a rank outlives a gpuprof killed by SIGKILL. Exits at once when the launcher died before the
    request took effect. False where the request is not available (not Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # 1 = PR_SET_PDEATHSIG
            return False
    except (OSError, AttributeError):
        return False
    if launcher_pid is not None and os.getppid() != launcher_pid:
        os._exit(1)  # orphaned already: the launcher is gone
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0], encoding="utf-8") as f:
        spec = json.load(f)
    die_with_launcher(spec.get("launcher_pid"))
    me = identity()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _on_signal)
    if spec.get("rank_timeout"):
        default_timeout(float(spec["rank_timeout"]))
    status, prof, error = "failed", None, None
    opened = OpenedFiles()
    try:
        run = {"builtin": _run_builtin, "watch": _run_watch}.get(spec["mode"], _run_script)
        with opened, interrupts.held():  # a stop is raised only inside the run's loop and post-run parts
            prof, ended, error = run(spec)
        status = {"failed": "failed", "interrupted": "interrupted"}.get(ended, "ok")
        if prof is None and status == "ok":
            status = "failed"
    except BaseException as exc:  # noqa: BLE001 - gpuprof's own failure in this rank: report it
        tb = traceback.extract_tb(exc.__traceback__)
        where = tb[-1] if tb else None
        error = {"type": type(exc).__name__, "message": str(exc) or type(exc).__name__,
                 "file": where.filename if where else None, "line": where.lineno if where else None,
                 "time": time.time()}
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    entry = {**{k: me[k] for k in ("rank", "local_rank", "node_rank", "host")},
             "world_size": me["world_size"], "status": status, "error": error, "profile": prof,
             "files_opened": sorted(opened.paths),  # the launcher's outputs never replace them
             "nccl_env": {k: os.environ.get(k) for k in NCCL_RANK_ENV}}  # how NCCL failures end here
    atomic_write(rank_file(spec["folder"], me["rank"]), json.dumps(entry))
    if status == "ok":  # with a dead peer, tearing down (NCCL) can block: just exit
        _destroy_process_group()
    return {"ok": 0, "interrupted": 130}.get(status, 1)


def _destroy_process_group() -> None:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - exiting anyway
        pass


if __name__ == "__main__":
    sys.exit(main())
