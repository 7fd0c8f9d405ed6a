"""A training run's directory: its checkpoints, the resume check, and the puzzle sets the run
names. The step logs (history.jsonl, rollouts.jsonl) are read and written through `runfiles`;
the trainer keeps the step and the loop.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import yaml
from mlx.utils import tree_flatten, tree_unflatten

from .config import AlarmConfig, Config, ConfigError, load_config, to_dict
from .policy import load_trainable, save_adapters
from ..models import fastmath
from ..puzzles.format import Puzzle
from . import distributed as dist
from . import memory
from .selection import SelectionError, check_settings
from ..runfiles import HISTORY, ROLLOUTS, truncate_after_step, write_json_atomic


class TrainingError(RuntimeError):
    """A run that cannot start or continue; the message is one line for the user."""


CHECKPOINT, CHECKPOINT_NEW, CHECKPOINT_OLD = "checkpoint", "checkpoint-new", "checkpoint-old"
KEPT = "kept"  # kept/step-N/: the adapters `train.keep_every` keeps besides the latest checkpoint
ADAPTER_FILES = ("adapters.safetensors", "adapter_config.json")


def save_checkpoint(run_dir: Path, model: nn.Module, cfg: Config, optimizer: optim.Optimizer, step: int,
                    files: dict[str, Any] | None = None) -> None:
    """Write weights, optimizer state, the step counter and `files` (name -> JSON data: state
    that must match the step, like the pass rates); the swap of directories makes the
    checkpoint appear all at once (a crash leaves the previous one intact)."""
    new, current, old = run_dir / CHECKPOINT_NEW, run_dir / CHECKPOINT, run_dir / CHECKPOINT_OLD
    shutil.rmtree(new, ignore_errors=True)
    save_adapters(model, cfg.finetune, new)
    for name, data in (files or {}).items():
        write_json_atomic(new / name, data)
    # Arrays only: a scheduled learning rate is a plain float until the first update.
    state = {k: v for k, v in tree_flatten(optimizer.state) if isinstance(v, mx.array)}
    mx.save_safetensors(str(new / "optimizer.safetensors"), state)
    (new / "state.json").write_text(json.dumps({"step": step, "seed": cfg.seed,
                                                "rng": "per-step seeds derived from (seed, step)"}))
    shutil.rmtree(old, ignore_errors=True)
    if current.exists():
        current.rename(old)
    new.rename(current)
    shutil.rmtree(old, ignore_errors=True)
    # The run directory itself is an mlx-lm adapter path (`--adapter-path RUN_DIR`).
    for name in ADAPTER_FILES:
        tmp = run_dir / (name + ".tmp")
        shutil.copyfile(current / name, tmp)
        tmp.replace(run_dir / name)


def keep_adapter(run_dir: Path, step: int) -> Path:
    """Copy the latest checkpoint's adapter (and its step) to kept/step-N/, an mlx-lm adapter
    directory of its own: the checkpoint is replaced at the next save, and a soup of the last
    steps needs them all. The copy appears all at once, as the checkpoint does."""
    kept = run_dir / KEPT / f"step-{step:05d}"
    tmp = kept.with_name(kept.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in (*ADAPTER_FILES, "state.json"):
        shutil.copyfile(run_dir / CHECKPOINT / name, tmp / name)
    shutil.rmtree(kept, ignore_errors=True)
    tmp.rename(kept)
    return kept


def kept_adapters(run_dir: Path) -> list[Path]:
    """A run's kept adapters (`train.keep_every`), oldest first."""
    return sorted(p for p in (run_dir / KEPT).glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))


def last_kept_adapters(run_dir: Path, n: int) -> list[Path]:
    """The last `n` adapters a run kept (a soup's inputs); TrainingError when it kept fewer."""
    kept = kept_adapters(run_dir)
    if len(kept) < n:
        raise TrainingError(f"{run_dir} kept {len(kept)} adapter(s), not the last {n} asked for "
                            f"(train.keep_every sets how often a run keeps one)")
    return kept[-n:]


def find_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run (the previous one if a swap was interrupted)."""
    for name in (CHECKPOINT, CHECKPOINT_OLD):
        if (run_dir / name / "state.json").is_file():
            return run_dir / name
    return None


def load_checkpoint(checkpoint: Path, model: nn.Module, optimizer: optim.Optimizer) -> int:
    """Load a checkpoint's weights and optimizer state; returns the step it was saved after."""
    load_trainable(model, checkpoint)
    optimizer.init(model.trainable_parameters())
    saved = mx.load(str(checkpoint / "optimizer.safetensors"))
    optimizer.state = tree_unflatten(list({**dict(tree_flatten(optimizer.state)), **saved}.items()))
    mx.eval(model.parameters(), optimizer.state)
    return json.loads((checkpoint / "state.json").read_text())["step"]


def resume_from(run_dir: Path, checkpoint: Path | None, model: nn.Module, optimizer: optim.Optimizer,
                log: Callable[[str], None]) -> int:
    """Load the checkpoint a resumed run continues from (none: it restarts from step 0) and drop
    the step logs' records written after it; returns the step it resumes after."""
    step = load_checkpoint(checkpoint, model, optimizer) if checkpoint is not None else 0
    for name in (HISTORY, ROLLOUTS):
        truncate_after_step(run_dir / name, step)
    log(f"resuming {run_dir} after step {step}" if checkpoint is not None else
        f"no checkpoint in {run_dir} yet: restarting it from step 0")
    return step


# Keys that may change on resume: where the run lives, how many sandbox workers, how long it
# runs and how it is evaluated. Everything else shapes the weights.
RESUME_FREE = {"run_name", "output_dir", "workers", "train.steps", "train.save_every", "train.keep_every",
               "train.eval_every",
               "train.final_eval", "train.eval_tiers", "train.eval_max_tokens", "train.eval_samples", "train.eval_set",
               "train.memory_check", *(f"alarms.{f.name}" for f in dataclasses.fields(AlarmConfig))}


def check_resumable(run_dir: Path, cfg: Config) -> None:
    """The saved config must match the current one, except for the RESUME_FREE keys. The saved
    config is read like any config, so a key it lacks (written before that key existed) counts as
    its default, which keeps the behaviour it had then."""
    try:
        saved = to_dict(load_config(run_dir / "config.yaml"))
    except ConfigError as exc:
        raise TrainingError(f"--resume: {exc}") from None

    def shaping(section: str, value: Any) -> Any:
        """The part of a section that shapes the weights (None: the whole section may change)."""
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if f"{section}.{k}" not in RESUME_FREE}
        return None if section in RESUME_FREE else value

    for section, value in to_dict(cfg).items():
        if shaping(section, saved[section]) != shaping(section, value):
            raise TrainingError(f"--resume: config differs from {run_dir / 'config.yaml'} in '{section}'")


def open_run_dir(run_dir: Path, cfg: Config, resume: bool) -> Path | None:
    """Check that the run directory fits `resume`, create it and write config.yaml; returns the
    checkpoint to resume from, if any."""
    checkpoint = find_checkpoint(run_dir)
    if resume:
        if not (run_dir / "config.yaml").is_file():
            raise TrainingError(f"--resume: no run in {run_dir} (no config.yaml, no checkpoint)")
        check_resumable(run_dir, cfg)
    elif checkpoint is not None or (run_dir / HISTORY).exists():
        raise TrainingError(f"{run_dir} already holds a run: pass --resume, or choose another run_name")
    run_dir.mkdir(parents=True, exist_ok=True)
    # A comment, so the config still reads as one: the model patches the run's model gets (as
    # it is loaded, models.specs.load_model) are no setting, but they are part of what ran.
    header = f"# model patches (fast math): {fastmath.describe()}\n"
    (run_dir / "config.yaml").write_text(header + yaml.safe_dump(to_dict(cfg), sort_keys=False))
    return checkpoint


def training_puzzles(cfg: Config) -> list[Puzzle]:
    from ..puzzles.format import load_puzzles
    from ..puzzles.trainset import load_train_set

    p = cfg.puzzles
    if p.train_set is not None:
        return load_train_set(Path(p.train_set), p.tiers, p.split)
    return load_puzzles(Path(p.dir) if p.dir else None, p.tiers, p.split)


def trained_on(run_dir: Path, cfg: Config, steps: int | None = None) -> dict[str, Any] | None:
    """What the run's weights had been trained on after `steps` (default: its last recorded
    step), read from its rollouts.jsonl (`sampled`). None without rollouts, or when its training
    puzzles cannot be read any more."""
    from ..puzzles.format import PuzzleError
    from ..puzzles.trainset import TrainSetError
    from ..runfiles import read_history, read_jsonl

    if not (run_dir / ROLLOUTS).is_file():
        return None
    try:
        puzzles = {p.id: p for p in training_puzzles(cfg)}
    except (PuzzleError, TrainSetError, OSError):
        return None
    steps = len(read_history(run_dir, missing_ok=True)) if steps is None else steps
    return sampled(read_jsonl(run_dir / ROLLOUTS), puzzles, steps)


def sampled(rollouts: list[dict[str, Any]], puzzles: dict[str, Puzzle], steps: int) -> dict[str, Any]:
    """The training puzzles that rollouts.jsonl lines of steps 1 to `steps` sampled and their
    functions (entry points, looked up in `puzzles`), so an evaluation can be split into the
    functions the weights saw and the rest."""
    ids = {r["puzzle_id"] for r in rollouts if r["step"] <= steps}
    return {"steps": steps, "puzzles": sorted(ids),
            "functions": sorted({puzzles[i].entry_point for i in ids if i in puzzles})}


def eval_puzzles(cfg: Config, train: list[Puzzle]) -> list[Puzzle]:
    """The puzzles of `train.eval_set`, or the train and held-out puzzles of the evaluated
    tiers (default: the tiers trained on)."""
    from ..puzzles.format import load_puzzles
    from ..puzzles.trainset import load_train_set, source_directory

    if cfg.train.eval_set:
        chosen = {p.id: p for path in cfg.train.eval_set for p in load_train_set(Path(path))}
        return list(chosen.values())
    directory = source_directory(Path(cfg.puzzles.train_set)) if cfg.puzzles.train_set else \
        (Path(cfg.puzzles.dir) if cfg.puzzles.dir else None)
    tiers = cfg.train.eval_tiers or sorted({p.tier for p in train})
    return load_puzzles(directory, tiers, "all")


def check_before_loading(cfg: Config, puzzles: list[Puzzle], eval_set: list[Puzzle],
                         log: Callable[[str], None]) -> None:
    """Settings that cannot work, and the memory preflight (memory.py), before any weight is
    loaded or sampled from: a run that would not fit stops in seconds, with one line."""
    if cfg.train.dynamic_sampling.enabled and dist.size() > 1:
        raise TrainingError("train.dynamic_sampling.enabled: not supported in data-parallel runs (mlx.launch): "
                            "each rank would refill its groups on its own; turn it off or run one process")
    try:
        check_settings(cfg)
        if cfg.train.memory_check:
            memory.preflight(cfg, puzzles, eval_set, log)
    except (SelectionError, memory.MemoryCheckError) as exc:
        raise TrainingError(str(exc)) from None
