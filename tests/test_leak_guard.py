"""tests/leak_guard.py finds a process a test left running, an orphan in a session of its own
included (as torchrun's ranks are), and lets multiprocessing's session helpers be."""

import os
import subprocess
import sys
import time

import leak_guard


def _start(*argv, env=None):
    return subprocess.Popen([sys.executable, "-c", *argv], start_new_session=True, env=env)


def test_an_orphaned_process_in_a_session_of_its_own_is_found_and_killed():
    value = leak_guard.mark()
    assert os.environ[leak_guard.MARK] == value and value.startswith(f"{os.getpid()}-")
    # a grandchild whose parent exits at once: reparented, no longer this process's child
    parent = _start("import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
                    "start_new_session=True); print(flush=True)")
    parent.wait(timeout=30)
    end = time.monotonic() + 30
    while not leak_guard.marked_processes(value) and time.monotonic() < end:
        time.sleep(0.05)
    found = leak_guard.marked_processes(value)
    assert len(found) == 1 and "time.sleep(60)" in next(iter(found.values()))
    (pid,) = found
    left = leak_guard.leftovers(value, grace_s=0.3)
    assert set(left) == {pid}
    end = time.monotonic() + 10  # killed: gone (its parent, init or a subreaper, reaps it)
    while leak_guard.marked_processes(value) and time.monotonic() < end:
        time.sleep(0.05)
    assert leak_guard.marked_processes(value) == {}


def test_a_process_that_ends_within_the_grace_is_no_leak_and_another_mark_is_not_ours():
    value = leak_guard.mark()
    short = _start("import time; time.sleep(0.5)")
    other = _start("import time; time.sleep(30)", env={**os.environ, leak_guard.MARK: "someone-else"})
    try:
        assert leak_guard.leftovers(value, grace_s=10) == {}
        assert short.poll() is not None and other.poll() is None
    finally:
        other.kill()
        for p in (short, other):
            p.wait()
