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
    """gpuprof in a process of its own; a torchrun launch (--nproc-per-node) one at a time across
    the test workers (tests/cpu_lock.py)."""
    import contextlib

    from cpu_lock import many_processes

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    lock = many_processes() if "--nproc-per-node" in map(str, args) else contextlib.nullcontext()
    with lock:
        return subprocess.run([sys.executable, "-m", "gpuprof", *map(str, args)], capture_output=True,
                              text=True, timeout=timeout, cwd=cwd, env=env, **popen)


def gpuprof_here(*args) -> subprocess.CompletedProcess:
    """gpuprof's own entry point in this process, for a verb that launches nothing (merge): the
    exit code, stdout and stderr a process of its own gives, without a Python start-up."""
    import contextlib
    import io

    from gpuprof.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([*map(str, args)])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return subprocess.CompletedProcess(["gpuprof", *map(str, args)], code, out.getvalue(), err.getvalue())


def finding(profile: dict, fid: str) -> dict | None:
    """A finding of a saved profile's analysis (a --out file: {..., "analysis": {"findings": [...]}})."""
    return next((f for f in profile["analysis"]["findings"] if f["id"] == fid), None)


def rank_stats(entry: dict):
    """A rank entry's step statistics (its profile is measurements only: they are derived)."""
    from gpuprof.profile import Profile

    return Profile.from_dict(entry["profile"]).stats


def load(path) -> dict:
    return json.loads(Path(path).read_text())
