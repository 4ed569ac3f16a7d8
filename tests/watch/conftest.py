"""The script every watch test runs: tests/watch/loader_slows_train.py (a tiny nanoGPT-shaped
loop whose loader can slow down mid-run, with an optional periodic eval), copied into each
test's folder. One torch thread (tests/conftest.py says why); every run is a few hundred steps
of a few ms."""

import shutil
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "loader_slows_train.py"


@pytest.fixture
def script(tmp_path) -> Path:
    path = tmp_path / "train.py"
    shutil.copy(SCRIPT, path)
    return path
