"""py-spy, run from outside: the target's Python stacks in time order, nothing injected into it.

`py-spy record --pid PID --format chrometrace --idle` writes, when it stops (its duration, or
SIGINT), begin/end events of every frame with a timestamp in microseconds, per thread: the
stacks between two consecutive timestamps are what the thread was running then. `--idle` keeps
stacks of a thread that sleeps or waits (a `time.sleep` or a blocking read in `get_batch` is
the data phase, not a gap). `--nonblocking` samples without pausing the target (the default
here: the target must not notice; py-spy warns that a stack may then be torn, rarely).

A target py-spy cannot read is one line (GpuprofError, exit 2) saying why and how to grant it:
no such process, not a Python process, or no permission to ptrace it (a container without
SYS_PTRACE, the kernel's yama.ptrace_scope, another user's process).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sysconfig
import time
from dataclasses import dataclass, field

from gpuprof.errors import GpuprofError

Frame = tuple[str, str]  # (function name, file name)


def pyspy_binary() -> str:
    """The py-spy executable: beside this Python's scripts (the PyPI wheel puts it there), else PATH."""
    exe = os.path.join(sysconfig.get_path("scripts"), "py-spy")
    if os.path.isfile(exe) and os.access(exe, os.X_OK):
        return exe
    found = shutil.which("py-spy")
    if found is None:
        raise GpuprofError("py-spy is not installed (pip install py-spy): `gpuprof attach` samples the "
                           "target's stacks with it")
    return found


def pyspy_version(exe: str | None = None) -> str | None:
    try:
        out = subprocess.run([exe or pyspy_binary(), "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError, GpuprofError):
        return None
    return out.stdout.strip().removeprefix("py-spy ").strip() or None


@dataclass
class Timeline:
    """One thread's stacks in time order: spans (t0_s, t1_s, stack), stack outermost first."""

    tid: int
    spans: list[tuple[float, float, tuple[Frame, ...]]] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(t1 - t0 for t0, t1, _ in self.spans)


def parse_chrometrace(events: list[dict]) -> dict[int, Timeline]:
    """py-spy's chrometrace events -> each thread's timeline. Within a thread, B pushes a frame
    and E pops one, both at the event's timestamp; between two timestamps the stack is constant."""
    by_tid: dict[int, list[dict]] = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") in ("B", "E"):
            by_tid.setdefault(int(e.get("tid", 0)), []).append(e)
    out: dict[int, Timeline] = {}
    for tid, evs in by_tid.items():
        tl = Timeline(tid)
        stack: list[Frame] = []
        t_prev: float | None = None
        for e in evs:  # py-spy writes them in time order
            t = float(e.get("ts", 0)) / 1e6
            if t_prev is not None and t > t_prev and stack:
                tl.spans.append((t_prev, t, tuple(stack)))
            t_prev = t
            args = e.get("args") or {}
            frame = (str(e.get("name", "?")), str(args.get("filename", "")))
            if e["ph"] == "B":
                stack.append(frame)
            elif stack:
                stack.pop()
        out[tid] = tl
    return out


def _explain(pid: int, text: str) -> str:
    """py-spy's failure, as one line that says what to do."""
    low = text.lower()
    if "permission denied" in low or "operation not permitted" in low or "ptrace" in low:
        scope = ""
        try:
            with open("/proc/sys/kernel/yama/ptrace_scope", encoding="ascii") as f:
                scope = f.read().strip()
        except OSError:
            pass
        how = ("run gpuprof as the same user with ptrace allowed: `sudo sysctl kernel.yama.ptrace_scope=0` "
               f"(it is {scope} now)" if scope and scope != "0" else
               "run gpuprof as the process's user or root; in a container, start it with --cap-add SYS_PTRACE")
        return f"no permission to read process {pid}'s memory (ptrace): {how}"
    if "no such process" in low or "failed to find process" in low or "not found" in low and "process" in low:
        return f"no process {pid}"
    if "python" in low and ("failed to find" in low or "doesn't appear" in low or "not a python" in low
                            or "failed to get" in low):
        return f"process {pid} is not a Python program py-spy can read ({_first_line(text)})"
    return f"py-spy could not sample process {pid}: {_first_line(text)}"


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("py-spy>")]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["no output"])[0][:300]


NICENESS = 10


def _lower_priority() -> None:
    """In py-spy's process before it starts: where cores are few, the target's training thread
    wins every contention with the sampler (benchmarks/attach_overhead.py)."""
    try:
        os.nice(NICENESS)
    except OSError:
        pass


class Recording:
    """One `py-spy record` of a process, in the background. `stop()` asks it to finish early
    (SIGINT: py-spy then writes what it has); `result()` waits and returns the thread timelines."""

    def __init__(self, pid: int, duration_s: float, out_path: str, *, rate: int = 100,
                 nonblocking: bool = True, exe: str | None = None):
        self.pid, self.duration_s, self.out_path, self.rate = pid, duration_s, out_path, rate
        self.nonblocking = nonblocking
        argv = [exe or pyspy_binary(), "record", "--pid", str(pid), "--format", "chrometrace", "--idle",
                "--rate", str(rate), "--output", out_path, "--duration", str(max(1, int(round(duration_s))))]
        if nonblocking:
            argv.append("--nonblocking")
        self.argv = argv
        self.started_at = time.time()  # py-spy's timestamps count from about here
        # A session of its own: a terminal's Ctrl-C reaches gpuprof, which stops py-spy itself.
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                     preexec_fn=_lower_priority)
        self.output = ""

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.running():
            try:
                self.proc.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass

    def result(self, timeout_s: float = 60.0) -> tuple[dict[int, Timeline], dict]:
        """(timelines by thread id, py-spy's own counts); GpuprofError when it wrote nothing."""
        try:
            out, _ = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        self.output = out or ""
        try:
            with open(self.out_path, encoding="utf-8") as f:
                events = json.load(f)
        except (OSError, ValueError):
            raise GpuprofError(_explain(self.pid, self.output)) from None
        info = {"samples": None, "errors": None, "started_at": self.started_at}
        for line in self.output.splitlines():
            if "Samples:" in line:  # "py-spy> Wrote chrome trace to '...'. Samples: 94 Errors: 0"
                parts = line.replace(".", " ").split()
                for key in ("Samples:", "Errors:"):
                    if key in parts and parts.index(key) + 1 < len(parts):
                        try:
                            info[key[:-1].lower()] = int(parts[parts.index(key) + 1])
                        except ValueError:
                            pass
        return parse_chrometrace(events if isinstance(events, list) else []), info
