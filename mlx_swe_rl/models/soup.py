"""A soup of checkpoints: the elementwise mean of K adapters, written as one mlx-lm adapter.

Issue 53 chooses a run's final adapter by a rule fixed before the run, and "the average of the
last checkpoints" is the one that transferred best in mlx-rl's GRPO runs: validation on the
training distribution kept rising while transfer fell, and averaging smooths over the last
steps' noise. The soup is the mean of each stored array (LoRA's `lora_a` and `lora_b`
separately, or a full fine-tune's weights), not of the weight updates `B @ A`; for checkpoints
of one run a few steps apart the two are close. The result is a plain mlx-lm adapter
directory (`adapters.safetensors` + `adapter_config.json`), so `eval --adapter`, `export` and
`mlx_lm.generate --adapter-path` load it like a run's own. When every checkpoint comes from one
run (the same training config.yaml), that config.yaml is copied too: `export` reads the base
model and settings from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runfiles import staged_directory

WEIGHTS, CONFIG = "adapters.safetensors", "adapter_config.json"
PROVENANCE = "soup.json"  # which checkpoints went in; mlx-lm ignores it
RUN_CONFIG = "config.yaml"  # a run's training config (rl/rundir.py writes it)


class SoupError(ValueError):
    """Adapters that cannot be averaged; the message is one line for the user."""


@dataclass(frozen=True)
class Adapter:
    """One input checkpoint: its directory, adapter config, arrays and (if a trainer's
    checkpoint) the step it was saved after."""

    path: Path
    config: dict[str, Any]
    weights: dict[str, Any]  # name -> mx.array
    step: int | None


def read_adapter(path: Path) -> Adapter:
    """Read an mlx-lm adapter directory (a run, or a run's `checkpoint/`)."""
    import mlx.core as mx

    for name in (CONFIG, WEIGHTS):
        if not (path / name).is_file():
            raise SoupError(f"{path}: no {name} (expected an mlx-lm adapter directory: a run or its checkpoint/)")
    try:
        config = json.loads((path / CONFIG).read_text())
    except ValueError:
        raise SoupError(f"{path / CONFIG}: not valid JSON") from None
    state = path / "state.json"  # a trainer checkpoint says its step; a run directory does not
    step = json.loads(state.read_text()).get("step") if state.is_file() else None
    return Adapter(path, config, mx.load(str(path / WEIGHTS)), step)


def run_config_text(path: Path) -> str | None:
    """The config.yaml of the run an adapter directory belongs to (a run directory, its
    checkpoint/, or its kept/step-N/), or None."""
    path = path.resolve()
    run = {"checkpoint": path.parent}.get(path.name, path.parent.parent if path.parent.name == "kept" else path)
    return (run / RUN_CONFIG).read_text() if (run / RUN_CONFIG).is_file() else None


def check_compatible(adapters: list[Adapter]) -> None:
    """Raise SoupError unless every adapter has the first one's config, keys, shapes and dtypes."""
    first = adapters[0]
    for other in adapters[1:]:
        where = f"{other.path} does not match {first.path}"
        if other.config != first.config:
            keys = sorted(k for k in first.config.keys() | other.config.keys()
                          if first.config.get(k) != other.config.get(k))
            raise SoupError(f"{where}: adapter_config.json differs in {', '.join(keys)}")
        missing = sorted(first.weights.keys() - other.weights.keys())
        extra = sorted(other.weights.keys() - first.weights.keys())
        if missing or extra:
            name, how = (missing[0], "lacks") if missing else (extra[0], "has an extra")
            count = len(missing) + len(extra)
            raise SoupError(f"{where}: it {how} array {name}" + (f" ({count} keys differ)" if count > 1 else ""))
        for name, array in first.weights.items():
            theirs = other.weights[name]
            if theirs.shape != array.shape or theirs.dtype != array.dtype:
                raise SoupError(f"{where}: {name} is {describe(theirs)}, not {describe(array)}")


def describe(array: Any) -> str:
    """An array's shape and dtype as a user reads them: `(128, 8) float32`."""
    return f"{tuple(array.shape)} {str(array.dtype).removeprefix('mlx.core.')}"


def mean_weights(adapters: list[Adapter]) -> dict[str, Any]:
    """The elementwise mean of each array, summed in float32 (bfloat16 sums of several
    checkpoints would round), cast back to the inputs' dtype."""
    import mlx.core as mx

    mean = {}
    for name, array in adapters[0].weights.items():
        total = sum((a.weights[name].astype(mx.float32) for a in adapters[1:]), array.astype(mx.float32))
        mean[name] = (total / len(adapters)).astype(array.dtype)
    mx.eval(mean)
    return mean


def soup(paths: list[Path], out: Path) -> Path:
    """Average the adapters in `paths` into a new adapter directory `out`; returns `out`."""
    import mlx.core as mx

    if len(paths) < 2:
        raise SoupError("a soup needs at least two checkpoints (one is already its own adapter)")
    resolved = [p.resolve() for p in paths]
    if len(set(resolved)) < len(resolved):
        twice = next(p for p, r in zip(paths, resolved) if resolved.count(r) > 1)
        raise SoupError(f"{twice}: given twice (each checkpoint counts once in the mean)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SoupError(f"--out: {out} already exists (choose a new directory)")
    adapters = [read_adapter(p) for p in paths]
    check_compatible(adapters)
    weights = mean_weights(adapters)
    trained = {run_config_text(p) for p in paths}
    with staged_directory(out) as staging:  # a crash leaves no half soup
        mx.save_safetensors(str(staging / WEIGHTS), weights)
        (staging / CONFIG).write_text(json.dumps(adapters[0].config, indent=1))
        if len(trained) == 1 and None not in trained:
            (staging / RUN_CONFIG).write_text(trained.pop())
        (staging / PROVENANCE).write_text(json.dumps({
            "rule": "elementwise mean of the checkpoints' arrays",
            "checkpoints": [{"path": str(a.path), "step": a.step} for a in adapters],
            "arrays": len(weights),
        }, indent=1))
    return out
