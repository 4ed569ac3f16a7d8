"""py-spy, run from outside: the target's Python stacks in sample order, nothing injected into it.

`py-spy record --pid PID --format speedscope --idle` writes, when it stops (its duration, or
SIGINT), every sample of every thread in the order taken, each a stack of frames (function,
file, line) with the same weight, 1/rate seconds. Time here is sample count / rate: each sample
stands for one sampling period. (Its chrometrace format stamps a sample when py-spy's recorder
*processes* it, src/chrometrace.rs, so on a host whose cores the target fills the stamps bunch
where the target sleeps and the idle phases gain time; counts do not depend on that clock.)
`--idle` keeps stacks of a thread that sleeps or waits (a `time.sleep` or a blocking read in
`get_batch` is the data phase, not a gap). `--nonblocking` samples without pausing the target
(the default here: the target must not notice; py-spy warns that a stack may then be torn,
rarely). py-spy's own warnings that it fell behind its rate are kept (`behind`).

A target py-spy cannot read is one line (GpuprofError, exit 2) saying why and how to grant it:
no such process, not a Python process, or no permission to ptrace it (a container without
SYS_PTRACE, the kernel's yama.ptrace_scope, another user's process).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sysconfig
import time
from dataclasses import dataclass, field

from gpuprof.attach.gentle import at_start_priority
from gpuprof.errors import GpuprofError
from gpuprof.units import UNKNOWN

Frame = tuple  # (function name, file name, line): the line the frame is at (None when unknown)


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


def parse_speedscope(doc: dict) -> dict[int, Timeline]:
    """py-spy's speedscope document -> each thread's timeline: one span per sample, in the order
    taken, as long as its weight (1/rate s), stack outermost first."""
    frames = [(str(f.get("name", UNKNOWN)), str(f.get("file", "")), f.get("line"))
              for f in (doc.get("shared") or {}).get("frames") or [] if isinstance(f, dict)]
    out: dict[int, Timeline] = {}
    for n, prof in enumerate(doc.get("profiles") or []):
        if not isinstance(prof, dict) or prof.get("type") != "sampled":
            continue
        m = re.match(r"Thread (\d+)", str(prof.get("name", "")))
        tl = Timeline(int(m.group(1)) if m else n)
        t = float(prof.get("startValue") or 0.0)
        for sample, weight in zip(prof.get("samples") or [], prof.get("weights") or []):
            stack = tuple(frames[i] for i in sample if isinstance(i, int) and 0 <= i < len(frames))
            tl.spans.append((t, t + float(weight), stack))
            t += float(weight)
        out[tl.tid] = tl
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


# py-spy's niceness: 0, gpuprof's own. At 10 (tried before) a target that fills every core
# starved the sampler during its compute: samples came late, bunched where it slept, and the
# short once-per-step code went unsampled (3 of ~46 optimizer steps seen in 8 s at 200/s, 12 at
# niceness 0). py-spy's CPU is the same either way (~3% of a core at 200/s, measured with time(1)):
# the priority only decides who waits.
NICENESS = 0


def _lower_priority() -> None:
    """In py-spy's process before it starts (NICENESS above)."""
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
        argv = [exe or pyspy_binary(), "record", "--pid", str(pid), "--format", "speedscope", "--idle",
                "--rate", str(rate), "--output", out_path, "--duration", str(max(1, int(round(duration_s))))]
        if nonblocking:
            argv.append("--nonblocking")
        self.argv = argv
        self.started_at = time.time()  # py-spy's timestamps count from about here
        # A session of its own: a terminal's Ctrl-C reaches gpuprof, which stops py-spy itself. Started
        # at the priority gpuprof was started with, whatever its main thread's now (attach.gentle).
        self.proc = at_start_priority(lambda: subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, preexec_fn=_lower_priority))
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
        info = {"samples": None, "errors": None, "started_at": self.started_at, "behind": 0, "behind_max_s": None}
        for line in self.output.splitlines():
            m = re.search(r"([0-9.]+)s behind in sampling", line)  # py-spy warns when it falls behind its rate
            if m:
                info["behind"] += 1
                info["behind_max_s"] = max(info["behind_max_s"] or 0.0, float(m.group(1)))
            if "Samples:" in line:  # "py-spy> Wrote speedscope file to '...'. Samples: 94 Errors: 0"
                parts = line.replace(".", " ").split()
                for key in ("Samples:", "Errors:"):
                    if key in parts and parts.index(key) + 1 < len(parts):
                        try:
                            info[key[:-1].lower()] = int(parts[parts.index(key) + 1])
                        except ValueError:
                            pass
        return parse_speedscope(events if isinstance(events, dict) else {}), info
