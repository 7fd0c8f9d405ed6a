"""Shared fixtures."""

import pytest

from mlx_swe_rl.scoring import Scorer


@pytest.fixture(scope="module")
def scorer():
    """A small sandbox pool per test module, closed (workers and directories) afterwards."""
    with Scorer(workers=2) as s:
        yield s
