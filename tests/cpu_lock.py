"""One many-process test at a time: a torchrun launch (ranks, its agent) or a loop watched by
py-spy from outside, run while another such test runs on the other pytest-xdist worker, leaves
no core free on this 2-core machine: a sampler at the lowest priority is starved (the phases it
attributes skew) and ranks time each other's waiting. These tests take one lock between them (a
file lock in pytest's base temporary folder, shared by the workers); other tests run beside them
as before, on the other core."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time

ENV = "GPUPROF_TEST_PROCESS_LOCK"
LOG_ENV = "GPUPROF_TEST_LOCK_LOG"  # a file: each holder appends its test, its wait and its hold


@contextlib.contextmanager
def many_processes():
    path = os.environ.get(ENV) or os.path.join(tempfile.gettempdir(), "gpuprof-tests-many-processes.lock")
    t0 = time.monotonic()
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        t1 = time.monotonic()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
            log = os.environ.get(LOG_ENV)
            if log:  # test, seconds waited, seconds held: the serial path these tests make
                with open(log, "a", encoding="utf-8") as g:
                    g.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '?')}\t{t1 - t0:.2f}\t"
                            f"{time.monotonic() - t1:.2f}\n")
