"""Suite-wide settings.

Timing tests run torch on one intra-op thread. On a shared 2-core machine, torch's two
OpenMP threads stall each other whenever another process takes one core (we measured a
tiny-model step go from 0.25 s to 14.6 s with one busy-loop process beside it), which
makes every time share meaningless. With one thread the other core absorbs the noise.
This is a test-environment choice: gpuprof itself never changes the thread count.
"""

import sys
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# tests/fakes/ holds contract fakes shared by several test folders (import as `fakes.cuda`).
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda replaced by the contract fake (one H200-like device) for this test."""
    from fakes.cuda import FakeCuda

    return FakeCuda().install(monkeypatch)


def pytest_configure(config):
    config.addinivalue_line("markers", "adversarial: builds impossible profiles on purpose (the bounds check skips it)")


@pytest.fixture(autouse=True)
def _every_profile_is_physical(request, monkeypatch):
    """Every profile and every analysis a test produces passes the one physical-bounds checker
    (gpuprof.analysis.bounds): no MFU above 100%, no share outside 0-1, no CPU above the cores, no
    savings above the step. GPUPROF_TEST_STRICT_BOUNDS=1 also makes the analysis refuse a
    producer's impossible figure instead of reporting it as unrepaired."""
    from gpuprof.analysis.bounds import analysis_violations, measured_violations
    from gpuprof.analysis.pipeline import Analysis
    from gpuprof.profile import Profile

    if request.node.get_closest_marker("adversarial"):
        yield
        return
    monkeypatch.setenv("GPUPROF_TEST_STRICT_BOUNDS", "1")
    made, judged = [], []
    for cls, into in ((Profile, made), (Analysis, judged)):
        original = cls.__init__

        def init(self, *args, _original=original, _into=into, **kwargs):
            _original(self, *args, **kwargs)
            _into.append(self)

        monkeypatch.setattr(cls, "__init__", init)
    yield
    bad = [(p.run.get("mode"), v) for p in made if p.steps for v in measured_violations(p)]
    bad += [("analysis", v) for a in judged for v in analysis_violations(a.stats, a.mfu, a.findings)]
    assert not bad, f"impossible figures in a profile or analysis this test produced: {bad[:5]}"
