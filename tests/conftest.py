"""Shared fixtures."""

import pytest

from mlx_swe_rl.sandbox.scorer import Scorer


@pytest.fixture(scope="module")
def scorer():
    """A small sandbox pool per test module, closed (workers and directories) afterwards."""
    with Scorer(workers=2) as s:
        yield s


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Qwen2 mlx-lm model directory with a real BPE tokenizer and chat template."""
    from tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    """(model, tokenizer) of the tiny model, loaded once per session (tests must not train it)."""
    from mlx_swe_rl.models.specs import load_model

    return load_model(str(tiny_model_dir))
