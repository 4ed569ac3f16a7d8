"""Suite-wide settings.

Timing tests run torch on one intra-op thread. On a shared 2-core machine, torch's two
OpenMP threads stall each other whenever another process takes one core (we measured a
tiny-model step go from 0.25 s to 14.6 s with one busy-loop process beside it), which
makes every time share meaningless. With one thread the other core absorbs the noise; under
the README's `-n 2` (pytest-xdist) each of the two workers is one such thread, one per core, and
the timing tests assert shares and ratios measured within one run, which a busy neighbour moves
alike. This is a test-environment choice: gpuprof itself never changes the thread count.

Every profile and analysis a test makes is checked against the physical bounds
(tests/strict_bounds.py).
"""

import os
import signal
import sys
from pathlib import Path

# Bytecode caches are written whatever PYTHONDONTWRITEBYTECODE says (the project's VM's shell sets
# it): without them each pytest-xdist worker rewrote every test module's asserts at collection
# (collecting alone: 15 s here, 6-8 s with the caches) and every process a test starts compiled gpuprof's
# ~36,000 lines again (0.4 s more to import it all). They go to __pycache__ folders, ignored by git.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# The Ctrl-C tests send SIGINT to the processes they start. A suite started in the background by a
# shell without job control (`python -m pytest ... &` in a script) inherits SIGINT ignored, and so
# does every process it starts (Python installs its Ctrl-C handler only where SIGINT is not
# ignored): four such tests failed for the way the suite was started (2026-12-07). The suite's
# processes get Ctrl-C's default back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# tests/ on the path: fakes/ holds contract fakes shared by several test folders (import as
# `fakes.cuda`); strict_bounds is the physical-bounds check every test passes.
sys.path.insert(0, str(Path(__file__).parent))

import leak_guard  # noqa: E402
import strict_bounds  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _process_lock_path(tmp_path_factory):
    """cpu_lock's lock file in the folder all pytest-xdist workers' temporary folders are in."""
    import os

    from cpu_lock import ENV

    base = tmp_path_factory.getbasetemp()
    os.environ.setdefault(ENV, str((base.parent if base.name.startswith("popen-gw") else base) / "many-processes.lock"))
    yield


@pytest.fixture
def one_many_process_test():
    """This test runs no other many-process test beside it (tests/cpu_lock.py)."""
    from cpu_lock import many_processes

    with many_processes():
        yield


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda replaced by the contract fake (one H200-like device) for this test."""
    from fakes.cuda import FakeCuda

    return FakeCuda().install(monkeypatch)


def pytest_configure(config):
    # Every profile and analysis a test makes passes the physical-bounds checker, or the test fails
    # (tests/strict_bounds.py; a test marked `adversarial` is exempt).
    if not config.pluginmanager.is_registered(strict_bounds):
        config.pluginmanager.register(strict_bounds, "gpuprof-strict-bounds")
    # No test file leaves a process running (tests/leak_guard.py): each pytest process marks its
    # environment before any test starts a process.
    leak_guard.mark()
    if not config.pluginmanager.is_registered(leak_guard):
        config.pluginmanager.register(leak_guard, "gpuprof-leak-guard")


# The tests that take tests/cpu_lock.py's lock run one at a time whatever worker runs them; spread
# over both workers they made one wait on the other (68 s of a 427-s run, 2026-12-07). Under
# pytest-xdist (`-n 2`) this scheduler makes them one work unit, run first by one worker while the
# other worker runs the rest; every other test file is a unit of its own, so that a module's
# fixtures run once (a torchrun launch set up on both workers cost 43 + 24 s). A scheduler of our
# own: xdist's `--dist loadgroup` renames node ids, which pytest 9.2 no longer lets it do.
LAUNCH_FILES = {"tests/distributed/test_torchrun.py", "tests/distributed/test_fsdp.py",  # ddp_helpers.gpuprof
                "tests/distributed/test_watch_ranks.py", "tests/distributed/test_torchrun_module.py"}
LOCK_TESTS = {  # the tests that take the lock through the one_many_process_test fixture (checked below)
    "tests/watch/test_watch_pid.py::test_a_running_loop_whose_loader_slows_is_watched_from_outside",
    "tests/watch/test_watch_run.py::test_a_periodic_eval_is_no_change_and_is_named_periodic",
    "tests/attach/test_attach.py::test_a_torchrun_launchers_ranks_are_attached_and_merged",
    "tests/distributed/test_launch_safety.py::test_no_rank_outlives_gpuprof",
}
MANY = "many-processes"


def work_unit(nodeid: str) -> str:
    """The unit a test is scheduled in: MANY, or its file."""
    file = nodeid.split("::", 1)[0]
    return MANY if file in LAUNCH_FILES or nodeid.split("[", 1)[0] in LOCK_TESTS else file


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class Scheduler(LoadScopeScheduling):
        """xdist's scope scheduling with our units, in collection order (MANY first, see below)."""

        def _split_scope(self, nodeid):
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # not by size: the serial chain is the longest unit
    return Scheduler(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    many = [item for item in items if work_unit(item.nodeid) == MANY]
    first = set(many)
    for item in items:
        if "one_many_process_test" in getattr(item, "fixturenames", ()) and item not in first:
            raise pytest.UsageError(f"{item.nodeid} takes the many-process lock: list it in tests/conftest.py LOCK_TESTS")
    # the serial chain first: nothing can run beside it on its worker, and it is the longest unit
    items[:] = many + [item for item in items if item not in first]
