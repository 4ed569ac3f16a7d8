"""Fixtures for the data-parallel tests (helpers: tests/ddp_helpers.py)."""

import pytest


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """Where the DDP fixture script writes its token file (rank 0 writes, the others wait)."""
    return tmp_path_factory.mktemp("ddp-data")
