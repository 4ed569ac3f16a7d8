"""Suite-wide settings.

Timing tests run torch on one intra-op thread. On a shared 2-core machine, torch's two
OpenMP threads stall each other whenever another process takes one core (we measured a
tiny-model step go from 0.25 s to 14.6 s with one busy-loop process beside it), which
makes every time share meaningless. With one thread the other core absorbs the noise.
This is a test-environment choice: gpuprof itself never changes the thread count.
"""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
