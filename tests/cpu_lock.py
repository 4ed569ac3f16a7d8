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

ENV = "GPUPROF_TEST_PROCESS_LOCK"


@contextlib.contextmanager
def many_processes():
    path = os.environ.get(ENV) or os.path.join(tempfile.gettempdir(), "gpuprof-tests-many-processes.lock")
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
