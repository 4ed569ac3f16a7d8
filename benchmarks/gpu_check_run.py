"""gpu_check: running a check's commands. Ctx runs gpuprof (or a script) from the checkout in a
process group of its own within the run's time budget; Proc is one finished run, Check one
check's outcome; child_env keeps every cache and temp file of the children in one folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TAIL_CHARS = 4000  # output kept for the report when a run fails


@dataclass
class Proc:
    """One finished subprocess: what ran, how it ended, its merged stdout+stderr."""

    argv: list[str]
    rc: int | None
    output: str
    wall_s: float
    timed_out: bool = False
    timeout_s: float | None = None

    def tail(self, n: int = TAIL_CHARS) -> str:
        return self.output[-n:]


@dataclass
class Check:
    """The outcome of one check: PASS, FAIL or SKIP, why, and every figure it read."""

    name: str
    status: str = "SKIP"
    reason: str = ""
    figures: dict = field(default_factory=dict)
    runs: list[Proc] = field(default_factory=list)
    wall_s: float = 0.0
    error: str = ""  # a traceback when the check itself broke

    def decide(self, ok: bool, reason: str) -> "Check":
        self.status, self.reason = ("PASS" if ok else "FAIL"), reason
        return self

    def skip(self, reason: str) -> "Check":
        self.status, self.reason = "SKIP", reason
        return self

    def line(self) -> str:
        return f"{self.status} {self.name}: {self.reason}"


@dataclass
class Ctx:
    """What every check needs: where to run, the time left, the GPU's identity, shared results."""

    tmp: Path
    smoke: bool
    deadline: float  # time.monotonic() by which the whole run must end
    env: dict
    gpu_name: str | None = None
    torch_uuid: str | None = None
    profiles: dict = field(default_factory=dict)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, argv: list[str], budget_s: float) -> Proc:
        """argv from the checkout in a process group of its own, killed with its children at the
        timeout. Output goes to a file, not a pipe: a killed run's output is still there."""
        timeout = max(1.0, min(budget_s, self.left()))
        logs = self.tmp / "logs"
        logs.mkdir(exist_ok=True)
        log = logs / f"{len(list(logs.iterdir()))}.log"
        t0 = time.monotonic()
        timed_out = False
        with open(log, "w+", encoding="utf-8", errors="replace") as f:
            proc = subprocess.Popen(argv, cwd=REPO, env=self.env, stdin=subprocess.DEVNULL, stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:  # also on Ctrl-C; and after a normal exit, whatever it left running
                _kill_group(proc)
                proc.wait()
            wall = time.monotonic() - t0
            f.seek(0)
            out = f.read()
        return Proc(argv, proc.returncode, out, wall, timed_out, timeout)

    def run_until(self, argv: list[str], line_prefix: str, sig: int, budget_s: float) -> tuple[Proc, float | None]:
        """argv in a process group of its own; when a line starting with `line_prefix` appears, `sig`
        goes to the whole group (as a terminal's Ctrl-C). The run, and the seconds from the signal
        to its exit (None when the line never came)."""
        timeout = max(1.0, min(budget_s, self.left()))
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, cwd=REPO, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        lines, after, timed_out = [], None, False
        try:
            for line in proc.stdout:  # a hang here ends at the kill below (the budget's timer)
                lines.append(line)
                if line.startswith(line_prefix):
                    signalled = time.monotonic()
                    os.killpg(proc.pid, sig)
                    rest, _ = proc.communicate(timeout=max(1.0, timeout - (signalled - t0)))
                    lines.append(rest or "")
                    after = time.monotonic() - signalled
                    break
                if time.monotonic() - t0 > timeout:
                    timed_out = True
                    break
            else:
                proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc)
            proc.wait()
        return Proc(argv, proc.returncode, "".join(lines), time.monotonic() - t0, timed_out, timeout), after

    def diagnose(self, label: str, options: list[str], script: list[str] | None = None,
                 budget_s: float = 120.0) -> tuple[Proc, dict | None]:
        """`python -m gpuprof diagnose OPTIONS --out X [SCRIPT ARGS]` and the profile it wrote."""
        out = self.tmp / f"{label}.json"
        argv = [sys.executable, "-m", "gpuprof", "diagnose", *options, "--out", str(out), *(script or [])]
        proc = self.run(argv, budget_s)
        try:
            prof = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            prof = None
        return proc, prof if isinstance(prof, dict) else None


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's process group: the child and what it started (compile workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the group is already gone
        pass
    except (PermissionError, AttributeError, OSError):
        if proc.poll() is None:
            proc.kill()


def _ran(c: Check, proc: Proc, prof: dict | None) -> bool:
    """Record the run; False (and a FAIL) when it timed out, failed or wrote no profile."""
    c.runs.append(proc)
    if proc.timed_out:
        c.decide(False, f"timed out after {proc.timeout_s:.0f} s")
    elif proc.rc != 0:
        c.decide(False, f"exit code {proc.rc}" + (" (profile written)" if prof is not None else ""))
    elif prof is None:
        c.decide(False, "exit code 0 but no profile written")
    else:
        return True
    return False


def child_env(tmp: Path) -> dict:
    """The children's environment: gpuprof from this checkout; every cache and temp file in tmp."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    for var, sub in (("XDG_CACHE_HOME", "cache"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                     ("TRITON_CACHE_DIR", "triton"), ("TRITON_HOME", "triton-home"), ("CUDA_CACHE_PATH", "nv"),
                     ("TMPDIR", "tmp")):
        (tmp / sub).mkdir(exist_ok=True)
        env[var] = str(tmp / sub)
    env.update(COLUMNS="200", NO_COLOR="1", TERM="dumb", PYTHONUNBUFFERED="1")
    return env
