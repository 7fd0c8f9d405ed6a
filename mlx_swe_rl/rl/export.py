"""`mlx-swe-rl export RUN_DIR --out DIR`: a standalone mlx-lm model from a run, checked.

The run's base model (config.yaml's `model.spec` and `model.dtype`) is loaded with the run's
adapters (the run directory is an mlx-lm adapter path), the LoRA layers are fused with
mlx-lm's own `fuse()` (a full fine-tune's saved weights need none), and mlx-lm's `save` writes
the weights, config and tokenizer. Then the export checks itself: the greedy completions of
the exported directory, loaded afresh like any user would load it, must equal the adapter
model's token for token on a set of puzzles (default: the run's evaluation puzzles, a few of
them). Fusing changes the arithmetic (W x + s (x A) B becomes (W + s A B) x), so this is the
check that the rounding did not change a decision; a dropped or altered weight fails it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..env.prompts import build_messages
from ..models.sampling import encode_chat, sample
from ..puzzles.format import Puzzle
from ..runfiles import staged_directory
from .config import Config, ConfigError, load_config

GGUF_ARCHITECTURES = ("llama", "mixtral", "mistral")  # what mlx_lm.fuse --export-gguf converts
EXPORT_FILE = "export.json"  # in the exported directory: where it came from and how it was checked


class ExportError(Exception):
    """A run that cannot be exported; the message is one line for the user."""


@dataclass
class CheckResult:
    """Greedy completions of an exported model against the adapter model's, per puzzle."""

    what: str  # "mlx-lm directory" or "GGUF"
    puzzles: list[str]
    max_tokens: int
    differing: list[dict[str, Any]] = field(default_factory=list)  # puzzle, first differing token
    tokens: int = 0  # tokens the adapter model generated in all
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.differing

    def line(self) -> str:
        n = len(self.puzzles)
        if self.ok:
            return (f"check ({self.what}): greedy completions identical to the adapter model's on {n} of {n} "
                    f"puzzles ({self.tokens} tokens, up to {self.max_tokens} each; {self.seconds:.1f}s)")
        first = self.differing[0]
        return (f"check ({self.what}) failed: greedy completions differ from the adapter model's on "
                f"{len(self.differing)} of {n} puzzles (first: {first['puzzle']}, {first['where']})")


@dataclass
class ExportResult:
    out: Path
    mode: str  # lora (fused) or full
    fused_layers: int
    seconds: float  # load, fuse and save
    reference_seconds: float = 0.0  # the adapter model's greedy completions
    checks: list[CheckResult] = field(default_factory=list)
    gguf: Path | None = None
    gguf_seconds: float = 0.0
    adapter_dtype: str | None = None  # --adapter-only: the adapter's arrays were written in this dtype

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


# --- the run -----------------------------------------------------------------------------------

def run_config(run_dir: Path) -> Config:
    """The config a run was trained with, or ExportError for a directory that is no run."""
    if not run_dir.is_dir():
        raise ExportError(f"{run_dir}: no such directory")
    for name in ("config.yaml", "adapter_config.json", "adapters.safetensors"):
        if not (run_dir / name).is_file():
            raise ExportError(f"{run_dir}: no {name} (not a run directory, or no checkpoint saved yet)")
    try:
        return load_config(run_dir / "config.yaml")
    except ConfigError as exc:
        raise ExportError(str(exc)) from None


def check_puzzles(cfg: Config, count: int) -> list[Puzzle]:
    """`count` of the run's evaluation puzzles, spread evenly over them (tiers and splits come
    in order, so the first few would all be one tier's)."""
    from ..puzzles.format import PuzzleError
    from ..puzzles.trainset import TrainSetError
    from .rundir import eval_puzzles, training_puzzles

    try:
        every = eval_puzzles(cfg, training_puzzles(cfg))
    except (PuzzleError, TrainSetError) as exc:
        raise ExportError(f"the run's evaluation puzzles cannot be loaded ({exc}); pass --puzzles") from None
    return spread(every, count)


def spread(puzzles: list[Puzzle], count: int) -> list[Puzzle]:
    """At most `count` of `puzzles`, evenly spaced, in order."""
    if count >= len(puzzles):
        return list(puzzles)
    return [puzzles[i * len(puzzles) // count] for i in range(count)]


# --- greedy completions ------------------------------------------------------------------------

def greedy_tokens(model: Any, tokenizer: Any, puzzles: list[Puzzle], max_tokens: int,
                  batch_size: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, greedy completion ids) per puzzle, with the chat prompt training uses and
    the project's sampler at temperature 0."""
    prompts = [encode_chat(tokenizer, build_messages(p)) for p in puzzles]
    result = sample(model, tokenizer, prompts, max_tokens=max_tokens, temperature=0.0, seed=0,
                    batch_size=batch_size, logprobs=False)
    return [(prompt, group[0].token_ids) for prompt, group in zip(prompts, result.groups)]


def compare(what: str, puzzles: list[Puzzle], reference: list[tuple[list[int], list[int]]],
            exported: list[tuple[list[int], list[int]]], max_tokens: int, seconds: float) -> CheckResult:
    """Which puzzles' prompts or completions differ between the adapter model and an export."""
    result = CheckResult(what, [p.id for p in puzzles], max_tokens, tokens=sum(len(c) for _, c in reference),
                         seconds=seconds)
    for puzzle, (ref_prompt, ref), (got_prompt, got) in zip(puzzles, reference, exported):
        if ref_prompt != got_prompt:
            result.differing.append({"puzzle": puzzle.id, "where": "the chat prompt tokenizes differently"})
        elif ref != got:
            at = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
            result.differing.append({"puzzle": puzzle.id, "where": f"token {at} of {len(ref)}"})
    return result


# --- export ------------------------------------------------------------------------------------

def fuse_adapters(model: Any) -> int:
    """Fuse every LoRA layer into its base layer in place (mlx-lm's `fuse()`, as `mlx_lm.fuse`
    does); returns how many were fused."""
    from mlx.utils import tree_unflatten

    fused = [(name, module.fuse()) for name, module in model.named_modules() if hasattr(module, "fuse")]
    if fused:
        model.update_modules(tree_unflatten(fused))
    return len(fused)


def export_run(run_dir: Path, out: Path, *, check_count: int = 8, max_tokens: int = 128, gguf: bool = False,
               puzzles: list[Puzzle] | None = None, dtype: str | None = None,
               log: Callable[[str], None] = print) -> ExportResult:
    """Export `run_dir` as an mlx-lm model directory `out` (and with `gguf` a GGUF file in it),
    then check it against the adapter model on `check_count` puzzles (0 skips the check).
    `dtype` (default: the run's `model.dtype`) is that of the adapter model and of the exported
    weights. The result says whether every check passed; `out` is kept either way."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from ..models.specs import ModelError, resolve_model

    cfg, chosen = export_plan(run_dir, out, puzzles, check_count)
    try:
        base = resolve_model(cfg.model.spec)
    except ModelError as exc:
        raise ExportError(str(exc)) from None
    base_config = json.loads((base / "config.json").read_text())
    if gguf:
        gguf_refusal(base, base_config)
    mode = fine_tune_type(run_dir)

    # The adapter model's completions come first: fusing replaces its LoRA layers in place.
    model, tokenizer, load_seconds, reference, reference_seconds = adapter_model(run_dir, cfg, dtype, chosen,
                                                                                 max_tokens, log)
    start = time.perf_counter()
    fused = fuse_adapters(model) if mode != "full" else 0
    save_model_dir(out, base, model, tokenizer, base_config)
    result = ExportResult(out, mode, fused, load_seconds + time.perf_counter() - start,
                          reference_seconds=reference_seconds)
    log(f"wrote {out}: {cfg.model.spec} with the {mode} weights of {run_dir}"
        + (f" ({fused} LoRA layers fused)" if mode != "full" else "") + f" in {result.seconds:.1f}s")
    if gguf:
        result.gguf = out / "model.gguf"
        start = time.perf_counter()
        write_gguf(out, dict(tree_flatten(model.parameters())), base_config, result.gguf)
        result.gguf_seconds = time.perf_counter() - start
        log(f"wrote {result.gguf} ({result.gguf.stat().st_size / 1e6:.0f} MB) in {result.gguf_seconds:.1f}s")
    del model  # the checks load the export afresh, as a user would
    mx.clear_cache()

    if chosen:
        result.checks.append(check_export("mlx-lm directory", out, chosen, reference, max_tokens,
                                          cfg.sampling.batch_size))
        log(result.checks[-1].line())
        if result.gguf is not None:
            result.checks.append(check_gguf(result.gguf, chosen, reference, max_tokens, cfg.sampling.batch_size))
            log(result.checks[-1].line())
    write_record(out, run_dir, cfg, dtype or cfg.model.dtype, result)
    return result


def export_plan(run_dir: Path, out: Path, puzzles: list[Puzzle] | None, check_count: int
                ) -> tuple[Config, list[Puzzle]]:
    """The run's config and the puzzles to check an export on, or ExportError (no run, `out`
    taken, nothing to check on)."""
    cfg = run_config(run_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"--out: {out} already exists (choose a new directory)")
    chosen = spread(puzzles, check_count) if puzzles is not None else check_puzzles(cfg, check_count)
    if check_count and not chosen:
        raise ExportError("no puzzles to check the export on (pass --puzzles, or --check-puzzles 0 to skip the check)")
    return cfg, chosen


def fine_tune_type(run_dir: Path) -> str:
    """lora or full, as the run's adapter_config.json says."""
    return json.loads((run_dir / "adapter_config.json").read_text()).get("fine_tune_type", "lora")


def adapter_model(run_dir: Path, cfg: Config, dtype: str | None, chosen: list[Puzzle], max_tokens: int,
                  log: Callable[[str], None]) -> tuple[Any, Any, float, list[tuple[list[int], list[int]]], float]:
    """The run's model as training left it (the base model with the run's adapters, in `dtype`,
    default the run's), and its greedy completions of `chosen`: (model, tokenizer, seconds to
    load, completions, seconds to sample them)."""
    from ..models.specs import ModelError, load_model

    start = time.perf_counter()
    try:
        model, tokenizer = load_model(cfg.model.spec, adapter=run_dir, dtype=dtype or cfg.model.dtype, progress=False)
    except ModelError as exc:
        raise ExportError(str(exc)) from None
    load_seconds = time.perf_counter() - start
    reference, reference_seconds = [], 0.0
    if chosen:
        reference = greedy_tokens(model, tokenizer, chosen, max_tokens, cfg.sampling.batch_size)
        reference_seconds = time.perf_counter() - start - load_seconds
        log(f"adapter model: greedy completions of {len(chosen)} puzzles ({reference_seconds:.1f}s)")
    return model, tokenizer, load_seconds, reference, reference_seconds


def export_adapter(run_dir: Path, out: Path, *, adapter_dtype: str = "float16", check_count: int = 8,
                   max_tokens: int = 128, puzzles: list[Puzzle] | None = None, dtype: str | None = None,
                   log: Callable[[str], None] = print) -> ExportResult:
    """`run_dir`'s LoRA adapter alone as a new mlx-lm adapter directory `out`, small enough to
    commit or share: its arrays in `adapter_dtype` (float16 halves float32's size),
    adapter_config.json, and the run's config.yaml (the base model and how it was trained).
    Then the check: the base model with `out`'s adapter, loaded afresh as `eval --adapter` loads
    it, must give the run's greedy completions on `check_count` puzzles (the cast rounds the
    adapter, so this is what says it did not change a decision)."""
    import mlx.core as mx

    from ..models.specs import DTYPES

    if adapter_dtype not in DTYPES:
        raise ExportError(f"--adapter-dtype: {adapter_dtype!r} is not one of {', '.join(DTYPES)}")
    cfg, chosen = export_plan(run_dir, out, puzzles, check_count)
    if fine_tune_type(run_dir) != "lora":
        raise ExportError(f"--adapter-only: {run_dir} is a full fine-tune; its saved weights are the whole "
                          "model (export it without --adapter-only)")
    load_seconds, reference, reference_seconds = 0.0, [], 0.0
    if chosen:  # the run's own completions, to check the written adapter against; no check, no model
        model, _, load_seconds, reference, reference_seconds = adapter_model(run_dir, cfg, dtype, chosen, max_tokens,
                                                                             log)
        del model
        mx.clear_cache()
    start = time.perf_counter()
    write_adapter_dir(run_dir, out, adapter_dtype)
    result = ExportResult(out, "lora", 0, load_seconds + time.perf_counter() - start,
                          reference_seconds=reference_seconds, adapter_dtype=adapter_dtype)
    size = (out / "adapters.safetensors").stat().st_size / 1e6
    log(f"wrote {out}: the LoRA adapter of {run_dir} in {adapter_dtype} ({size:.1f} MB), for the base model "
        f"{cfg.model.spec} (load it with --adapter {out})")
    if chosen:
        result.checks.append(check_adapter(out, cfg, dtype, chosen, reference, max_tokens))
        log(result.checks[-1].line())
    write_record(out, run_dir, cfg, dtype or cfg.model.dtype, result)
    return result


def write_adapter_dir(run_dir: Path, out: Path, adapter_dtype: str) -> None:
    """adapters.safetensors (floating-point arrays cast to `adapter_dtype`), adapter_config.json
    and config.yaml of `run_dir`, written beside `out` and renamed into place."""
    import mlx.core as mx

    target = getattr(mx, adapter_dtype)
    weights = {k: v.astype(target) if mx.issubdtype(v.dtype, mx.floating) else v
               for k, v in mx.load(str(run_dir / "adapters.safetensors")).items()}
    with staged_directory(out) as staging:
        mx.save_safetensors(str(staging / "adapters.safetensors"), weights)
        for name in ("adapter_config.json", "config.yaml"):
            shutil.copyfile(run_dir / name, staging / name)


def check_adapter(directory: Path, cfg: Config, dtype: str | None, puzzles: list[Puzzle],
                  reference: list[tuple[list[int], list[int]]], max_tokens: int) -> CheckResult:
    """Load the base model with the exported adapter from `directory`, as `eval --adapter`
    would, and compare its greedy completions with the run's."""
    from ..models.specs import load_model

    return check_loaded("adapter directory", lambda: load_model(cfg.model.spec, adapter=directory,
                                                                dtype=dtype or cfg.model.dtype, progress=False),
                        puzzles, reference, max_tokens, cfg.sampling.batch_size)


def check_export(what: str, directory: Path, puzzles: list[Puzzle], reference: list[tuple[list[int], list[int]]],
                 max_tokens: int, batch_size: int) -> CheckResult:
    """Load the exported model from `directory` as a user would and compare its greedy
    completions with the adapter model's."""
    from ..models.specs import load_model

    return check_loaded(what, lambda: load_model(str(directory), progress=False), puzzles, reference, max_tokens,
                        batch_size)


def check_loaded(what: str, load: Callable[[], tuple[Any, Any]], puzzles: list[Puzzle],
                 reference: list[tuple[list[int], list[int]]], max_tokens: int, batch_size: int) -> CheckResult:
    """The model `load` returns (loaded afresh): its greedy completions against the adapter
    model's (`seconds`: loading and sampling)."""
    start = time.perf_counter()
    model, tokenizer = load()
    exported = greedy_tokens(model, tokenizer, puzzles, max_tokens, batch_size)
    return compare(what, puzzles, reference, exported, max_tokens, time.perf_counter() - start)


def check_gguf(path: Path, puzzles: list[Puzzle], reference: list[tuple[list[int], list[int]]], max_tokens: int,
               batch_size: int) -> CheckResult:
    """Read the GGUF file back with the project's importer (tokenizer included) and compare
    its greedy completions with the adapter model's."""
    from ..models.gguf import GGUFError, import_gguf

    with tempfile.TemporaryDirectory(prefix=".gguf-check-", dir=path.parent.parent) as tmp:
        try:
            imported = import_gguf(path, Path(tmp) / "model", progress=False)
        except GGUFError as exc:
            return CheckResult("GGUF", [p.id for p in puzzles], max_tokens,
                               differing=[{"puzzle": "all", "where": f"cannot be read back: {exc}"}])
        return check_export("GGUF", imported, puzzles, reference, max_tokens, batch_size)


def save_model_dir(out: Path, base: Path, model: Any, tokenizer: Any, config: dict[str, Any]) -> None:
    """mlx-lm's `save`: weights (sharded as mlx-lm does), config.json, tokenizer files and the
    base model's generation_config.json, written beside `out` and renamed into place."""
    from mlx_lm.utils import save

    with staged_directory(out) as staging:
        save(staging, base, model, tokenizer, dict(config), donate_model=False)


def gguf_refusal(base: Path, config: dict[str, Any]) -> None:
    """ExportError when this model cannot be written as a GGUF file, before any work."""
    from ..models.gguf import GGUFError, gguf_tokenizer_metadata

    kind = config.get("model_type")
    if kind not in GGUF_ARCHITECTURES:
        raise ExportError(f"--gguf: mlx-lm converts only {', '.join(GGUF_ARCHITECTURES)} models to GGUF, "
                          f"not model_type '{kind}'; the mlx-lm directory alone can be exported (drop --gguf)")
    if config.get("quantization"):
        raise ExportError("--gguf: mlx-lm does not convert quantized models to GGUF (the base model is quantized)")
    try:
        gguf_tokenizer_metadata(base)
    except GGUFError as exc:
        raise ExportError(f"--gguf: {exc}") from None


def write_gguf(out: Path, weights: dict[str, Any], config: dict[str, Any], path: Path) -> None:
    """mlx-lm's GGUF conversion of the fused weights, reading the tokenizer from `out`; for a
    byte-level BPE tokenizer its vocabulary metadata is then replaced by the "gpt2" form
    (mlx-lm writes every vocabulary as SentencePiece, which would tokenize such a model wrongly)."""
    import contextlib
    import io

    import mlx.core as mx
    from mlx_lm.gguf import convert_to_gguf

    from ..models.gguf import gguf_tokenizer_metadata

    with contextlib.redirect_stdout(io.StringIO()):  # it prints progress lines of its own
        convert_to_gguf(out, weights, dict(config), str(path))
    tokenizer = gguf_tokenizer_metadata(out)
    if tokenizer is not None:
        tensors, metadata = mx.load(str(path), return_metadata=True)
        metadata = {k: v for k, v in metadata.items() if not k.startswith("tokenizer.")}
        # mlx-lm always says "mostly F16"; llama.cpp's file type 0 is all F32
        f16 = any(t.dtype == mx.float16 for t in tensors.values())
        metadata["general.file_type"] = mx.array(1 if f16 else 0, dtype=mx.uint32)
        mx.save_gguf(str(path), tensors, {**metadata, **tokenizer})


def write_record(out: Path, run_dir: Path, cfg: Config, dtype: str, result: ExportResult) -> None:
    """export.json in the exported directory: the run, what it had trained on (rundir.trained_on),
    the base model and the checks."""
    from ..models import fastmath
    from ..runfiles import run_metadata, write_json_atomic
    from .rundir import trained_on

    write_json_atomic(out / EXPORT_FILE, {
        "meta": run_metadata(cfg.model.spec, run_dir, dtype, fastmath.patched()),
        "run_dir": str(run_dir.resolve()), "trained_on": trained_on(run_dir, cfg),
        "mode": result.mode, "fused_layers": result.fused_layers,
        "adapter_dtype": result.adapter_dtype,
        "seconds": result.seconds, "gguf": str(result.gguf) if result.gguf else None,
        "gguf_seconds": result.gguf_seconds, "reference_seconds": result.reference_seconds,
        "checks": [{**asdict(c), "ok": c.ok} for c in result.checks], "ok": result.ok,
    })
