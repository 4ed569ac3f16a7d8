"""No test leaves a process running after its file ends.

A leaked process costs every test after it: a plain torchrun whose process group a test killed
left its two ranks (in sessions of their own, no longer the test's children) running for minutes
at ~0.85 of a core between them (2026-12-07), found only by watching `ps`. A child list misses such
orphans, so each pytest process marks its environment (MARK), which every process it starts
inherits unless a test hands it an environment of its own; after the last test of each file, any
process on the host still carrying this process's mark is killed and that test's teardown fails,
naming it. Processes Python's multiprocessing keeps for the session (its resource tracker and
forkserver) are not leaks.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

MARK = "GPUPROF_TEST_PROCESS_MARK"
GRACE_S = 10.0  # a process a test has just signalled may take a moment to go
HAS_PROC = os.path.isdir("/proc/self")  # Linux: where the suite runs
SESSION_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def mark() -> str:
    """This process's mark, set in its environment the first time it is asked for."""
    value = os.environ.get(MARK, "")
    if not value.startswith(f"{os.getpid()}-"):  # inherited from a parent pytest: take one of our own
        value = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        os.environ[MARK] = value
    return value


def marked_processes(value: str) -> dict[int, str]:
    """pid -> command line of every live process (zombies aside) whose environment holds
    MARK=value, other than this one and multiprocessing's session helpers."""
    needle = f"{MARK}={value}".encode() + b"\0"
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read() + b"\0"
            if needle not in env:
                continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone, or not ours to read
            continue
        if cmd and not any(h in cmd for h in SESSION_HELPERS):
            found[int(name)] = cmd
    return found


def leftovers(value: str, grace_s: float = GRACE_S) -> dict[int, str]:
    """The marked processes still alive after up to `grace_s` seconds of waiting for them to go;
    those are killed before returning."""
    end = time.monotonic() + grace_s
    found = marked_processes(value)
    while found and time.monotonic() < end:
        time.sleep(0.2)
        found = marked_processes(value)
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield  # the test's fixtures, a module's among them when its file ends, are torn down
    if HAS_PROC and (nextitem is None or nextitem.path != item.path):
        left = leftovers(mark())
        if left:
            raise AssertionError(f"{item.path.name} left {len(left)} process(es) running (now killed): "
                                 + "; ".join(f"{pid}: {cmd[:200]}" for pid, cmd in sorted(left.items())))
    return result
