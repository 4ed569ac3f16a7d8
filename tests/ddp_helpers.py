"""Helpers for the data-parallel tests: real `gpuprof diagnose --nproc-per-node N` runs through
torchrun (gloo on CPU), in subprocesses bounded by timeouts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
DDP_SCRIPT = str(FIXTURES / "ddp_train.py")
# Short runs: 1 warmup + 4 measured steps, no post-run measurements (they are tested elsewhere).
FAST = ["--steps", "4", "--warmup", "1", "--post-budget", "0"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpuprof(*args, timeout=180, cwd=None, **popen) -> subprocess.CompletedProcess:
    """gpuprof's exit code, stdout and stderr. A torchrun launch (--nproc-per-node) runs one at a
    time across the test workers (tests/cpu_lock.py), its launching gpuprof in this process
    (launch_here); anything else, or a launch from another directory, in a process of its own."""
    from cpu_lock import many_processes

    args = [*map(str, args)]
    if "--nproc-per-node" not in args:
        return _own_process(args, timeout, cwd, popen)
    with many_processes():
        if cwd is None and not popen:
            return launch_here(args, timeout)
        return _own_process(args, timeout, cwd, popen)


def _own_process(args, timeout, cwd, popen) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "gpuprof", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env, **popen)


def launch_here(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    """`gpuprof ... --nproc-per-node N` with gpuprof's own process being this one, as torchrun's
    agent is gpuprof's process in a user's launch (runners/launch.py runs torchrun in-process and
    puts back the signal handlers and environment it changes). This process has torch imported: a
    launch saves gpuprof's start-up (~4 s on this 2-core VM, torch's import most of it) and its exit
    (~1.3 s), every second of it on the serial path of the launch lock. The ranks are processes of
    their own and write to file descriptors 1 and 2, which they inherit: both point at one file
    for stdout and one for stderr while the launch runs, as do sys.stdout and sys.stderr (one file
    offset each: what gpuprof and its ranks write lands in the order it was written, as through a
    pipe). A launch still running after `timeout` gets SIGTERM, as a user's kill: torchrun's agent
    stops the ranks and gpuprof exits with what it has (the test then fails on it)."""
    import contextlib
    import signal
    import tempfile
    import threading

    texts = []
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(tempfile.TemporaryFile()) for _ in (1, 2)]
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        env_before = os.environ.get("PYTHONUNBUFFERED")
        os.environ["PYTHONUNBUFFERED"] = "1"  # the ranks' lines arrive as they print them
        timer = threading.Timer(timeout, os.kill, (os.getpid(), signal.SIGTERM))
        try:
            os.dup2(files[0].fileno(), 1)
            os.dup2(files[1].fileno(), 2)
            py = [open(f.fileno(), "w", encoding="utf-8", buffering=1, closefd=False) for f in files]
            timer.start()
            with contextlib.redirect_stdout(py[0]), contextlib.redirect_stderr(py[1]):
                code = _main_exit_code(args)
            for f in py:
                f.close()
        finally:
            timer.cancel()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            if env_before is None:
                os.environ.pop("PYTHONUNBUFFERED", None)
            else:
                os.environ["PYTHONUNBUFFERED"] = env_before
        for f in files:
            f.seek(0)
            texts.append(f.read().decode("utf-8", errors="replace"))
    return subprocess.CompletedProcess(["gpuprof", *args], code, texts[0], texts[1])


def gpuprof_here(*args) -> subprocess.CompletedProcess:
    """gpuprof's own entry point in this process, for a verb that launches nothing (merge): the
    exit code, stdout and stderr a process of its own gives, without a Python start-up."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = _main_exit_code([*map(str, args)])
    return subprocess.CompletedProcess(["gpuprof", *map(str, args)], code, out.getvalue(), err.getvalue())


def _main_exit_code(args: list[str]) -> int:
    """gpuprof's entry point in this process; the exit code a process of its own would end with."""
    from gpuprof.cli import main

    try:
        main(args)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def finding(profile: dict, fid: str) -> dict | None:
    """A finding of a saved profile's analysis (a --out file: {..., "analysis": {"findings": [...]}})."""
    return next((f for f in profile["analysis"]["findings"] if f["id"] == fid), None)


def rank_stats(entry: dict):
    """A rank entry's step statistics (its profile is measurements only: they are derived)."""
    from gpuprof.profile import Profile

    return Profile.from_dict(entry["profile"]).stats


def load(path) -> dict:
    return json.loads(Path(path).read_text())
