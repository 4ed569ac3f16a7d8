"""`gpuprof attach PID` given a wrapper's PID (`bash run.sh`, `uv run`, `nohup sh -c ...`): refused
in one line (exit 2) before any recording starts, naming the Python child process to attach to.

Each wrapper is a real `sh` that stays the parent (`...; true` keeps it from exec-ing its last
command), its children real Pythons that sleep. Every process started is killed (its group)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

import psutil
import pytest

from gpuprof.attach.process import python_descendants

SLEEPER = "import time; time.sleep(30)"
SPINNER = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\ntime.sleep(30)"


def _py(code: str, tag: str) -> str:
    """A shell command running this interpreter on `code`; `tag` tells the command lines apart."""
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)} {tag}"


class Wrapper:
    """`sh -c SCRIPT` in a session of its own, until its Python children (`n`) have started."""

    def __init__(self, script: str, n: int):
        self.proc = subprocess.Popen(["sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self.pid = self.proc.pid
        end = time.monotonic() + 10
        while len(self.children()) < n:  # started, and the interpreter is in memory
            assert time.monotonic() < end, "the wrapper's children did not start"
            time.sleep(0.02)

    def children(self) -> list[psutil.Process]:
        out = []
        for c in psutil.Process(self.pid).children(recursive=True):
            try:
                if "python" in os.path.basename(c.exe()):  # exec'd: the interpreter is in memory
                    out.append(c)
            except psutil.Error:
                pass
        return out

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def _attach(pid: int) -> tuple[int, str, float]:
    """`gpuprof attach PID` in this process: (exit code, its last stderr line, seconds taken)."""
    import contextlib
    import io

    from gpuprof.cli import main

    err = io.StringIO()
    t = time.monotonic()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
            pytest.raises(SystemExit) as exc:
        main(["attach", str(pid), "--duration", "20"])
    took = time.monotonic() - t
    text = err.getvalue()
    assert "Traceback" not in text, text
    return exc.value.code, " ".join(text.strip().splitlines()[-1:]), took


@pytest.fixture
def wrapper():
    made: list[Wrapper] = []

    def make(script: str, n: int) -> Wrapper:
        made.append(Wrapper(script, n))
        return made[-1]

    try:
        yield make
    finally:
        for w in made:
            w.kill()


def test_a_wrappers_pid_names_its_python_child(wrapper):
    w = wrapper(f"{_py(SLEEPER, '--depth=4')}; true", 1)
    child = w.children()[0].pid
    code, line, took = _attach(w.pid)
    assert code == 2, line
    assert line.startswith(f"gpuprof: error: process {w.pid} is not a Python program py-spy can read (it runs: sh -c ")
    assert f"its Python child is PID {child} (" in line and "--depth=4)" in line, line
    assert line.endswith(f": gpuprof attach {child}"), line
    assert took < 3  # refused before the 20 s recording: nothing was sampled
    assert all(p.is_running() for p in [psutil.Process(w.pid), psutil.Process(child)])  # untouched


def test_several_python_children_are_listed_the_busiest_first(wrapper):
    w = wrapper(f"{_py(SLEEPER, 'idle')} & {_py(SPINNER, 'busy')} & wait; true", 2)
    kids = {c.cmdline()[-1]: c for c in w.children()}
    end = time.monotonic() + 2
    while sum(kids["busy"].cpu_times()[:2]) < 0.3:  # the busy one has used its CPU
        assert time.monotonic() < end
        time.sleep(0.02)
    kids = {tag: c.pid for tag, c in kids.items()}
    code, line, took = _attach(w.pid)
    assert code == 2 and took < 3, line
    assert "its 2 Python child processes, most CPU first: " in line, line
    busy, idle = line.index(f"PID {kids['busy']} ("), line.index(f"PID {kids['idle']} (")
    assert busy < idle, line
    assert line.endswith(f": gpuprof attach {kids['busy']}"), line
    assert " more" not in line


def test_more_than_three_say_how_many_more_and_workers_are_not_candidates(wrapper):
    # the first child has two Python children of its own (its workers): they are not candidates
    workers = (f"import subprocess, sys, time; [subprocess.Popen([sys.executable, '-c', {SLEEPER!r}]) "
               "for _ in range(2)]; time.sleep(30)")
    script = " & ".join([_py(workers, "trainer")] + [_py(SLEEPER, f"other{i}") for i in range(4)]) + " & wait; true"
    w = wrapper(script, 7)
    top = {p.pid for p in psutil.Process(w.pid).children() if p.pid in {c.pid for c in w.children()}}
    found = python_descendants(psutil.Process(w.pid))
    assert {d["pid"] for d in found} == top and len(top) == 5
    code, line, _ = _attach(w.pid)
    assert code == 2 and "its 5 Python child processes" in line and " and 2 more: gpuprof attach " in line, line
    assert line.count("PID ") == 3  # three children listed


def test_a_wrapper_without_a_python_child_says_so(wrapper):
    w = wrapper("sleep 30; true", 0)
    end = time.monotonic() + 5
    while not psutil.Process(w.pid).children():  # the sleep has started
        assert time.monotonic() < end
        time.sleep(0.02)
    code, line, took = _attach(w.pid)
    assert code == 2 and took < 3, line
    assert f"process {w.pid} is not a Python program py-spy can read (it runs: sh -c sleep 30; true)" in line, line
    assert "and none of its child processes is Python (py-spy: " in line, line
    assert "gpuprof attach" not in line


def test_gpuprof_itself_is_never_the_child_it_names():
    """`gpuprof attach $$` from a shell: gpuprof is that shell's Python child, never the answer."""
    parent = psutil.Process().parent()
    assert os.getpid() not in [d["pid"] for d in python_descendants(parent)]
