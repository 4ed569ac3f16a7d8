"""The target process and its workers, read from outside with psutil while the stacks are sampled.

Per process: CPU seconds over the window (and as cores), its DataLoader workers (children: each
one's CPU, how many), bytes it read from storage (/proc/PID/io read_bytes: what reached the
block layer, page-cache hits excluded) and through read() calls (rchar: cache hits included),
and the large files it has open with the filesystem they live on and how much of each the page
cache holds (the same facts as `bench-disk`). So "it's disk I/O" is confirmed or refuted with
the job's own bytes per second against what that storage delivers (`gpuprof bench-disk PATH`).
"""

from __future__ import annotations

import os
import re
import subprocess
import time

import psutil

from gpuprof.errors import GpuprofError
from gpuprof.measure.os_counters import proc_children
from gpuprof.units import UNKNOWN

BIG_FILE = 1 << 20  # open files at least this large are the dataset's candidates


def open_process(pid: int, suggest: str = "gpuprof attach {pid}") -> psutil.Process:
    """The process, or one line (exit 2): no such process; not Python (then its Python child
    processes, and `suggest` for the first: the command to give its PID to)."""
    if pid <= 0:
        raise GpuprofError(f"no process {pid}: give the PID of a running training process")
    try:
        p = psutil.Process(pid)
        p.cmdline()
    except psutil.NoSuchProcess:
        raise GpuprofError(f"no process {pid}") from None
    except psutil.AccessDenied:
        return p  # py-spy says what is needed to read it
    if pid == os.getpid():
        raise GpuprofError(f"process {pid} is gpuprof itself")
    if is_python(p) is False:
        refuse_not_python(p, suggest)  # before any recording: a wrapper's PID names its Python child
    return p


_LIBPYTHON = re.compile(r"/libpython\d")


def is_python(p: psutil.Process) -> bool | None:
    """Whether py-spy would find a Python interpreter in the process, as py-spy looks for one:
    an executable named python* or a libpython mapped into its memory (/proc/PID/maps). None when
    that cannot be read (another user's process, not Linux): then py-spy decides, as before.
    Cheap (no ptrace): a Python process passes on its executable's name alone."""
    try:
        exe = p.exe()
    except psutil.AccessDenied:
        exe = ""
    except psutil.Error:
        return False  # gone (a zombie has no interpreter either)
    if "python" in os.path.basename(exe).lower():
        return True
    try:
        with open(f"/proc/{p.pid}/maps", encoding="utf-8", errors="replace") as f:
            return any(_LIBPYTHON.search(line) for line in f)
    except OSError:
        return None


def refuse_not_python(p: psutil.Process, suggest: str = "gpuprof attach {pid}") -> None:
    """Raise the one line (exit 2) for a process that is not Python, naming its Python descendants
    (a wrapper's: `bash run.sh`, `uv run`, `nohup sh -c`) and which one to attach to; return when
    py-spy can read it after all (an interpreter linked into a binary of another name).

    py-spy's own verdict decides (`py-spy dump`, non-blocking: about 0.1 s, nothing recorded), in
    the same words as a recording's failure (pyspy._explain). Only the process named is ever
    attached to: picking a child for the user would sample a process they did not name (and, of
    several, maybe not the one they meant), so the line says which PID to give instead."""
    from gpuprof.attach.pyspy import _explain, _first_line, pyspy_binary

    try:
        done = subprocess.run([pyspy_binary(), "dump", "--pid", str(p.pid), "--nonblocking"],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return  # the recording says what is wrong
    if done.returncode == 0:
        return
    output = (done.stdout or "") + (done.stderr or "")
    line = _explain(p.pid, output)
    if "not a Python program" not in line:
        raise GpuprofError(line)  # no permission, no such process: as a recording would say
    kids = python_descendants(p)
    runs = short_command(p)
    head = f"process {p.pid} is not a Python program py-spy can read" + (f" (it runs: {runs})" if runs else "")
    if not kids:
        raise GpuprofError(f"{head}, and none of its child processes is Python (py-spy: {_first_line(output)})")
    shown = ", ".join(f"PID {k['pid']} ({k['command']})" for k in kids[:3])
    more = f" and {len(kids) - 3} more" if len(kids) > 3 else ""
    if len(kids) == 1:
        raise GpuprofError(f"{head}; its Python child is {shown}: {suggest.format(pid=kids[0]['pid'])}")
    raise GpuprofError(f"{head}; its {len(kids)} Python child processes, most CPU first: {shown}{more}: "
                       f"{suggest.format(pid=kids[0]['pid'])}")


def python_descendants(p: psutil.Process) -> list[dict]:
    """The outermost Python processes under `p` (none of whose ancestors below `p` is Python): a
    training process's DataLoader workers and a torchrun agent's ranks are its own, not other
    candidates. Each {pid, command, cpu_s}, the most CPU first: cpu_s is its CPU seconds so far
    with every process under it (one reading of cpu_times each: the busy one is the training)."""
    try:
        kids = p.children(recursive=True)
    except psutil.Error:
        return []
    parent = {}
    for k in kids:
        try:
            parent[k.pid] = k.ppid()
        except psutil.Error:
            pass
    # gpuprof itself (run from the shell it was given) is never a candidate, nor a process it runs
    # under (`uv run gpuprof attach`)
    try:
        ours = {os.getpid(), *(a.pid for a in psutil.Process().parents())}
    except psutil.Error:
        ours = {os.getpid()}
    procs = {k.pid: k for k in kids if k.pid in parent and k.pid not in ours}
    python = {pid for pid, k in procs.items() if is_python(k) is True}

    def top(pid: int) -> int | None:
        """The outermost Python process at or above `pid` (below `p`), if any."""
        found = None
        while pid in parent:  # up to `p`, whose own parent is not among its descendants
            if pid in python:
                found = pid
            pid = parent[pid]
        return found

    cpu: dict[int, float] = {pid: 0.0 for pid in python if top(pid) == pid}
    for pid, k in procs.items():
        t = top(pid)
        if t is not None:
            cpu[t] += _cpu_s(k) or 0.0
    out = [{"pid": pid, "command": short_command(procs[pid]), "cpu_s": s} for pid, s in cpu.items()]
    return sorted(out, key=lambda d: (-d["cpu_s"], d["pid"]))


def short_command(p: psutil.Process, width: int = 60) -> str:
    """The command line on one line, the program by its name (not its path), cut to `width`
    characters."""
    try:
        argv = p.cmdline()
    except psutil.Error:
        argv = []
    if not argv:
        try:
            return p.name()
        except psutil.Error:
            return ""
    text = " ".join(" ".join([os.path.basename(argv[0]), *argv[1:]]).split())  # one line: `-c` code has newlines
    return text if len(text) <= width else text[:width - 3].rstrip() + "..."


def _cpu_s(p: psutil.Process) -> float | None:
    try:
        t = p.cpu_times()
        return t.user + t.system
    except (psutil.Error, OSError):
        return None


def _io(p: psutil.Process) -> tuple[int | None, int | None]:
    try:
        c = p.io_counters()
        return c.read_bytes, getattr(c, "read_chars", None)
    except (psutil.Error, OSError, AttributeError):
        return None, None


class ProcessWatch:
    """Readings of a process and its children between start() and stop(); poll() in between
    notices workers that come and go."""

    def __init__(self, proc: psutil.Process, clock=time.monotonic):
        self.p = proc
        self._clock = clock
        self._t0 = None
        self._cpu0 = None
        self._io0 = (None, None)
        self._children: dict[int, dict] = {}
        self._paths: set[str] = set()  # files open or mapped at any poll (a memmap lives for one batch)
        self.polls = 0
        self.ended_at: float | None = None  # seconds into the window when the target ended

    def start(self) -> None:
        self._t0 = self._clock()
        self._cpu0 = _cpu_s(self.p)
        self._io0 = _io(self.p)
        self.poll()

    def alive(self) -> bool:
        try:
            return self.p.is_running() and self.p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def poll(self) -> None:
        self.polls += 1
        if not self.alive():
            if self.ended_at is None:
                self.ended_at = self._clock() - self._t0
            return
        kids = descendants(self.p)
        self._paths.update(mapped_and_open(self.p.pid))
        for k in kids:
            c = self._children.get(k.pid)
            cpu = _cpu_s(k)
            if c is None:
                try:
                    name = " ".join(k.cmdline()[:3]) or k.name()
                except psutil.Error:
                    name = UNKNOWN
                self._children[k.pid] = {"pid": k.pid, "name": name, "cpu0": cpu, "cpu": cpu,
                                         "first_s": self._clock() - self._t0}
            elif cpu is not None:
                c["cpu"] = cpu

    def so_far(self) -> dict:
        """CPU in cores and storage reads per second since start() (for a live line; None where
        not readable)."""
        wall = self._clock() - self._t0
        cpu, (rb, _) = _cpu_s(self.p), _io(self.p)
        return {"cpu_cores": (cpu - self._cpu0) / wall if None not in (cpu, self._cpu0) and wall > 0 else None,
                "read_bytes_s": (rb - self._io0[0]) / wall if None not in (rb, self._io0[0]) and wall > 0 else None}

    def stop(self) -> dict:
        self.poll()
        wall = self._clock() - self._t0
        cpu1 = _cpu_s(self.p)
        io1 = _io(self.p)
        out: dict = {"pid": self.p.pid, "window_s": wall, "polls": self.polls, "ended_at_s": self.ended_at}
        try:
            out["command"] = self.p.cmdline()
        except psutil.Error:
            out["command"] = None
        cpu = (cpu1 - self._cpu0) if cpu1 is not None and self._cpu0 is not None else None
        out["cpu_s"] = cpu
        out["cpu_cores"] = cpu / wall if cpu is not None and wall > 0 else None
        workers = []
        for c in self._children.values():
            used = (c["cpu"] - c["cpu0"]) if c["cpu"] is not None and c["cpu0"] is not None else None
            span = max(wall - c["first_s"], 1e-9)
            workers.append({"pid": c["pid"], "name": c["name"], "cpu_s": used,
                            "cpu_share_of_a_core": used / span if used is not None else None})
        out["children"] = sorted(workers, key=lambda w: -(w["cpu_s"] or 0))
        rb0, rc0 = self._io0
        rb1, rc1 = io1
        out["read_bytes_s"] = (rb1 - rb0) / wall if None not in (rb0, rb1) and wall > 0 else None
        out["read_chars_s"] = (rc1 - rc0) / wall if None not in (rc0, rc1) and wall > 0 else None
        if out["read_bytes_s"] is None:
            out["io_not_measured"] = "no permission to read /proc/PID/io (another user's process), or the target ended"
        out["files"] = data_files(self._paths)
        out.update(launch_identity(self.p))
        return out


def descendants(p: psutil.Process) -> list[psutil.Process]:
    """Every process under `p`. psutil's children(recursive=True) reads /proc/*/stat of every
    process on the host (measured 1.7-2.7 ms of CPU with 69 processes on a 2-core VM, and more with
    more processes, at attach's 5 polls a second); /proc/PID/task/*/children reads only the target's
    own (0.16 ms). psutil's way where that file does not exist."""
    if not os.path.exists(f"/proc/{p.pid}/task/{p.pid}/children"):
        try:
            return p.children(recursive=True)
        except psutil.Error:
            return []
    pids, todo, seen = [], [p.pid], {p.pid}
    while todo:
        for k in proc_children(todo.pop()):
            if k not in seen:
                seen.add(k)
                pids.append(k)
                todo.append(k)
    out = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return out


def expand_launchers(pids: list[int]) -> tuple[list[int], list[str]]:
    """A torchrun (torch.distributed.run) launcher's PID stands for its ranks: the descendants
    started with a RANK in their environment, in rank order. ([pids], [notes])."""
    out, notes = [], []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            out.append(pid)  # open_process says what is wrong with it
            continue
        if "torch.distributed.run" not in cmd and "torchrun" not in cmd:
            out.append(pid)
            continue
        ranks = []
        for c in p.children(recursive=True):
            rank = launch_identity(c).get("rank")
            if rank is not None:
                ranks.append((rank, c.pid))
        if not ranks:
            out.append(pid)
            continue
        ranks.sort()
        out.extend(c for _, c in ranks)
        notes.append(f"process {pid} is a torchrun launcher: attaching to its {len(ranks)} ranks "
                     f"({', '.join(f'rank {r}: {c}' for r, c in ranks)})")
    return out, notes


def launch_identity(p: psutil.Process) -> dict:
    """RANK, LOCAL_RANK, WORLD_SIZE from the process's environment (torchrun sets them), where
    readable: a torchrun job's ranks attached together merge by their own ranks."""
    try:
        env = p.environ()
    except (psutil.Error, OSError):
        return {}
    out = {}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK"):
        try:
            out[key.lower()] = int(env[key])
        except (KeyError, ValueError):
            pass
    return out


def mapped_and_open(pid: int) -> set[str]:
    """Paths of regular files the process has open (/proc/PID/fd) or memory-mapped
    (/proc/PID/maps): nanoGPT's get_batch makes a new np.memmap per batch and drops it, so the
    dataset shows as a mapping while a batch is read. Cheap reads of /proc; empty elsewhere."""
    paths: set[str] = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("/"):
                paths.add(target)
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            data = f.read()  # one read: the kernel builds the text under the target's mmap lock
        for line in set(data.split(b"\n")):  # a library maps several regions: one path each
            i = line.find(b" /")  # address perms offset dev inode, then the path where there is one
            if i >= 0:
                paths.add(line[i + 1:].strip().decode("utf-8", "replace"))
    except OSError:
        pass
    return {p.removesuffix(" (deleted)") for p in paths}


def data_files(paths) -> list[dict]:
    """Of `paths`, the regular files of at least BIG_FILE bytes that are not libraries: path,
    size, the filesystem (kind: local, network, fuse, layered, memory) and page-cache residency."""
    from gpuprof.disk.fs import filesystem_info, residency

    out = []
    for path in sorted(paths):
        try:
            size = os.stat(path).st_size
        except OSError:
            continue
        if size < BIG_FILE or not os.path.isfile(path) or _library(path):
            continue
        entry: dict = {"path": path, "size_bytes": size}
        try:
            fs = filesystem_info(path)
            entry.update(fs_type=fs.type, fs_kind=fs.kind, mountpoint=fs.mountpoint, fs_warning=fs.warning)
        except OSError as exc:
            entry["fs_error"] = str(exc)
        try:
            r = residency(path)
            entry["page_cache_share"] = r.fraction
            if not r.known:
                entry["page_cache_note"] = r.reason
        except OSError as exc:
            entry["page_cache_note"] = f"not measured: {exc.strerror}"
        out.append(entry)
    return out[:20]


def _library(path: str) -> bool:
    """Shared libraries and Python's own files: mapped by every process, never the dataset."""
    base = os.path.basename(path)
    return (".so" in base or base.endswith((".py", ".pyc")) or "/site-packages/" in path
            or path.startswith(("/usr/lib", "/lib", "/usr/local/lib")) or "/python3" in path)
